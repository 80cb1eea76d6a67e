"""Truth at every edge: what each window an engine was paced into gave it. Pure: no I/O, the clock is a parameter.

Each actuator of the pacing policy records one `Window` per window it ran the engine in, from its start edge to
its end edge: the window's length by the schedule, how late the run's start (the supervisor's SIGCONT, GpuShare's
wake-up) and its stop (SIGSTOP; GpuShare's last step's end) went out after their edges, and how long the engine
actually ran inside it (a CPU engine: its threads' CPU time over the cores it may use; GpuShare: its steps). The
loss of a window is what the schedule gave less what the engine ran; spread over its two edges, it is the loss per
edge. `report` sums up the last minute (`status NAME`); `by_length` groups windows by their scheduled length and
`fit_loss` splits the loss into a part per window (at its edges, whatever its length) and a part proportional to
its length (the engine ran slower inside it: cores taken by others) — the bench's table."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REPORT_SPAN_US = 60_000_000  # `status NAME` shows the last minute
WINDOWS_KEPT = 4096  # > a minute of the shortest windows of a 2-member schedule (80 ms period: 750 a minute)


@dataclass(frozen=True)
class Window:
    """One window the engine ran in. `end_mono_us`: when it was recorded (monotonic µs, shortly after its end).
    `scheduled_us`: its length by the schedule. `cont_late_us`/`stop_late_us`: how late the run's start and
    stop went out after their edges (the stop's edge: the window's end less the actuator's stop lead); None:
    not measured. `ran_us`: how long the engine ran inside it (None: unknown, e.g. its threads could not be
    read). `waited_us`: how long its runnable threads waited for a core meanwhile, over its cores (CPU engines)."""

    end_mono_us: int
    scheduled_us: int
    cont_late_us: int | None
    stop_late_us: int | None
    ran_us: int | None
    waited_us: int | None = None

    @property
    def loss_us(self) -> int | None:
        """Scheduled less ran (negative: it ran more, e.g. past a late stop)."""
        return None if self.ran_us is None else self.scheduled_us - self.ran_us


@dataclass(frozen=True)
class EdgeReport:
    """The windows of the last `span_s`: how many, their mean scheduled length, the signals' lateness (both
    edges pooled), what the engine ran of what was scheduled, the loss per edge (half a window's loss), and
    its threads' wait for a core (CPU engines). None: unknown (no window, or nothing measured)."""

    span_s: float | None = None
    windows: int | None = None
    scheduled_ms_mean: float | None = None
    lateness_p50_us: int | None = None
    lateness_p99_us: int | None = None
    cont_late_p50_us: int | None = None  # each edge's alone: the run's start (SIGCONT, a wake-up) ...
    stop_late_p50_us: int | None = None  # ... and its stop
    ran_pct: float | None = None
    loss_per_edge_ms: float | None = None
    waited_pct: float | None = None


def ring() -> deque[Window]:
    """The bounded ring an actuator records its windows in."""
    return deque(maxlen=WINDOWS_KEPT)


def recent(windows: Iterable[Window], now_mono_us: int, span_us: int = REPORT_SPAN_US) -> list[Window]:
    return [w for w in windows if now_mono_us - w.end_mono_us <= span_us]


def percentile(xs: Sequence[int], q: float) -> int | None:
    """The `q` quantile (0..1) of `xs` by rank (no interpolation); None when empty."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else None


def report(windows: Iterable[Window], now_mono_us: int, span_us: int = REPORT_SPAN_US) -> EdgeReport:
    """The windows recorded in the `span_us` before `now_mono_us`, summed up (EdgeReport)."""
    ws = recent(windows, now_mono_us, span_us)
    if not ws:
        return EdgeReport(span_s=span_us / 1e6, windows=0)
    late = [x for w in ws for x in (w.cont_late_us, w.stop_late_us) if x is not None]
    measured = [w for w in ws if w.ran_us is not None]
    sched_total = sum(w.scheduled_us for w in measured)
    ran_total = sum(w.ran_us or 0 for w in measured)
    waited = [w for w in measured if w.waited_us is not None]
    waited_sched = sum(w.scheduled_us for w in waited)
    return EdgeReport(
        span_s=span_us / 1e6,
        windows=len(ws),
        scheduled_ms_mean=sum(w.scheduled_us for w in ws) / len(ws) / 1000,
        lateness_p50_us=percentile(late, 0.5),
        lateness_p99_us=percentile(late, 0.99),
        cont_late_p50_us=percentile([w.cont_late_us for w in ws if w.cont_late_us is not None], 0.5),
        stop_late_p50_us=percentile([w.stop_late_us for w in ws if w.stop_late_us is not None], 0.5),
        ran_pct=100 * ran_total / sched_total if sched_total else None,
        loss_per_edge_ms=(sched_total - ran_total) / len(measured) / 2 / 1000 if measured else None,
        waited_pct=100 * sum(w.waited_us or 0 for w in waited) / waited_sched if waited_sched else None,
    )


def by_length(windows: Iterable[Window], bucket_us: int = 1000) -> dict[int, EdgeReport]:
    """The windows grouped by scheduled length (rounded to `bucket_us`), each group summed up as `report`
    does (its span: all of them). Keys: the length in µs, ascending."""
    groups: dict[int, list[Window]] = {}
    for w in windows:
        groups.setdefault(round(w.scheduled_us / bucket_us) * bucket_us, []).append(w)
    out = {}
    for length in sorted(groups):
        ws = groups[length]
        now = max(w.end_mono_us for w in ws)
        out[length] = report(ws, now, span_us=now - min(w.end_mono_us for w in ws))
    return out


def fit_loss(windows: Iterable[Window]) -> tuple[float, float] | None:
    """Least squares of each window's loss on its scheduled length: (the loss per window whatever its length,
    µs: what its edges cost; the fraction of its length lost besides: the engine ran slower inside it). None
    with fewer than two distinct lengths measured."""
    pts = [(w.scheduled_us, w.loss_us) for w in windows if w.loss_us is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - slope * mx, slope
