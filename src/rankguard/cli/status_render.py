"""Text rendering of a run's status for ``rankguard status``: the header, the rank
table, GPU health, findings, restarts, stragglers and the timeouts in force. Pure
functions of a :class:`~rankguard.schema.status.StatusDoc` and findings (tolerant of
missing keys and of values of the wrong type)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from rankguard.goodput.ledger import ettr_text
from rankguard.schema.coerce import as_finite
from rankguard.schema.findings import Finding, FindingType
from rankguard.schema.jsontypes import JsonObject
from rankguard.schema.restarts import LiveBlock, RestartEntry, RestartsBlock
from rankguard.schema.status import (
    FINAL_STATES,
    RankExit,
    RankGpu,
    RankGpuHealth,
    RankRow,
    StatusDoc,
    parse_findings,
)
from rankguard.schema.statusblocks import (
    CheckpointsBlock,
    ElasticBlock,
    GoodputBlock,
    PreemptBudget,
    PreemptionBlock,
    StopRequestedBlock,
    StragglersBlock,
    TimeoutsBlock,
    stop_words,
)
from rankguard.util.textsafe import safe_text
from rankguard.view.statusnotes import (
    exit_note,
    frozen_status,
    iteration_cell,
    iteration_legend,
    restarts_summary,
)

__all__ = ["render_status"]

_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_BOLD = "\x1b[1m"
_RESET = "\x1b[0m"
_STYLES = {"red": _RED, "yellow": _YELLOW, "bold": _BOLD}
_ANSI_RE = re.compile(r"(\x1b\[[0-9;]*m)")

_FINDING_ABBREV = {t.value: t.info.short for t in FindingType}
_WARNING_FINDINGS = frozenset(t.value for t in FindingType if t.info.severity == "warning")

_LIVENESS_STYLE = {"stale": "red", "not_observed": "yellow"}
_PROGRESS_STYLE = {"stalled": "red", "unknown": "yellow", "not_observed": "yellow"}
_STATE_STYLE = {"failed": "red", "degraded": "yellow"}
_HEALTH_STYLE = {
    "unhealthy": "red",
    "failure": "red",
    "failed": "red",
    "critical": "red",
    "error": "red",
    "warning": "yellow",
    "degraded": "yellow",
    "stale": "yellow",
    "unknown": "yellow",
}

Row = list[tuple[str, str]]  # cells of (text, style); style "" means plain


# --------------------------------------------------------------------------- rendering


def _safe(value: Any, depth: int = 0) -> Any:
    """``value`` with every string in it (keys too) made safe for a terminal; nesting past
    what a status file has is shown as ``...``. The rendering below then only adds its
    own colour codes."""
    if isinstance(value, str):
        return safe_text(value)
    if depth > 16:
        return "..."
    if isinstance(value, dict):
        return {safe_text(k): _safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v, depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return safe_text(value)


def _text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def _seconds(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.1f}"
    return _text(value)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.tzinfo is not None:
            parsed.astimezone(timezone.utc)  # out of range near year 1 or 9999
    except (ValueError, OverflowError):
        return None
    return parsed


def _fmt_time(value: Any) -> str:
    """A wall time for the screen; ``-`` for anything that is not a valid ISO time (an
    impossible date, a number, garbage)."""
    parsed = _parse_time(value)
    if parsed is None:
        return "-"
    if parsed.tzinfo is None:
        return parsed.strftime("%Y-%m-%d %H:%M:%S")
    return parsed.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _sort_key(value: Any) -> tuple[int, float, str]:
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _paint(text: str, style: str, color: bool) -> str:
    if not color or not style:
        return text
    return f"{_STYLES[style]}{text}{_RESET}"


def _visible_len(text: str) -> int:
    return len(_ANSI_RE.sub("", text))


def _clip(line: str, width: int | None) -> str:
    """Cut ``line`` to ``width`` visible characters, keeping ANSI codes intact."""
    if width is None or width <= 0 or _visible_len(line) <= width:
        return line
    out: list[str] = []
    left = width
    styled = False
    for part in _ANSI_RE.split(line):
        if _ANSI_RE.fullmatch(part):
            out.append(part)
            styled = True
        elif left > 0:
            out.append(part[:left])
            left -= len(part[:left])
    if styled:
        out.append(_RESET)
        return "".join(out)
    return "".join(out).rstrip()


def _table(header: Sequence[str], rows: Sequence[Row], right: set[int], color: bool) -> list[str]:
    widths = [len(h) for h in header]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    last = len(header) - 1

    def fmt(cells: Row) -> str:
        out = []
        for i, (text, style) in enumerate(cells):
            padded = text.rjust(widths[i]) if i in right else text.ljust(widths[i])
            if i == last and i not in right:
                padded = text
            out.append(_paint(padded, style, color))
        return "  ".join(out).rstrip()

    lines = [fmt([(h, "bold") for h in header])]
    lines.extend(fmt(row) for row in rows)
    return lines


def _liveness_cell(rank: RankRow) -> tuple[str, str]:
    if rank.exit is not None or rank.process_liveness == "exited":
        ex = rank.exit_info or RankExit()
        note = exit_note(ex)
        if note is not None:
            return f"exited ({note})", ""
        if ex.clean is False:
            return "exited (err)", "red"
        return "exited", ""
    text = _text(rank.process_liveness)
    return text, _LIVENESS_STYLE.get(text, "")


def _health_status(health: RankGpuHealth | None) -> str:
    return _text(health.verdict if health is not None else None)


def _gpu_token(gpu: RankGpu | None) -> str:
    if gpu is None:
        return "-"
    for value in (gpu.token, gpu.uuid, gpu.ordinal):
        if value is not None:
            return _text(value)
    return "-"


def _findings_cell(active: list[str]) -> tuple[str, str]:
    if not active:
        return "-", ""
    style = "yellow" if all(n in _WARNING_FINDINGS for n in active) else "red"
    return ",".join(_FINDING_ABBREV.get(n, n) for n in active), style


def _phase_cell(rank: RankRow) -> str:
    phase = _text(rank.phase)
    if rank.checkpoint_active and phase != "checkpointing":
        return f"{phase} (ckpt)"
    return phase


def _progress_cell(rank: RankRow) -> tuple[str, str]:
    """``stalled``, or ``blocked:0`` for a rank waiting on another (a peer that is
    saving or evaluating, or the culprit of a hang): not hung itself."""
    progress = _text(rank.gpu_progress)
    blocked = rank.blocked_by
    if progress == "stalled" and blocked:
        shown = ",".join(_text(r) for r in blocked[:4]) + (",..." if len(blocked) > 4 else "")
        return f"blocked:{shown}", "yellow"
    return progress, _PROGRESS_STYLE.get(progress, "")


def _rank_row(rank: RankRow) -> Row:
    health = _health_status(rank.gpu_health_info)
    return [
        (_text(rank.rank), ""),
        (_text(rank.node_rank), ""),
        (_text(rank.hostname), ""),
        (_text(rank.pid), ""),
        _liveness_cell(rank),
        _progress_cell(rank),
        (iteration_cell(rank), ""),
        (_phase_cell(rank), ""),
        (_seconds(rank.heartbeat_age_s), ""),
        (_seconds(rank.progress_age_s), ""),
        (_gpu_token(rank.gpu_info), ""),
        (health, _HEALTH_STYLE.get(health.lower(), "")),
        _findings_cell(rank.active_findings),
    ]


_RANK_HEADER = (
    "RANK",
    "NODE",
    "HOST",
    "PID",
    "LIVENESS",
    "PROGRESS",
    "ITER",
    "PHASE",
    "HB AGE",
    "PROG AGE",
    "GPU",
    "GPU HEALTH",
    "FINDINGS",
)
_RANK_RIGHT = {0, 1, 3, 6, 8, 9}


def _counts(given: dict[str, int], ranks: list[RankRow], key: str) -> dict[str, int]:
    if given:
        return {k: v for k, v in given.items() if v}
    values = (getattr(r, key) for r in ranks)
    return dict(Counter(str(v) for v in values if v is not None))


def _fmt_counts(counts: dict[str, int], styles: dict[str, str], color: bool) -> str:
    if not counts:
        return "-"
    return " ".join(_paint(f"{k}={n}", styles.get(k, ""), color) for k, n in counts.items())


def _status_age(doc: StatusDoc, now: Any) -> float | None:
    """Seconds since the monitor wrote the status (None: not known)."""
    parsed = _parse_time(doc.updated_wall_time)
    if not isinstance(now, datetime) or parsed is None or parsed.tzinfo is None:
        return None
    return max(0.0, (now - parsed).total_seconds())


def _aged(ranks: list[RankRow], age: float | None) -> list[RankRow]:
    """The rows of a status nobody updates any more (its launcher ended or is gone)
    with their heartbeat and progress ages as of now, not as of the last scan: a
    heartbeat 0.0 s old in a status written an hour ago is an hour old."""
    if not age:
        return ranks
    return [
        replace(
            r,
            heartbeat_age_s=None if r.heartbeat_age_s is None else r.heartbeat_age_s + age,
            progress_age_s=None if r.progress_age_s is None else r.progress_age_s + age,
        )
        for r in ranks
    ]


def _header(doc: StatusDoc, ranks: list[RankRow], color: bool, now: Any) -> list[str]:
    summary, monitor = doc.summary, doc.monitor
    state = _text(doc.state)
    expected = summary.ranks_expected
    if expected is None:
        expected = monitor.expected_world_size
    observed = summary.ranks_observed
    if observed is None and ranks:
        observed = sum(1 for r in ranks if r.process_liveness not in (None, "not_observed"))
    updated = _fmt_time(doc.updated_wall_time)
    parsed = _parse_time(doc.updated_wall_time)
    if isinstance(now, datetime) and parsed is not None and parsed.tzinfo is not None:
        updated += f" ({max(0.0, (now - parsed).total_seconds()):.1f}s ago)"
    active = summary.findings_active
    findings = _text(summary.findings_total) + (
        f" ({_text(active)} active)" if active is not None else ""
    )
    block = doc.block(RestartsBlock)
    restarts = restarts_summary(block.entries) if block is not None else None
    liveness = _counts(summary.process_liveness, ranks, "process_liveness")
    progress = _counts(summary.gpu_progress, ranks, "gpu_progress")
    problem = []
    if monitor.state not in (None, "scanning"):
        problem = [
            _paint(
                f"MONITOR {_text(monitor.state).upper()}: {_text(monitor.errors)} "
                f"failed scan(s), last {_text(monitor.last_error)}",
                "red",
                color,
            )
        ]
    return [
        f"run {_text(doc.run_id)}",
        "state " + _paint(state, _STATE_STYLE.get(state, ""), color),
        *problem,
        f"updated {updated}",
        f"ranks {_text(observed)}/{_text(expected)} observed",
        f"liveness {_fmt_counts(liveness, _LIVENESS_STYLE, color)}",
        f"progress {_fmt_counts(progress, _PROGRESS_STYLE, color)}",
        f"findings {findings}",
        *([f"restarts {restarts}"] if restarts else []),
    ]


def _pack(parts: list[str], width: int | None) -> list[str]:
    """Join ``parts`` on one line, or on as few lines of ``width`` as they fit."""
    if width is None or width <= 0:
        return ["  ".join(parts)]
    lines: list[str] = []
    for part in parts:
        if lines and _visible_len(lines[-1]) + 2 + _visible_len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(part)
    return lines


def _health_lines(doc: StatusDoc, color: bool) -> list[str]:
    nodes = doc.gpu_health
    if not nodes:
        return ["GPU health: no data"]
    rows: list[Row] = []
    for node in sorted(nodes, key=_sort_key):
        info = nodes[node]
        health = _text(info.status)
        rows.append(
            [
                (str(node), ""),
                (_text(info.hostname), ""),
                (health, _HEALTH_STYLE.get(health.lower(), "")),
                (_text(info.source), ""),
                (_seconds(info.age_s), ""),
                (_text(info.gpus), ""),
            ]
        )
    header = ("NODE", "HOST", "STATUS", "SOURCE", "AGE (s)", "GPUS")
    return ["GPU health", *_table(header, rows, {0, 4, 5}, color)]


def _finding_lines(findings: Iterable[Finding], skipped: int, color: bool) -> list[str]:
    rows: list[Row] = []
    for f in findings:
        ftype = f.finding_type.value
        style = "yellow" if ftype in _WARNING_FINDINGS else "red"
        rows.append(
            [
                (_fmt_time(f.detected_wall_time), ""),
                (ftype, style),
                (_text(f.rank), ""),
                (_text(f.reason.value), ""),
                (_text(f.message), ""),
            ]
        )
    more = [f"({skipped} unreadable finding line(s) skipped)"] if skipped else []
    if not rows:
        return ["Latest findings: none", *more]
    header = ("TIME", "TYPE", "RANK", "REASON", "MESSAGE")
    return [f"Latest findings ({len(rows)})", *_table(header, rows, {2}, color), *more]


def render_status(
    status: JsonObject,
    findings: list[JsonObject],
    *,
    width: int | None = None,
    color: bool = False,
    now: datetime | None = None,
    launcher_gone: str | None = None,
) -> str:
    """The text screen for one ``status.json`` and the latest findings.

    ``width`` wraps the header and cuts every other line to that many visible characters
    (``None``: no limit).
    ``color`` adds ANSI codes: red for problems, yellow for warnings. ``now`` (aware)
    adds how long ago the monitor last wrote the status. ``launcher_gone``: why the
    status is frozen (:func:`rankguard.view.runfiles.launcher_gone`), shown after the
    header. Pure: no I/O, no clock. Both are read through :class:`StatusDoc` and
    :meth:`Finding.from_dict`: a finding line that is not one is skipped and counted.
    Control characters in the data are shown escaped (``\\x1b``), never sent to the
    terminal.
    """
    raw = _safe(status) if isinstance(status, dict) else {}
    if launcher_gone:
        raw = frozen_status(raw)
    doc = StatusDoc.from_dict(raw)
    found, skipped = parse_findings([_safe(f) for f in findings if isinstance(f, dict)])
    ranks = sorted(doc.ranks, key=lambda r: _sort_key(r.rank))
    if launcher_gone or doc.state in FINAL_STATES:  # nobody updates it: ages go on
        ranks = _aged(ranks, _status_age(doc, now))
    lines = [*_pack(_header(doc, ranks, color, now), width)]
    if launcher_gone:
        lines.append(_paint(safe_text(launcher_gone), "red", color))
    lines.append("")
    if ranks:
        lines.extend(_table(_RANK_HEADER, [_rank_row(r) for r in ranks], _RANK_RIGHT, color))
        legend = iteration_legend(ranks)
        if legend:
            lines.append(legend)
    else:
        lines.append("no ranks observed yet")
    detail = doc.rank_detail
    if not detail.complete and not detail.selected:
        lines.append(
            f"(the {_text(detail.listed)} ranks most in need of a look; every rank: "
            f"{_text(detail.file)}, rankguard status --ranks A-B)"
        )
    lines.append("")
    lines.extend(_health_lines(doc, color))
    lines.append("")
    lines.extend(_finding_lines(found, skipped, color))
    lines.extend(_ft_lines(doc))
    lines.extend(goodput_lines(doc.block(GoodputBlock)))
    lines.extend(checkpoint_lines(doc.block(CheckpointsBlock)))
    lines.extend(elastic_lines(doc.block(ElasticBlock)))
    return "\n".join(_clip(line, width) for line in lines) + "\n"


def elastic_lines(block: ElasticBlock | None) -> list[str]:
    """The nodes of the current rendezvous round, the spares waiting, the nodes lost
    and which spare took whose place (``status.json`` ``elastic``)."""
    if block is None:
        return []
    nodes, lo, hi = block.nodes, block.min_nodes, block.max_nodes
    shrunk = " (shrunk)" if block.shrunk else ""
    spares = block.spares_waiting
    out = ["", f"Nodes: {_s(nodes)} of {_s(lo)}:{_s(hi)}{shrunk}, {len(spares)} spare(s) waiting"]
    for spare in spares:
        out.append(f"  spare    {_text(spare.agent)} waiting since {_fmt_time(spare.since)}")
    for item in block.replacements:
        out.append(
            f"  replaced node {_s(item.node)}: {_text(item.replaced)} lost, "
            f"spare {_text(item.spare)} took its place (waited {_s(item.waited_s)} s)"
        )
    lost = block.lost
    if lost:
        out.append(f"  lost     {', '.join(_text(a) for a in lost)}")
    gone = block.spares_gone
    if gone:
        out.append(
            f"  gone     {', '.join(_text(a) for a in gone)} (spare(s) whose keep-alive "
            "stopped while waiting: not counted)"
        )
    return out


def _restart_row(r: RestartEntry) -> str:
    kind = {"inprocess": "in-process", "live_recovery": "live"}.get(r.kind, "process")
    number = r.restart if "restart" in r.keys else "-"
    when = r.wall_time if "wall_time" in r.keys else "-"
    row = f"  {kind} #{number} {when}  {r.cause or '-'} rank {_s(r.rank)}: {_s(r.message)}"
    if r.kind == "live_recovery":
        row += (
            f" (fault -> next step {_s(r.number('recovery_s'))} s, "
            f"{_s(r.number('steps_redone'))} step(s) redone)"
        )
    return row


def _live_lines(live: LiveBlock | None) -> list[str]:
    """Live recovery: the node's standbys and which rank each replaced."""
    if live is None:
        return []
    out = [
        "",
        f"Standbys: {_s(live.standbys_per_node)} per node, {_s(live.waiting)} "
        f"waiting, {_s(live.used)} used, {_s(live.left_unused)} left unused"
        + (f", {_s(live.started)} started to refill" if live.started else ""),
    ]
    for r in live.replaced:  # with where the newcomer's state came from, once said
        out.append(
            f"  rank {_s(r.lost_rank)}: pid {_s(r.lost_pid)} lost "
            f"({_s(r.cause)}), now standby pid {_s(r.standby_pid)}"
            + (f", state from {_s(r.source)}" if r.source else "")
        )
    for r in live.shrunk:  # no standby left: the job went on without it
        out.append(
            f"  rank {_s(r.lost_rank)}: pid {_s(r.lost_pid)} lost ({_s(r.cause)}), dropped: "
            f"the job goes on with {_s(live.world_size)} rank(s)"
        )
    return out


