"""The runtime's statistics as Python values: the dataclasses of pfStats_t, pfClassStats_t,
pfMemoryInfo_t, pfJobInfo_t and the jobs' own counters, and their text rendering (the summary
``print(stats)`` shows and the table per bubble class, in the manner of torch.profiler's
``key_averages().table()``). Part of the binding core: imports only _enums."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from ._enums import BubbleKind, JobStatus, Result, SkipCause


def _skips(counts: List[int]) -> Dict[SkipCause, int]:
    """Counts by cause (a list indexed by pfSkipCause_t) as a dict; causes a newer library
    reports and this package does not know are dropped."""
    known = {int(c) for c in SkipCause}
    return {SkipCause(i): int(n) for i, n in enumerate(counts) if i in known}


def _kind(value: int) -> Union[BubbleKind, int]:
    try:
        return BubbleKind(value)
    except ValueError:
        return value


@dataclasses.dataclass(frozen=True)
class ClassStats:
    """pfClassStats_t: one bubble class's counters (the k-th bubble of an iteration is class
    ``#k``; a labelled bubble's class is its label)."""

    key: str
    kind: BubbleKind
    """Kind of the class's last bubble."""
    bubbles: int
    bubbles_filled: int
    bubbles_timed: int
    bubble_time_us: float
    p10_us: float
    """10th percentile of the durations the predictor keeps for the class."""
    filled_time_us: float
    items_completed: int
    skips: Dict[SkipCause, int] = dataclasses.field(default_factory=dict)
    p50_us: float = 0.0
    """Median of the durations the predictor keeps for the class."""
    gated_predicted_us: float = 0.0
    """What gated work (ticket, graph items) is planned to: the gated_prediction_quantile of
    the window (0 before min_samples)."""
    ungated_predicted_us: float = 0.0
    """What opaque work is planned to (prediction_quantile; 0 before min_samples)."""
    samples: int = 0
    """Timed bubbles the predictor has seen for the class."""
    late_backoffs: int = 0
    """Times a job was held out of the class after its slices kept starting late."""

    @property
    def mean_us(self) -> float:
        """Mean measured duration (0 before any)."""
        return self.bubble_time_us / self.bubbles_timed if self.bubbles_timed else 0.0

    @property
    def filled_share(self) -> float:
        """filled_time_us / bubble_time_us (0 when there was no bubble time)."""
        return self.filled_time_us / self.bubble_time_us if self.bubble_time_us > 0 else 0.0

    @classmethod
    def _from_native(cls, d: Dict[str, Any]) -> "ClassStats":
        d = dict(d)
        d["kind"] = _kind(d["kind"])
        d["skips"] = _skips(d["skips"])
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Stats:
    """pfStats_t: a runtime's counters (bubbles are counted once their timings are harvested:
    call :meth:`Runtime.synchronize` first for a complete picture)."""

    iterations: int
    bubbles: int
    bubbles_filled: int
    bubbles_skipped: int
    bubble_time_us: float
    filled_time_us: float
    overrun_time_us: float
    max_overrun_us: float
    slices_launched: int
    items_completed: int
    jobs_completed: int
    jobs_failed: int
    host_begin_end_ns: float
    filled_sm_us: float = 0.0
    """SM x us of fill work inside bubbles (several jobs' slices side by side count each)."""
    capacity_sm_us: float = 0.0
    """Fill SMs x bubble time: what filled_sm_us is out of."""
    skips: Dict[SkipCause, int] = dataclasses.field(default_factory=dict)
    """Skipped bubbles by cause (pfRuntimeGetSkipCounts); the counts sum to bubbles_skipped."""
    classes: Tuple[ClassStats, ...] = ()
    """Every bubble class's counters, in the order their first bubble was harvested."""
    bubbles_fill_started: int = 0
    """Timed bubbles in which a slice ran fill work."""
    fill_start_delay_us: float = 0.0
    """Sum over those bubbles of (first working slice's start - bubble begin)."""
    max_fill_start_delay_us: float = 0.0
    """The largest of those delays."""
    slices_past_end: int = 0
    """Working slices that ended after their bubble's end (how long they took to drain:
    overrun_time_us / max_overrun_us)."""
    bubble_failures: int = 0
    """Bubble instructions that failed inside an adapter (pipefill.torch, .deepspeed,
    .megatron), which went on without them; each distinct message was warned once
    (:attr:`Runtime.bubble_failures_by_message`)."""

    @property
    def filled_share(self) -> float:
        """filled_time_us / bubble_time_us (0 when there was no bubble time)."""
        return self.filled_time_us / self.bubble_time_us if self.bubble_time_us > 0 else 0.0

    @property
    def filled_sm_share(self) -> float:
        """filled_sm_us / capacity_sm_us: how much of the fill partition's bubble time ran
        fill work (0 when there was none)."""
        return self.filled_sm_us / self.capacity_sm_us if self.capacity_sm_us > 0 else 0.0

    def table(self, sort_by: str = "bubble_time_us", row_limit: int = 100) -> str:
        """A table with one row per bubble class: bubbles, filled, mean and p10 duration,
        filled share, items, skipped bubbles by cause. ``sort_by``: bubble_time_us (default),
        bubbles, items_completed, filled_share or key."""
        return class_table(self.classes, sort_by, row_limit)

    def __str__(self) -> str:
        return summary(self)


@dataclasses.dataclass(frozen=True)
class MemoryInfo:
    """pfMemoryInfo_t: the fill arena's use and the device's memory, measured at the call."""

    arena_bytes: int
    arena_used_bytes: int
    """Held now by jobs' resident sets and slice workspaces."""
    arena_largest_free_bytes: int
    """The largest resident set a new job could get."""
    device_free_bytes: int
    device_total_bytes: int


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """pfJobInfo_t."""

    status: JobStatus
    items_completed: int
    item_count: int
    slices_launched: int
    bubble_time_us: float
    busy_time_us: float
    config_index: int
    error: Result


@dataclasses.dataclass(frozen=True)
class CostInfo:
    """pfJobCostInfo_t: a job's item cost as given at creation (the prior) and as learned from
    its measured slices (what the planner uses now), for the configuration in use."""

    config_index: int
    prior_cost_us: float
    learned_cost_us: float
    samples: int             # timed slices measured
    probes: int              # one-item probes run while its estimated item fitted no bubble
    too_short_streak: int    # bubbles in a row its estimated item did not fit, now
    too_short_bubbles: int   # all such bubbles
    warned: bool             # the too-short warning was logged


@dataclasses.dataclass(frozen=True)
class TicketCounts:
    """What a :class:`pipefill.jobs.SimTicketJob` observed, item by item."""

    items_run: int
    duplicates: int
    """Items that ran more than once (must stay 0). Tracked up to 2**28 items."""
    out_of_range: int
    tracked: bool
    slices: int


@dataclasses.dataclass(frozen=True)
class GraphCounts:
    """What a :class:`pipefill.jobs.GraphJob` observed on the simulated/host backends (the
    runtime calls a native per-item hook there; on CUDA the graph is the work and nothing is
    counted)."""

    items_run: int
    duplicates: int
    """Items that ran more than once (must stay 0)."""
    out_of_order: int
    """Items that did not follow the previous one (one graph instance runs them in order)."""
    index_mismatches: int
    """Items whose index word did not hold the item when it ran (must stay 0)."""


@dataclasses.dataclass(frozen=True)
class FillProgress:
    """fjProgress_t of an example fill job."""

    items_done: int
    duplicate_items: int
    out_of_order: int
    outputs_kept: int
    first_loss: float
    last_loss: float

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
