"""The report's tables: findings, per-rank status and GPU health per node.

The tables keep the monitor's three facts about a rank apart, as ``rankguard status``
does: process liveness, training progress and GPU hardware health each get their own
column and colour. States are shown as words in tinted pills, never as colour alone.
Every value read from a file is escaped; missing values print as a dash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rankguard.report.charts import finding_style
from rankguard.report.data import RunData, parse_time
from rankguard.report.summary import fmt_clock, run_window
from rankguard.report.svgbase import esc, fmt_num
from rankguard.schema.coerce import as_list
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.status import RankRow, StatusDoc
from rankguard.schema.statusblocks import CheckpointEntry, CheckpointsBlock
from rankguard.view.statusnotes import (
    exit_note,
    iteration_cell,
    iteration_legend,
    restart_cause,
)

__all__ = ["FINDINGS_TABLE_LIMIT", "findings_table", "gpu_health_html", "rank_table"]

FINDINGS_TABLE_LIMIT = 500
RANK_TABLE_OPEN = 64
_NUM = ' class="num"'
_TONE = {
    "alive": "ok",
    "progressing": "ok",
    "completed": "ok",
    "ok": "ok",
    "starting": "info",
    "stale": "bad",
    "stalled": "bad",
    "unhealthy": "bad",
    "error": "bad",
    "warning": "warn",
    "unknown": "warn",
    "not_observed": "warn",
    "exited": "muted",
    "unavailable": "muted",
}


def _text(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, float):
        return fmt_num(value, 4)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def pill(value: Any, tone: str | None = None) -> str:
    text = _text(value)
    return f'<span class="pill {tone or _TONE.get(text, "muted")}">{esc(text)}</span>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """An HTML table; cells are already-escaped HTML, ``numeric`` columns right-aligned."""
    th = "".join(f"<th{_NUM if i in numeric else ''}>{esc(h)}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>"
        + "".join(f"<td{_NUM if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    table = f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="table-wrap">{table}</div>'


def _breakable(identifier: str) -> str:
    """Escaped ``snake_case`` text that may wrap after its underscores."""
    return "_<wbr>".join(esc(part) for part in identifier.split("_"))


def _no_findings(data: RunData) -> str:
    """What an empty findings file means for this run: a clean run, or only that the
    monitor found nothing while restarts (with their causes) or a stop happened."""
    state = data.doc.state or ""
    process = [r for r in data.restarts if r.kind != "inprocess"]
    if data.restarts:
        causes = "; ".join(restart_cause(r) for r in data.restarts[-3:])
        text = (
            f"No findings from the monitor, but the run restarted {len(data.restarts)} "
            f"time(s) ({len(process)} of the processes): {causes}. See the restarts below."
        )
    elif state == "stopped":
        text = "No findings until the launcher stopped the run (a signal): it did not complete."
    elif state == "completed":
        text = "No findings: every rank stayed alive and kept making progress."
    else:
        text = f"No findings (the run's last state: {state or 'unknown'})."
    return f'<p class="empty">{esc(text)}</p>'


def findings_table(data: RunData) -> str:
    if not data.findings:
        return _no_findings(data)
    t0, _ = run_window(data)
    rows = []
    for f in data.findings[-FINDINGS_TABLE_LIMIT:]:
        t = parse_time(f.detected_wall_time)
        ftype = f.finding_type.value
        colour, _, _ = finding_style(ftype)
        clock = fmt_clock(t)
        when = esc(clock[11:19] if clock != "-" else "-")
        if t is not None and t0 is not None:
            when += f'<span class="sub">+{t - t0:.1f} s</span>'
        rows.append(
            [
                when,
                f'<span class="nowrap"><span class="dot" style="background:{colour}"></span>'
                f"{esc(ftype)}</span>",
                esc(_text(f.rank if f.rank >= 0 else None)),
                f"<code>{_breakable(_text(f.reason.value))}</code>",
                esc(_text(f.message)),
            ]
        )
    note = ""
    if len(data.findings) > FINDINGS_TABLE_LIMIT:
        shown = f"The last {FINDINGS_TABLE_LIMIT} of {len(data.findings)} findings."
        note = f'<p class="caption">{shown}</p>'
    return _table(["Time (UTC)", "Type", "Rank", "Reason", "Message"], rows, {2}) + note


def restarts_table(data: RunData) -> str:
    """The restarts of the run: the launcher's (``process``), the ranks' own
    (``in-process``) and the lost ranks a standby took over (``live``, with the cost),
    from ``restarts.jsonl``."""
    if not data.restarts:
        return ""
    rows = []
    for r in data.restarts:
        clock = fmt_clock(parse_time(r.wall_time))
        kind = {"inprocess": "in-process", "live_recovery": "live"}.get(r.kind, "process")
        message = _text(r.message)
        if r.kind == "live_recovery":
            message += (
                f" (fault -> next step {_text(r.number('recovery_s'))} s, "
                f"{_text(r.number('steps_redone'))} step(s) redone)"
            )
        rows.append(
            [
                esc(clock[11:19] if clock != "-" else "-"),
                esc(kind),
                esc(_text(r.restart)),
                esc(_text(r.cause)),
                esc(_text(r.rank)),
                esc(message),
            ]
        )
    inproc = sum(r.kind == "inprocess" for r in data.restarts)
    live = sum(r.kind == "live_recovery" for r in data.restarts)
    n = len(data.restarts)
    caption = (
        f'<p class="caption">{n} restart{"" if n == 1 else "s"}, each with its cause: '
        f"{n - inproc - live} of the processes, {inproc} in-process"
        + (f", {live} lost rank(s) taken over by a standby" if live else "")
        + ".</p>"
    )
    header = ["Time (UTC)", "Kind", "#", "Cause", "Rank", "Message"]
    return caption + _table(header, rows, {2, 4})


def _gpu_cell(rank: RankRow) -> str:
    gpu = rank.gpu_info
    if gpu is None:
        return "-"
    token = gpu.token or gpu.ordinal
    health = rank.gpu_health_info
    status = health.verdict if health is not None else None
    return esc(_text(token)) + (" " + pill(status) if status else "")


def _exit_cell(rank: RankRow) -> str:
    ex = rank.exit_info
    if ex is None:
        return "-"
    if ex.clean:
        return "clean"
    text = f"code {_text(ex.exit_code)}"
    note = exit_note(ex)  # the launcher's stop, a restart or a peer's failure
    if note is not None:
        text += f" ({note})"
    return esc(text)


def _rank_key(rank: RankRow) -> int:
    return rank.rank if rank.rank is not None else 1 << 30


_RANK_HEADER = (
    "Rank",
    "Host:pid",
    "Liveness",
    "Progress",
    "Iteration",
    "Phase",
    "Heartbeat age (s)",
    "Progress age (s)",
    "GPU",
    "Active findings",
    "Blocked by",
    "Exit",
)


def _rank_row(r: RankRow) -> list[str]:
    phase = _text(r.phase) + (" · checkpoint" if r.checkpoint_active else "")
    seen = [p for p in r.phases_seen if p != r.phase]
    if seen:
        phase += f" (also {', '.join(seen)})"
    return [
        esc(_text(r.rank)),
        f'<span class="nowrap">{esc(_text(r.hostname))}:{esc(_text(r.pid))}</span>',
        pill(r.process_liveness),
        pill(r.gpu_progress),
        esc(iteration_cell(r)),
        esc(phase),
        esc(_text(r.heartbeat_age_s)),
        esc(_text(r.progress_age_s)),
        _gpu_cell(r),
        "".join(pill(a, "bad") for a in r.active_findings) or "-",
        esc(_text(r.blocked_by)),
        _exit_cell(r),
    ]


def rank_table(data: RunData) -> str:
    """Every rank's row; past ``RANK_TABLE_OPEN`` ranks, the ones with active findings
    first and the full table folded away."""
    ranks = StatusDoc.from_dict(data.status or {}).ranks
    if not ranks:
        return '<p class="empty">No per-rank status: status.json is missing or has no ranks.</p>'
    ranks.sort(key=_rank_key)
    numeric = {0, 4, 6, 7}
    table = _table(_RANK_HEADER, [_rank_row(r) for r in ranks], numeric)
    legend = iteration_legend(ranks)
    if legend:
        table += f'<p class="caption">{esc(legend)}</p>'
    if len(ranks) <= RANK_TABLE_OPEN:
        return table
    flagged = [r for r in ranks if r.active_findings or r.process_liveness == "stale"]
    head = ""
    if flagged:
        head = f'<p class="caption">Ranks with active findings ({len(flagged)}):</p>'
        head += _table(_RANK_HEADER, [_rank_row(r) for r in flagged[:RANK_TABLE_OPEN]], numeric)
    return head + f"<details><summary>All {len(ranks)} ranks</summary>{table}</details>"


def _mib_to_gib(value: Any) -> str:
    return fmt_num(value / 1024, 3) if isinstance(value, (int, float)) else "-"


def _node_html(node: int, snap: JsonObject) -> str:
    head = (
        f'<h3>Node {node} <span class="muted">{esc(_text(snap.get("hostname")))}</span> '
        f"{pill(snap.get('status'))}</h3>"
        f'<p class="caption">Source {esc(_text(snap.get("source")))}, collected '
        f"{esc(fmt_clock(parse_time(snap.get('collected_wall_time'))))}.</p>"
    )
    if snap.get("error"):
        head += f'<p class="caption bad-text">{esc(snap["error"])}</p>'
    gpus = [g for g in as_list(snap.get("gpus")) if isinstance(g, dict)]
    if not gpus:
        return head + '<p class="empty">No GPUs in this snapshot.</p>'
    rows = []
    for g in gpus:
        mem = f"{_mib_to_gib(g.get('memory_used_mib'))} / {_mib_to_gib(g.get('memory_total_mib'))}"
        ecc = (
            f"{_text(g.get('ecc_corrected_volatile'))} / {_text(g.get('ecc_uncorrected_volatile'))}"
        )
        rows.append(
            [
                esc(_text(g.get("index"))),
                f'<span class="nowrap">{esc(_text(g.get("name")))}</span>',
                pill(g.get("health")),
                esc(_text(g.get("temperature_c"))),
                esc(_text(g.get("utilization_gpu_pct"))),
                esc(mem),
                esc(_text(g.get("power_draw_w"))),
                esc(ecc),
                esc(_text(g.get("problems"))),
            ]
        )
    header = [
        "GPU",
        "Name",
        "Health",
        "Temp °C",
        "Util %",
        "Memory GiB used / total",
        "Power W",
        "ECC corrected / uncorrected",
        "Problems",
    ]
    return head + _table(header, rows, {0, 3, 4, 5, 6, 7})


def gpu_health_html(data: RunData) -> str:
    if data.gpu_health:
        return "".join(_node_html(n, snap) for n, snap in sorted(data.gpu_health.items()))
    summary = StatusDoc.from_dict(data.status or {}).gpu_health
    if summary:
        rows = [
            [
                esc(n),
                pill(h.status),
                esc(_text(h.source)),
                esc(_text(h.hostname)),
                esc(_text(h.age_s)),
                esc(_text(h.gpus)),
            ]
            for n, h in sorted(summary.items())
        ]
        return _table(["Node", "Status", "Source", "Host", "Age (s)", "GPUs"], rows, {4, 5})
    return (
        '<p class="empty">No GPU health snapshots: the hardware health check was off '
        "or the run had no GPU.</p>"
    )


def checkpoint_table(data: RunData) -> str:
    """Last committed checkpoint per tier with stage/write durations, from the copy of
    ``checkpoints.json`` in ``status.json``; empty when the job used no CheckpointManager."""
    ckpt = StatusDoc.from_dict(data.status or {}).block(CheckpointsBlock)
    if ckpt is None:
        return ""
    rows = []
    for tier, step in sorted(ckpt.last_committed.items()):
        info = ckpt.last.get(tier) or CheckpointEntry()
        rows.append(
            [
                esc(_text(tier)),
                esc(_text(step)),
                esc(_text(info.stage_s)),
                esc(_text(info.write_s)),
                esc(_text(info.time)),
            ]
        )
    notes = []
    if ckpt.inflight is not None:
        notes.append(f"write in flight: step {_text(ckpt.inflight.step)}")
    if ckpt.failures:
        notes.append(f"failed saves: {_text(ckpt.failures)} ({_text(ckpt.last_error)})")
    if ckpt.loaded is not None:
        notes.append(f"resumed from step {_text(ckpt.loaded.step)} ({_text(ckpt.loaded.tier)})")
    note = f'<p class="caption">{esc("; ".join(notes))}</p>' if notes else ""
    header = ("tier", "last committed step", "stage s", "write s", "committed at")
    return "<h3>Checkpoints</h3>" + note + _table(header, rows, {1, 2, 3})
