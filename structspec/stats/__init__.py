"""Speculation statistics as hourly counters (``counters``), kept in memory by the ``StatsBook``.

A leaf package (standard library only): the engine and the speculation policy record and
read it, the store persists it, the service and the CLI summarise it.
"""