def _ft_lines(status: StatusDoc | JsonObject) -> list[str]:
    """Restarts and the timeouts in force with their sources (fault tolerance)."""
    doc = status if isinstance(status, StatusDoc) else StatusDoc.from_dict(status)
    out: list[str] = []
    block = doc.block(RestartsBlock)
    if block is not None and block.entries:
        restarts = block.entries
        inproc, live = block.count("inprocess"), block.count("live_recovery")
        process = len(restarts) - inproc - live
        out += [
            "",
            f"Restarts: {len(restarts)} ({process} process, {inproc} in-process"
            + (f", {live} live recovery" if live else "")
            + ")",
        ]
        out += [_restart_row(r) for r in restarts]
    out += _live_lines(doc.block(LiveBlock))
    stragglers = doc.block(StragglersBlock)
    if stragglers is not None:
        out += [
            "",
            f"Stragglers (report {_s(stragglers.report)}, best compute "
            f"{_s(stragglers.best_compute_ms)} ms): {stragglers.stragglers}",
        ]
        for label, rows in (("worst", stragglers.worst), ("best", stragglers.best)):
            cells = [f"rank {_s(r.rank)} rel {_s(r.relative)} ind {_s(r.individual)}" for r in rows]
            out.append(f"  {label:<5}  " + ", ".join(cells))
    stop = doc.block(StopRequestedBlock)
    if stop is not None:
        when = (
            stop_words(stop.stop_at_step, stop.stop_at_script_step)
            if stop.stop_at_step is not None
            else "at a step not known"
        )
        out.append(f"  stop requested {when}: {_s(stop.reason)}")
    out += _preemption_lines(doc.block(PreemptionBlock))
    timeouts = doc.block(TimeoutsBlock)
    if timeouts is not None and timeouts.entries:
        # in the launcher's order (rankguard.schema.cadence): the process timeouts, then each
        # phase's, with the section or key it came from
        out += ["", "Timeouts in force"]
        width = max(len(k) for k in timeouts.entries)
        for name, info in timeouts.entries.items():
            out.append(f"  {name:<{width}}  {_s(info.value):>9} s  {_s(info.source)}")
    return out


