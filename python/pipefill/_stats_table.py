"""Text rendering of a runtime's statistics: the summary ``print(stats)`` shows and the table
per bubble class (in the manner of torch.profiler's ``key_averages().table()``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Mapping, Sequence

from ._enums import SkipCause

if TYPE_CHECKING:
    from ._runtime import ClassStats, Stats


def _us(value: float) -> str:
    """A duration in the unit that keeps it short (us, ms, s)."""
    if value >= 1e6:
        return f"{value / 1e6:.3f} s"
    if value >= 1e3:
        return f"{value / 1e3:.3f} ms"
    return f"{value:.1f} us"


def skips_text(skips: Mapping[SkipCause, int]) -> str:
    """'no samples yet 2, too short 1' (causes with a count only, most frequent first)."""
    parts = sorted(((n, cause) for cause, n in skips.items() if n > 0),
                   key=lambda item: (-item[0], int(item[1])))
    return ", ".join(f"{cause.description} {n}" for n, cause in parts) or "-"


def class_table(classes: Sequence["ClassStats"], sort_by: str = "bubble_time_us",
                row_limit: int = 100) -> str:
    """One row per bubble class: bubbles, mean and p10 duration, filled share, items, skips."""
    if sort_by not in ("bubble_time_us", "bubbles", "items_completed", "key", "filled_share"):
        raise ValueError(f"Stats.table: sort_by '{sort_by}' is not one of bubble_time_us, "
                         "bubbles, items_completed, filled_share, key")
    rows = sorted(classes, key=lambda c: c.key if sort_by == "key" else -getattr(c, sort_by))
    header = ("class", "kind", "bubbles", "filled", "mean", "p10", "filled %", "items",
              "skipped by cause")
    body: List[Sequence[str]] = []
    for c in rows[:row_limit]:
        body.append((c.key, c.kind.name.lower(), str(c.bubbles), str(c.bubbles_filled),
                     _us(c.mean_us), _us(c.p10_us), f"{100 * c.filled_share:.1f}%",
                     str(c.items_completed), skips_text(c.skips)))
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) if body else len(header[i])
              for i in range(len(header))]
    # Text columns left-aligned, numbers right-aligned; the last column is free text.
    left = {0, 1, len(header) - 1}

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "-" * len(line(header))
    text = [rule, line(header), rule, *(line(r) for r in body), rule]
    if len(rows) > row_limit:
        text.append(f"... {len(rows) - row_limit} more classes (row_limit={row_limit})")
    return "\n".join(text)


def summary(stats: "Stats") -> str:
    """What ``print(stats)`` shows: the totals in a few lines, then the class table."""
    lines = [
        f"PipeFill stats: {stats.iterations} iterations, {stats.bubbles} bubbles "
        f"({stats.bubbles_filled} filled, {stats.bubbles_skipped} skipped)",
        f"  bubble time {_us(stats.bubble_time_us)}, filled {_us(stats.filled_time_us)} "
        f"({100 * stats.filled_share:.1f}% of it; SM share {100 * stats.filled_sm_share:.1f}%)",
        f"  fill: {stats.slices_launched} slices, {stats.items_completed} items, "
        f"jobs {stats.jobs_completed} completed / {stats.jobs_failed} failed; overrun "
        f"{_us(stats.overrun_time_us)} (max {_us(stats.max_overrun_us)})",
        f"  skipped by cause: {skips_text(stats.skips)}",
        f"  host cost of a bubble begin+end: {stats.host_begin_end_ns:.0f} ns",
    ]
    if stats.bubble_failures:
        lines.append(f"  bubble instructions that failed inside an adapter: {stats.bubble_failures} "
                     "(Runtime.bubble_failures_by_message)")
    if stats.classes:
        lines.append(class_table(stats.classes))
    if stats.bubbles_skipped and stats.skips.get(SkipCause.NO_HISTORY, 0) == stats.bubbles_skipped:
        lines.append("  (every skipped bubble's class was still collecting samples: a class "
                     "needs min_samples bubbles, or pass expected_us, before it is filled)")
    return "\n".join(lines)
