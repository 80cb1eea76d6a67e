"""The immutable model the dashboard renders (the plot history built from it: history.py).

Data flows one way: a data source (`dashboard.source`, on the App's collector
worker) builds a `DashboardModel` from `core.snapshot` (+ NVML + control-socket
status) and the App hands it to the widgets, which only render it. Nothing here
does I/O or imports Textual.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.observe.accounting import GpuAccount, PeerAccount
from ..core.observe.gpu import DeviceStats
from ..core.observe.snapshot import GpuSnapshot, PeerSnapshot, SegmentProblem
from ..core.registry.abi import to_f32

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..core.observe.latency import LatencyReport
    from ..core.pacing.control import SignalLateness
    from ..core.pacing.governor import SloReport


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
    latency: LatencyReport | None = None  # its clients' latency (engines behind a front proxy; else None)
    slo: SloReport | None = None  # its latency target, attainment and the governor's last word (text printable)

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
    def latency(self) -> LatencyReport | None:
        """Its clients' latency over the last minute, for a live managed engine that reports it."""
        return self.engine.latency if self.engine is not None and self.peer.alive else None

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