def _preemption_lines(pre: PreemptionBlock | None) -> list[str]:
    """``status.json``'s ``preemption``: the grace budget, and the preemption if any."""
    if pre is None:
        return []
    budget = pre.budget or PreemptBudget()
    out = [
        "",
        f"Preemption: grace {_s(budget.preempt_time_s)} s, longest save "
        f"{_s(budget.save_s)} s ({_s(budget.save_source)}) + stop-step lead "
        f"{_s(budget.lead_s)} s",
    ]
    if budget.fits is False:
        out.append("  WARNING: a save does NOT fit the grace window (raise preempt_time)")
    if pre.reason:
        out.append(
            f"  {_s(pre.reason)}: stop "
            + (
                stop_words(pre.stop_at_step, pre.stop_at_script_step)
                if pre.stop_at_step is not None
                else "step not agreed"
            )
            + f", saved script step "
            f"{_s(pre.saved_step)} ({_s(pre.ranks_saved)} rank(s)), killed at "
            f"the grace limit: {_s(list(pre.terminated_pids) or None)}"
        )
        if pre.saved:
            out.append(f"  {safe_text(pre.saved[:400])}")
    return out


def _s(value: Any) -> str:
    return "-" if value is None else str(value)


def _dur(seconds: float) -> str:
    if seconds < 600:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 36_000 else f"{seconds / 3600:.1f} h"


