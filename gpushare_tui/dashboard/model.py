"""The immutable model the dashboard renders, and the plot history built from it.

Data flows one way: a data source (`dashboard.source`, on the App's collector
worker) builds a `DashboardModel` from `core.snapshot` (+ NVML + control-socket
status) and the App hands it to the widgets, which only render it. Nothing here
does I/O or imports Textual.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from ..core.observe.accounting import GpuAccount, PeerAccount
from ..core.observe.gpu import DeviceStats
from ..core.observe.snapshot import GpuSnapshot, PeerSnapshot, SegmentProblem
from ..core.registry.abi import to_f32

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..core.pacing.control import SignalLateness


@dataclass(frozen=True)
class EngineInfo:
    """What a managed engine's control socket said (`status`), or why it did not."""

    state: str | None = None  # running / stopped / loading / exiting ...
    tok_s: float | None = None
    solo_tok_s: float | None = None  # the best tok/s it reached as its schedule's only active member
    model: str | None = None
    owner_config: str | None = None  # the `up` config file that owns it (None: not owned by an up)
    config_weight: float | None = None  # its weight in that file
    kind: str | None = None
    activity: str | None = None  # a supervised engine's activity source (None: an older reply, a GpuShare engine)
    port: int | None = None
    error: str | None = None
    lateness: SignalLateness | None = None  # a supervisor's SIGCONT/SIGSTOP lateness (llama-server engines)
    log: str | None = None  # its log file (a supervisor's engine log)
    gpu_key: str | None = None  # where it says it is joined (what confirms a row as managed: source.py)
    slot: int | None = None

    @property
    def speed_pct(self) -> float | None:
        """Speed vs solo: tok/s now ÷ the best tok/s it reached alone, in %; None unless both are known."""
        return speed_pct(self.tok_s, self.solo_tok_s)


def speed_pct(tok_s: float | None, solo_tok_s: float | None) -> float | None:
    """tok_s ÷ solo_tok_s × 100 (the one place it is computed); None unless both are known and solo > 0."""
    if tok_s is None or solo_tok_s is None or solo_tok_s <= 0:
        return None
    return 100.0 * tok_s / solo_tok_s


@dataclass(frozen=True)
class PeerRow:
    gpu_key: str
    peer: PeerSnapshot
    managed: bool = False  # a control socket we can reach, and the engine confirms this row (or the segment is trusted)
    vram_mib: float | None = None
    engine: EngineInfo | None = None
    account: PeerAccount | None = None  # device time and energy (core.accounting; None: not accounted)

    @property
    def key(self) -> str:
        """Stable row identity: a new owner of the slot is a new row."""
        p = self.peer
        return f"{self.gpu_key}/{p.slot}/{p.pid}/{p.boot_us}"

    @property
    def tok_s(self) -> float | None:
        return self.engine.tok_s if self.engine is not None else None

    @property
    def speed_pct(self) -> float | None:
        """Speed vs solo while it works; None when idle or dead (0 tok/s then is no speed to compare)."""
        p = self.peer
        if self.engine is None or not (p.alive and p.active):
            return None
        return self.engine.speed_pct

    @property
    def differs_from_config(self) -> bool:
        """An `up`-owned engine whose live weight is not its file's (a dashboard edit)."""
        e, w = self.engine, self.peer.weight
        return e is not None and e.config_weight is not None and w is not None and to_f32(e.config_weight) != w


@dataclass(frozen=True)
class GpuView:
    snapshot: GpuSnapshot
    device: DeviceStats | None = None
    rows: tuple[PeerRow, ...] = ()
    achieved_pct: tuple[tuple[int, float], ...] = ()  # (slot, achieved share %) of each member (busy-based)
    account: GpuAccount | None = None  # the GPU's busy total and idle energy (core.accounting)

    @property
    def gpu_key(self) -> str:
        return self.snapshot.gpu_key


def unmanaged_view(g: GpuSnapshot, account: GpuAccount | None = None) -> GpuView:
    """A view of `g` without device stats, every peer unmanaged: another host's GPU (no control socket
    of ours, no admin action reaches it), with the accounts its host reported (`account`)."""
    rows = tuple(PeerRow(g.gpu_key, p, account=account.of(p) if account else None) for p in g.peers)
    return GpuView(g, None, rows, account=account)


@dataclass(frozen=True)
class DashboardModel:
    now_us: int
    gpus: tuple[GpuView, ...] = ()
    errors: tuple[SegmentProblem, ...] = ()
    mono_us: int | None = None  # the collector's monotonic clock: a wall-clock step must not freeze the plots
    foreign_not_shown: int = 0  # segments of other users not read this refresh (over the cap or the time budget)
    foreign_shown_max: int | None = None  # that cap (None: none, --all-owners, or not known)

    @property
    def plot_s(self) -> float:
        """The plots' time axis, in seconds (monotonic where known; fixed models use now_us)."""
        return (self.now_us if self.mono_us is None else self.mono_us) / 1e6

    def rows(self) -> tuple[PeerRow, ...]:
        return tuple(r for g in self.gpus for r in g.rows)

    def gpu(self, key: str | None) -> GpuView | None:
        return next((g for g in self.gpus if g.gpu_key == key), None)


def without_idle_segments(model: DashboardModel) -> tuple[DashboardModel, int]:
    """`model` less its segments with no live peer (left over by engines long gone: shown, never
    unlinked, on request), and how many were left out."""
    live = tuple(g for g in model.gpus if any(r.peer.alive for r in g.rows))
    return replace(model, gpus=live), len(model.gpus) - len(live)


def achieved_shares(rows: tuple[PeerRow, ...]) -> tuple[tuple[int, float], ...]:
    """(slot, achieved share %) of every member: its busy time ÷ Σ busy time over the schedule's
    members (core.snapshot's `achieved_pct`: time on the device, comparable across models and
    known for foreign peers too, unlike tok/s)."""
    return tuple((r.peer.slot, r.peer.achieved_pct) for r in rows if r.peer.achieved_pct is not None)


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
        cutoff = t - self.span_s
        for k in list(self._lines):
            pts = self._lines[k].points
            while pts and pts[0][0] < cutoff:
                pts.popleft()
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
