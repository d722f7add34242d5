"""One self-contained HTML page: an overview table, then per schema its plots, policy and rejected drafts.

Nothing is fetched when the page is viewed: plotly's JavaScript is inlined once, the styles are
inline and use the system's fonts.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass, field
from typing import Sequence

from plotly.offline import get_plotlyjs

from structspec.front.views import RejectedDraft, SchemaStats, StatsWindow
from structspec.report.figures import schema_figures

PLOTS_PER_SCHEMA = 5
_CONFIG = {"displaylogo": False}
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.on { color: #1a7f37; font-weight: 600; } .off { color: #c62828; font-weight: 600; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, 650px); gap: 12px; }
.plot { border: 1px solid #eee; min-height: 340px; width: 650px; overflow: hidden; }
code { background: #f6f6f6; white-space: pre-wrap; word-break: break-all; }
mark.rejected { background: #ffd6d6; } mark.target { background: #d6f5d6; }
.note { color: #666; font-size: 0.9em; }
"""


@dataclass(frozen=True)
class ReportInput:
    stats: Sequence[SchemaStats]
    window_seconds: int
    rejected: dict[tuple[str, str], list[RejectedDraft]] = field(default_factory=dict)  # (model, key) -> samples
    rejected_note: str = ""  # why samples are missing, when they are
    threshold: float | None = None  # when no policy change says which was in force
    source: str = ""  # where the statistics came from
    generated_at: float = 0.0


def _e(value: object) -> str:
    return html.escape(str(value))


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _threshold(entry: SchemaStats, fallback: float | None) -> float | None:
    seen = [c.threshold for c in entry.policy_changes if c.threshold is not None]
    seen += [p.threshold for p in entry.policy if p.threshold is not None]
    return seen[-1] if seen else fallback


def _anchor(entry: SchemaStats) -> str:
    return "s-" + "".join(ch if ch.isalnum() else "-" for ch in f"{entry.model}-{entry.schema_key}")


def _acceptance(window: StatsWindow) -> dict[str, float]:
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for p in window.proposers:
        drafted[p.proposer] = drafted.get(p.proposer, 0) + p.drafted
        accepted[p.proposer] = accepted.get(p.proposer, 0) + p.accepted
    return {k: accepted[k] / v for k, v in drafted.items() if v}


def _overview(entries: Sequence[SchemaStats], window_seconds: int) -> str:
    rows = []
    for e in entries:
        w = e.windows.get(window_seconds) or StatsWindow(window_seconds)
        acc = ", ".join(f"{k} {v:.2f}" for k, v in sorted(_acceptance(w).items())) or "-"
        states = ", ".join(f'{p.proposer} <span class="{p.state}">{p.state}</span>' for p in e.policy) or "-"
        speedup = f"{w.estimated_speedup:.2f}x" if w.estimated_speedup else "-"
        rows.append(
            f'<tr><td><a href="#{_anchor(e)}">{_e(e.schema_key)}</a></td><td>{_e(e.model)}</td>'
            f'<td class="num">{w.requests}</td><td class="num">{w.output_tokens_p50:.0f}</td>'
            f'<td class="num">{w.tokens_per_pass:.2f}</td><td class="num">{speedup}</td><td>{_e(acc)}</td>'
            f"<td>{states}</td><td class=\"num\">{_pct(w.finish_share('length'))}</td>"
            f"<td class=\"num\">{_pct(w.finish_share('cancelled'))}</td>"
            f"<td class=\"num\">{_pct(w.finish_share('error'))}</td></tr>")
    head = ("<tr><th>schema</th><th>model</th><th>requests</th><th>output tokens p50</th><th>tokens / pass</th>"
            "<th>est. speedup</th><th>acceptance</th><th>policy</th><th>truncated</th><th>cancelled</th>"
            "<th>failed</th></tr>")
    return f'<table class="overview">{head}{"".join(rows)}</table>'


def _policy_table(entry: SchemaStats) -> str:
    if not entry.policy:
        return '<p class="note">The drafting policy has not decided for this schema (or it runs a fixed configuration).</p>'
    rows = []
    for p in entry.policy:
        read = f"{p.acceptance:.2f}" if p.acceptance is not None else "no evidence"
        if p.threshold is not None:
            read += f" (threshold {p.threshold:.2f})"
        rows.append(f'<tr><td>{_e(p.proposer)}</td><td class="{p.state}">{p.state}</td><td>{_e(p.reason)}</td>'
                    f"<td>{_when(p.since)}</td><td>{_when(p.last_switch_off)}</td><td>{_when(p.last_switch_on)}</td>"
                    f"<td>{_e(read)} at batch \u2264{p.batch_bucket}</td></tr>")
    return ("<table><tr><th>proposer</th><th>state</th><th>why</th><th>since</th><th>last switched off</th>"
            f"<th>last switched on</th><th>acceptance the policy read</th></tr>{''.join(rows)}</table>")


def _ms(seconds: float | None, digits: int = 1) -> str:
    return f"{1000 * seconds:.{digits}f}" if seconds is not None else "-"


