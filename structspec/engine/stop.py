"""Stop strings of a free-text answer: where the text ends, and what of it a stream may show yet.

A *stop string* ends a text answer at its first occurrence; the answer is the text before it (the stop string and
anything after are never returned nor streamed). The engine core looks for one in a sequence's output after each
step (several tokens may be committed per step under speculation), the engine cuts the final text there
(``cut_at_stop``), and a stream holds back the end of its text that could still become a stop string
(``StopFilter``).
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` before its first stop string, and whether one was found. Raises: Never."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


class StopFilter:
    """The part of a growing text a stream may show: never a stop string nor what follows it, and not yet the end
    that could be the start of one. Feed each delta; ``finish(final)`` gives what is left of the final text."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # everything fed
        self.shown = 0  # characters of ``text`` handed out
        self.stopped = False

    def feed(self, delta: str) -> str:
        """What may be shown now of ``delta`` (and of text held back before it)."""
        if self.stopped:
            return ""
        self.text += delta
        cut, found = cut_at_stop(self.text, self.stops)
        if found:
            self.stopped = True
            return self._show(len(cut))
        return self._show(len(self.text) - self._held(self.text))

    def finish(self, final: str) -> str:
        """The rest of ``final`` (the whole answer, already cut at its stop string) not shown yet."""
        rest = final[self.shown:] if final.startswith(self.text[: self.shown]) else ""
        self.shown = len(final)
        return rest

    def _held(self, text: str) -> int:
        """The length of the longest end of ``text`` that is a proper start of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _show(self, upto: int) -> str:
        out = self.text[self.shown: upto] if upto > self.shown else ""
        self.shown = max(self.shown, upto)
        return out
