"""The score reports as NVRx and Megatron Bridge print them.

Megatron Bridge's straggler manager (``megatron/bridge/training/nvrx_straggler.py``,
like NVRx's own Lightning callback) logs each report as ``GPU relative performance:``
and ``GPU individual performance:`` followed by one ``  Rank=<r> Node=<node>
Score=<s.ss>`` line per rank (all of them when few, else `` Worst performing n/N
ranks:`` then `` Best performing n/N ranks:``), and a straggler as ``STRAGGLER DETECTION
WARNING: Some GPUs have worse relative performance. Affected ranks: ...`` (``...
performance dropped. ...`` for the individual score). Bridge's verification step greps
those lines; rankguard prints them after its own report, with the same markers and
field order. ``Node`` is the rank's host, as in NVRx's ``rank_to_node``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["format_gpu_scores", "score_lines", "straggler_warnings"]


def format_gpu_scores(
    rank_to_score: Mapping[int, float],
    rank_to_node: Mapping[int, str],
    num_best: int = 3,
    num_worst: int = 3,
) -> str:
    """One report's rank lines, in NVRx's order (worst first, or best to worst)."""
    num_ranks = len(rank_to_score)
    scores_and_ranks = sorted(((s, r) for r, s in rank_to_score.items()), reverse=True)
    res = ""
    if num_ranks > (num_best + num_worst):
        res += f" Worst performing {num_worst}/{num_ranks} ranks:\n"
        for s, r in reversed(scores_and_ranks[-num_worst:]):
            res += f"  Rank={r} Node={rank_to_node[r]} Score={s:.2f}\n"
        res += f" Best performing {num_best}/{num_ranks} ranks:\n"
        for s, r in scores_and_ranks[:num_best]:
            res += f"  Rank={r} Node={rank_to_node[r]} Score={s:.2f}\n"
    else:
        for s, r in reversed(scores_and_ranks):
            res += f"  Rank={r} Node={rank_to_node[r]} Score={s:.2f}\n"
    return res


def score_lines(
    relative: Mapping[int, float] | None,
    individual: Mapping[int, float] | None,
    rank_to_node: Mapping[int, str],
    num_to_print: int,
) -> list[str]:
    """``GPU relative performance:`` and ``GPU individual performance:`` reports (the
    scores a report computed; None: not computed)."""
    out = []
    for title, scores in (("relative", relative), ("individual", individual)):
        if scores:
            table = format_gpu_scores(scores, rank_to_node, num_to_print, num_to_print)
            out.append(f"GPU {title} performance:\n{table}")
    return out


def straggler_warnings(relative: Sequence[int], individual: Sequence[int]) -> list[str]:
    """NVRx's warning lines for the ranks below a threshold in this report."""
    out = []
    if relative:
        out.append(
            "STRAGGLER DETECTION WARNING: Some GPUs have worse relative performance. "
            f"Affected ranks: {sorted(relative)}"
        )
    if individual:
        out.append(
            f"STRAGGLER DETECTION WARNING: Some GPUs performance dropped. Affected ranks: "
            f"{sorted(individual)}"
        )
    return out