def _pricing_tables(entry: SchemaStats) -> str:
    """Per proposer: the evidence and the acceptance it is priced at, then each draft length's price."""
    if not entry.pricing:
        return '<p class="note">No proposer priced: the policy has not decided for this schema and none drafted.</p>'
    out = []
    for p in entry.pricing:
        first = p.priced_acceptance
        if p.cold:
            evidence = f"cold: {p.evidence_tokens:.0f} of {p.min_evidence_tokens} drafted tokens, priced at the prior"
            if p.replayed_tokens > 0 and p.replayed_acceptance is not None:
                evidence += f" and {p.replayed_tokens:.0f} replayed tokens at {p.replayed_acceptance:.2f}"
        else:
            read = f", acceptance {p.acceptance:.2f}" if p.acceptance is not None else ""
            evidence = f"{p.evidence_tokens:.0f} drafted tokens read{read}"
        priced = f"; acceptance at a draft's first position {first:.2f}" if first is not None else ""
        chosen = f"chose k={p.chosen}" if p.chosen else f"no draft length beats the plain step by {100 * p.gain_margin:.0f}%"
        if p.restricted_chosen:
            chosen += f"; where every scored position allows few tokens (no output layer), k={p.restricted_chosen}"
        plain = p.plain.step_seconds if p.plain is not None else None
        rows = []
        for d in p.prices:
            ratio = f"{d.step_seconds / plain:.2f}" if d.step_seconds is not None and plain else "-"
            mark = ' class="on"' if d.k == p.chosen and d.k else ""
            rows.append(f"<tr><td{mark}>{d.k}</td><td class=\"num\">{_ms(d.step_seconds)}</td>"
                        f"<td class=\"num\">{ratio}</td><td class=\"num\">{_ms(d.propose_seconds, 2)}</td>"
                        f"<td class=\"num\">{d.expected_accepted:.2f}</td>"
                        f"<td class=\"num\">{_ms(d.seconds_per_token)}</td><td>{_e(d.step_source or '-')}</td></tr>")
        decided = f" (the policy's latest: {p.reason})" if p.reason else ""
        out.append(f"<p>{_e(p.proposer)} at batch \u2264{p.batch_bucket}{_e(decided)}: {_e(evidence + priced)}; "
                   f"{_e(chosen)}.</p>"
                   "<table><tr><th>k</th><th>step ms</th><th>step / plain</th><th>drafting ms</th><th>E[accepted]</th>"
                   f"<th>ms / token</th><th>step from</th></tr>{''.join(rows)}</table>")
    return "".join(out)


def _rejected_table(samples: list[RejectedDraft]) -> str:
    rows = []
    for r in samples:
        rows.append(
            f"<tr><td>{_when(r.created_at)}</td><td>{_e(r.proposer)}</td><td class=\"num\">{r.position}</td>"
            f"<td><code>{_e(r.context_text[-80:])}</code></td><td><code>{_e(r.draft_text)}</code></td>"
            f'<td><code><mark class="rejected">{_e(r.rejected_text)}</mark></code>'
            f'{"" if r.grammatical else " (grammar)"}</td>'
            f'<td><code><mark class="target">{_e(r.target_text)}</mark></code></td></tr>')
    return ("<table><tr><th>when</th><th>proposer</th><th>position</th><th>context (last tokens)</th>"
            "<th>drafted</th><th>refused</th><th>target chose</th></tr>" + "".join(rows) + "</table>")


def render(report: ReportInput) -> str:
    """The page's HTML text."""
    w = report.window_seconds
    sections = []
    for entry in report.stats:
        window = entry.windows.get(w) or StatsWindow(w)
        names = sorted(window.names)
        plots = []
        for name, fig in schema_figures(entry, w, _threshold(entry, report.threshold)):
            plots.append('<div class="plot">' + fig.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG,
                                                              default_height="340px", default_width="640px",
                                                              div_id=f"{_anchor(entry)}-{name}") + "</div>")
        samples = report.rejected.get((entry.model, entry.schema_key), [])
        rejected = (_rejected_table(samples) if samples else
                    f'<p class="note">{_e(report.rejected_note or "No rejected draft sampled in the window.")}</p>')
        sections.append(
            f'<section class="schema" id="{_anchor(entry)}"><h2>{_e(entry.schema_key)}'
            f'{" (" + _e(", ".join(names)) + ")" if names else ""} on {_e(entry.model)}</h2>'
            f'<div class="plots">{"".join(plots)}</div><h3>Drafting policy</h3>{_policy_table(entry)}'
            f"<h3>Draft pricing (the cost model, per proposer)</h3>{_pricing_tables(entry)}"
            f"<h3>Rejected drafts (newest first)</h3>{rejected}</section>")
    body = "".join(sections) or '<p class="note">No statistics recorded in the window.</p>'
    days = w / 86400
    span = f"{days:g} d" if w % 86400 == 0 else f"{w / 3600:g} h"
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>structspec: speculation per schema"
        f"</title><style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
        f"<h1>Speculation per schema, last {span}</h1>"
        f'<p class="note">Source: {_e(report.source)}; generated {_when(report.generated_at)}. Counters are hourly: '
        "the window covers every hour it reaches into. Acceptance over time is per examined drafted token (the "
        "measure the policy's threshold applies to); elsewhere accepted / drafted. The estimated speedup is over "
        "the same requests decoded without drafts.</p>"
        f"{_overview(report.stats, w)}{body}</body></html>")
