"""The running dashboard's plot history: per-peer samples of the models it rendered, as the plots' lines.

Apart from the model (model.py): a one-shot report (`--once`) builds no history (issue 28).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .model import DashboardModel


@dataclass(frozen=True)
class Series:
    """One line of a plot: x in seconds relative to now (≤ 0)."""

    slot: int
    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]


@dataclass
class _Line:
    slot: int
    label: str
    points: deque = field(default_factory=deque)  # (t_s, window share, busy, achieved|None)
    recent: deque = field(default_factory=deque)  # (t_s, raw achieved) over the last ACHIEVED_AVG_S
    latency: deque = field(default_factory=deque)  # (t_s, {figure: ms}) of an engine that reports latency


# The detail view's latency lines: figure -> the label of its line (ms, the last minute's at each refresh)
LATENCY_LINES = {"ttft_p99_ms": "TTFT p99", "ttft_p50_ms": "TTFT p50", "itl_p99_ms": "ITL p99"}


ACHIEVED_AVG_S = 5.0


class History:
    """Per-peer samples over the last `span_s` seconds (UI thread only)."""

    def __init__(self, span_s: float = 120.0) -> None:
        self.span_s = span_s
        self._lines: dict[tuple[str, int, int, int], _Line] = {}
        self._last_t: float | None = None

    def add(self, model: DashboardModel) -> None:
        t = model.plot_s
        if self._last_t is not None and t <= self._last_t:
            return  # a frozen clock or a repeated model: nothing new
        self._last_t = t
        for g in model.gpus:
            achieved = dict(g.achieved_pct)
            for r in g.rows:
                p = r.peer
                k = (g.gpu_key, p.slot, p.pid, p.boot_us)
                line = self._lines.get(k)
                if line is None:
                    line = self._lines[k] = _Line(p.slot, p.name or f"pid {p.pid}")
                share = p.window_pct or 0.0  # what it gets (the floor included); 0 while not a member
                line.points.append((t, share, p.busy_pct, self._smoothed(line, t, achieved.get(p.slot))))
                lat = r.latency
                if lat is not None:
                    line.latency.append((t, {f: getattr(lat, f) for f in LATENCY_LINES}))
        cutoff = t - self.span_s
        for k in list(self._lines):
            pts, lat_pts = self._lines[k].points, self._lines[k].latency
            while pts and pts[0][0] < cutoff:
                pts.popleft()
            while lat_pts and lat_pts[0][0] < cutoff:
                lat_pts.popleft()
            if not pts:
                del self._lines[k]

    @staticmethod
    def _smoothed(line: _Line, t: float, value: float | None) -> float | None:
        """Achieved share averaged over the last ACHIEVED_AVG_S: tok/s rates are sampled
        every few seconds and lag membership changes, so single samples spike."""
        recent = line.recent
        if value is None:
            recent.clear()
            return None
        recent.append((t, value))
        while recent[0][0] < t - ACHIEVED_AVG_S:
            recent.popleft()
        return sum(v for _, v in recent) / len(recent)

    def series(self, gpu_key: str, metric: str, now_s: float, span_s: float, buckets: int) -> tuple[Series, ...]:
        """Lines of one GPU for `metric` (share, busy, achieved, configured) over the last `span_s`.

        Samples are averaged into `buckets` time buckets aligned to the clock
        (one per braille dot column: finer is invisible), and runs of equal
        values are reduced to their ends, so a flat line costs two points.
        """
        idx = {"share": 1, "busy": 2, "achieved": 3, "configured": 1}[metric]
        need_achieved = metric in ("achieved", "configured")
        bw = span_s / max(1, buckets)
        cutoff = now_s - span_s
        out = []
        for (key, *_), line in self._lines.items():
            if key != gpu_key:
                continue
            sums: dict[int, list[float]] = {}
            for pt in line.points:
                t = pt[0]
                if t < cutoff or (need_achieved and pt[3] is None):
                    continue
                acc = sums.setdefault(int(t // bw), [0.0, 0])
                acc[0] += pt[idx]
                acc[1] += 1
            if not sums:
                continue
            xy = [(min(0.0, (b + 0.5) * bw - now_s), round(v / n, 1)) for b, (v, n) in sums.items()]
            xy = _compress(xy)
            out.append(Series(line.slot, line.label, tuple(x for x, _ in xy), tuple(y for _, y in xy)))
        out.sort(key=lambda s: s.slot)
        return tuple(out)

    def latency_series(
        self, row_key: tuple[str, int, int, int], now_s: float, span_s: float, buckets: int
    ) -> tuple[Series, ...]:
        """One engine's latency lines (LATENCY_LINES, ms) over the last `span_s`, bucketed as `series`; its
        row is (gpu key, slot, pid, boot_us). A line's slot is its index in LATENCY_LINES (its colour)."""
        line = self._lines.get(row_key)
        if line is None:
            return ()
        bw = span_s / max(1, buckets)
        cutoff = now_s - span_s
        out = []
        for i, (figure, label) in enumerate(LATENCY_LINES.items()):
            sums: dict[int, list[float]] = {}
            for t, values in line.latency:
                v = values.get(figure)
                if t < cutoff or v is None:
                    continue
                acc = sums.setdefault(int(t // bw), [0.0, 0])
                acc[0] += v
                acc[1] += 1
            if sums:
                xy = _compress([(min(0.0, (b + 0.5) * bw - now_s), round(v / n, 1)) for b, (v, n) in sums.items()])
                out.append(Series(i, label, tuple(x for x, _ in xy), tuple(y for _, y in xy)))
        return tuple(out)


def _compress(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Drop the inner points of runs of equal y (a line through them is the same line)."""
    if len(xy) <= 2:
        return xy
    out = [xy[0]]
    for i in range(1, len(xy) - 1):
        if not (xy[i - 1][1] == xy[i][1] == xy[i + 1][1]):
            out.append(xy[i])
    out.append(xy[-1])
    return out