def goodput_lines(block: GoodputBlock | None) -> list[str]:
    """One line of the goodput ledger (status.json's ``goodput`` block): the ETTR,
    productive training against wall time, the part that cost the most."""
    if block is None:
        return []
    wall, productive = as_finite(block.wall_s), as_finite(block.productive_s)
    ettr = as_finite(block.ettr)
    if wall is None or productive is None:
        return []
    line = f"Goodput: ETTR {ettr_text(ettr)} (productive {_dur(productive)} of {_dur(wall)} wall)"
    loss = block.largest_loss
    seconds = as_finite(loss.seconds) if loss is not None else None
    if loss is not None and seconds is not None:
        line += f", largest loss {_text(loss.part)} {_dur(seconds)}"
    if not block.final:
        line += " (so far)"
    return ["", line]


def checkpoint_lines(ckpt: CheckpointsBlock | None) -> list[str]:
    """Last committed checkpoint per tier with its stage and write durations, the write
    in flight, failures and what the job resumed from (``checkpoints.json``)."""
    if ckpt is None:
        return []
    mode = "async" if ckpt.async_save else "sync"
    out = ["", f"Checkpoints ({mode}, {_s(ckpt.world_size)} rank(s))"]
    for tier, step in sorted(ckpt.last_committed.items()):
        info = ckpt.last.get(tier)
        if step is None and info is None:
            continue
        timing = (
            f"  stage {_s(info.stage_s)} s, write {_s(info.write_s)} s, at {_fmt_time(info.time)}"
            if info is not None
            else "  (found on disk)"
        )
        out.append(f"  {tier:<10}  last committed step {_s(step)}{timing}")
    if ckpt.inflight is not None:
        out.append(
            f"  in flight   step {_s(ckpt.inflight.step)} ({_s(ckpt.inflight.tier)}) "
            f"since {_fmt_time(ckpt.inflight.since)}"
        )
    if ckpt.loaded is not None:
        out.append(f"  resumed     from step {_s(ckpt.loaded.step)} ({_s(ckpt.loaded.tier)})")
    if ckpt.failures:
        out.append(f"  FAILED saves: {_s(ckpt.failures)}; last: {_s(ckpt.last_error)}")
    return out


# --------------------------------------------------------------------------- command
