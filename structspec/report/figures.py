"""The report's plots of one schema, as plotly figures, from the statistics views (``structspec.front.views``).

Plotly, because a schema owner reads these interactively: hovering gives the exact acceptance
of an hour and the reason of a switch, a range can be zoomed and a proposer hidden. Its
JavaScript is inlined once per page (``page``), so the file works offline.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from structspec.front.views import HourStats, PolicyChange, SchemaStats, StatsWindow

HEIGHT = 340
WIDTH = 640  # fixed: a grid cell's width is not known when plotly first draws
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
_OFF, _ON = "#d62728", "#2ca02c"


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _layout(fig: go.Figure, title: str, **extra: Any) -> go.Figure:
    layout: dict[str, Any] = dict(title=title, height=HEIGHT, width=WIDTH, margin=dict(l=60, r=20, t=60, b=50),
                                  template="plotly_white", legend=dict(orientation="h", y=-0.2))
    layout.update(extra)
    fig.update_layout(**layout)
    return fig


def _empty(fig: go.Figure, what: str) -> go.Figure:
    fig.add_annotation(text=what, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14))
    return fig


def _proposers(entry: SchemaStats) -> list[str]:
    names = {p.proposer for h in entry.timeline for p in h.proposers}
    names |= {p.proposer for w in entry.windows.values() for p in w.proposers}
    return sorted(names | {c.proposer for c in entry.policy_changes})


def acceptance_over_time(entry: SchemaStats, threshold: float | None) -> go.Figure:
    """Per proposer, each hour's acceptance (accepted per examined drafted token, the policy's measure), the
    threshold, and the moments the policy switched the proposer off and on."""
    fig = go.Figure()
    names = _proposers(entry)
    for i, name in enumerate(names):
        xs, ys, hover = [], [], []
        for h in entry.timeline:
            p = next((p for p in h.proposers if p.proposer == name), None)
            if p is None or p.acceptance is None:
                continue
            xs.append(_when(h.hour_start + 1800))
            ys.append(p.acceptance)
            hover.append(f"{p.accepted_examined}/{p.examined} examined, {p.accepted}/{p.drafted} drafted")
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, text=hover,
                                     line=dict(color=_COLORS[i % len(_COLORS)])))
    switches = [c for c in entry.policy_changes if c.is_switch]
    for state, color, symbol in (("off", _OFF, "triangle-down"), ("on", _ON, "triangle-up")):
        these = [c for c in switches if c.state == state]
        if these:
            fig.add_trace(go.Scatter(
                x=[_when(c.at) for c in these], y=[_switch_y(c, threshold) for c in these], mode="markers",
                name=f"switched {state}", marker=dict(color=color, symbol=symbol, size=12),
                text=[f"{c.proposer}: {c.reason}" + (f" (acceptance {c.acceptance:.2f})" if c.acceptance is not None
                                                       else "") for c in these]))
        for c in these:
            fig.add_shape(type="line", x0=_when(c.at), x1=_when(c.at), y0=0, y1=1, yref="paper",
                          line=dict(color=color, width=1, dash="dot"))
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color="#555", dash="dash"), annotation_text=f"threshold {threshold:.2f}",
                      annotation_position="bottom right")
    if not fig.data:
        _empty(fig, "no drafts in the window")
    return _layout(fig, "Acceptance over time (per examined drafted token)", yaxis=dict(range=[0, 1.05]),
                   xaxis=dict(type="date"))


def _switch_y(c: PolicyChange, threshold: float | None) -> float:
    if c.acceptance is not None:
        return c.acceptance
    return threshold if threshold is not None else 0.5


def acceptance_by_bucket(window: StatsWindow) -> go.Figure:
    fig = go.Figure()
    names = sorted({p.proposer for p in window.proposers})
    for i, name in enumerate(names):
        rows = sorted((p for p in window.proposers if p.proposer == name), key=lambda p: p.batch_bucket)
        fig.add_trace(go.Bar(x=[f"batch \u2264{p.batch_bucket}" for p in rows], y=[p.acceptance_rate for p in rows],
                             name=name, text=[f"{p.accepted}/{p.drafted}" for p in rows],
                             marker_color=_COLORS[i % len(_COLORS)]))
    if not fig.data:
        _empty(fig, "no drafts in the window")
    return _layout(fig, "Acceptance by running-batch bucket (accepted / drafted)", barmode="group",
                   yaxis=dict(range=[0, 1.05]))


def acceptance_by_position(window: StatsWindow) -> go.Figure:
    fig = go.Figure()
    names = sorted({p.proposer for p in window.proposers})
    for i, name in enumerate(names):
        reached: list[int] = []
        accepted: list[int] = []
        for p in window.proposers:
            if p.proposer != name:
                continue
            for j, (r, a) in enumerate(zip(p.reached, p.accepted_at)):
                if j >= len(reached):
                    reached.append(0)
                    accepted.append(0)
                reached[j] += r
                accepted[j] += a
        xs = [j + 1 for j, r in enumerate(reached) if r]
        fig.add_trace(go.Scatter(x=xs, y=[accepted[j - 1] / reached[j - 1] for j in xs], mode="lines+markers",
                                 name=name, text=[f"{accepted[j - 1]}/{reached[j - 1]}" for j in xs],
                                 line=dict(color=_COLORS[i % len(_COLORS)])))
    if not fig.data:
        _empty(fig, "no drafts in the window")
    return _layout(fig, "Acceptance by draft position (given the earlier ones accepted)",
                   xaxis=dict(title="draft position", dtick=1), yaxis=dict(range=[0, 1.05]))


def output_lengths(window: StatsWindow) -> go.Figure:
    fig = go.Figure()
    buckets = window.output_length
    if any(b.count for b in buckets):
        lower = 0.0
        labels = []
        for b in buckets:
            labels.append(f">{lower:g}" if math.isinf(b.upper_bound) else f"{lower:g}-{b.upper_bound:g}")
            lower = b.upper_bound
        fig.add_trace(go.Bar(x=labels, y=[b.count for b in buckets], name="requests", marker_color=_COLORS[0]))
    else:
        _empty(fig, "no complete outputs in the window")
    return _layout(fig, "Output length (tokens, requests that ended by stop or length)",
                   xaxis=dict(title="output tokens"), yaxis=dict(title="requests"))


def latency_and_passes(timeline: list[HourStats]) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("latency (ms)", "target passes per output token"))
    rows = [h for h in timeline if h.requests]
    xs = [_when(h.hour_start + 1800) for h in rows]
    if rows:
        fig.add_trace(go.Scatter(x=xs, y=[h.latency_ms_p50 for h in rows], name="p50", mode="lines+markers",
                                 line=dict(color=_COLORS[0])), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[h.latency_ms_p99 for h in rows], name="p99", mode="lines+markers",
                                 line=dict(color=_COLORS[1])), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[h.passes_per_token for h in rows], name="passes / token",
                                 mode="lines+markers", line=dict(color=_COLORS[2])), row=2, col=1)
    else:
        _empty(fig, "no requests in the window")
    return _layout(fig, "Latency p50 / p99 and passes per token over time", height=HEIGHT + 120)


def schema_figures(entry: SchemaStats, window_seconds: int, threshold: float | None) -> list[tuple[str, go.Figure]]:
    """The five plots of a schema's section, named."""
    window = entry.windows.get(window_seconds) or StatsWindow(window_seconds)
    return [("acceptance-over-time", acceptance_over_time(entry, threshold)),
            ("acceptance-by-bucket", acceptance_by_bucket(window)),
            ("acceptance-by-position", acceptance_by_position(window)),
            ("output-length", output_lengths(window)),
            ("latency-and-passes", latency_and_passes(entry.timeline))]
