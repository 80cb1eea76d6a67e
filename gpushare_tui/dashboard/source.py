"""Where the dashboard's models come from (a `DataSource`, dashboard/protocols.py): the live host, or
fixed data."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..core.host.clock import ClockUs, mono_us, wall_us
from ..core.host.errors import ControlError
from ..core.host.text import printable
from ..core.observe.accounting import Accountant
from ..core.observe.energy import EnergyReading, EnergySources
from ..core.observe.gpu import DeviceStats, device_stats
from ..core.observe.snapshot import GpuSnapshot, SegmentReader, printable_gpu, printable_problem
from .control import LocalControl
from .model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from ..core.pacing.governor import SloReport
    from .protocols import ControlClient


class LiveSource:
    """Segments + NVML + control-socket status.

    Segments: ours first, then foreign ones up to a cap and a time budget unless `all_owners`
    (core.snapshot.SegmentReader); the model counts those not read.

    `status` is asked only of managed engines (a control socket exists), with a
    short timeout, every `status_every_s`, and at once when its peer's `active`
    flag changed (its tok/s then changes too); one that answers slowly or not at
    all is asked less often. NVML is retried every `nvml_retry_s` for keys
    that are not devices (CPU hosts, test keys). Untrusted text (names, keys,
    errors, what engines say) is made printable unless `sanitize` is False
    (`--once --json` keeps it as it is, escaped by JSON; its table cells are
    made printable one by one).
    """

    def __init__(
        self,
        gpu_key: str | None = None,
        clock: ClockUs = wall_us,
        *,
        status_every_s: float = 2.0,
        status_timeout_s: float = 0.5,
        nvml_retry_s: float = 30.0,
        stats: Callable[[str], DeviceStats | None] = device_stats,
        control: ControlClient | None = None,
        shm_dir: str | None = None,
        sanitize: bool = True,
        all_owners: bool = False,
        energy: Callable[[str, int | None], EnergyReading | None] | None = None,
    ) -> None:
        """`energy(gpu_key, NVML energy mJ or None)`: a segment's energy reading (core.energy.EnergySources)."""
        self.clock = clock
        self.accountant = Accountant()  # device time and energy per engine, across collects (core.accounting)
        self._energy = energy if energy is not None else EnergySources()
        self.reader = SegmentReader(gpu_key, shm_dir, all_owners=all_owners)
        self.status_every_s = status_every_s
        self.status_timeout_s = status_timeout_s
        self.nvml_retry_s = nvml_retry_s
        self._stats = stats
        self._control = control if control is not None else LocalControl()
        self._nvml_next: dict[str, float] = {}
        self.sanitize = sanitize
        # (pid, gpu key, slot) -> (info, due, peer active then): one process may serve several engines
        self._status: dict[tuple[int, str, int], tuple[EngineInfo, float, bool]] = {}
        self._lock = threading.Lock()

    def prime(self) -> list[DashboardModel]:
        return []

    def _device(self, key: str, mono: float) -> DeviceStats | None:
        if self._nvml_next.get(key, 0.0) > mono:
            return None
        dev = self._stats(key)
        if dev is None:
            self._nvml_next[key] = mono + self.nvml_retry_s
        return dev

    def _engine(self, pid: int, gpu_key: str, slot: int, mono: float, active: bool) -> EngineInfo:
        with self._lock:
            cached = self._status.get((pid, gpu_key, slot))
        if cached is not None and cached[1] > mono and (cached[2] == active or cached[0].error):
            return cached[0]
        from ..core.pacing.control import StatusReply, Target  # only once an engine has a socket

        t0 = time.monotonic()
        text = _printable if self.sanitize else _same
        try:
            target = Target(slot=slot, gpu_key=gpu_key)  # which of the pid's engines, if it serves several
            r = StatusReply.from_json(self._control.request(pid, "status", self.status_timeout_s, target=target))
            info = EngineInfo(
                state=text(r.state),
                tok_s=r.tok_s,
                solo_tok_s=r.solo_tok_s,
                owner_config=text(r.config) if r.owner == "up" else None,
                config_weight=r.config_weight if r.owner == "up" else None,
                model=text(r.model),
                kind=text(r.kind),
                activity=text(r.activity),
                port=r.port,
                lateness=r.signal_lateness,
                log=text(r.log),
                gpu_key=r.gpu_key,
                slot=r.slot,
                latency=r.latency,
                slo=_printable_slo(r.slo) if self.sanitize and r.slo is not None else r.slo,
            )
            slow = time.monotonic() - t0 > self.status_timeout_s / 2
            due = mono + self.status_every_s * (5 if slow else 1)
        except ControlError as e:
            info = EngineInfo(error=str(e), state=cached[0].state if cached else None)
            due = mono + max(5.0, self.status_every_s)
        with self._lock:
            self._status[(pid, gpu_key, slot)] = (info, due, active)
        return info

    def forget_status(self, pid: int) -> None:
        with self._lock:
            for engine, cached in self._status.items():
                if engine[0] == pid:
                    self._status[engine] = (cached[0], 0.0, cached[2])

    def collect(self) -> DashboardModel:
        mono = time.monotonic()
        now = self.clock()
        read = self.reader.read_all(now)
        gpus, errors = read.gpus, read.errors
        if self.sanitize:
            gpus, errors = [printable_gpu(g) for g in gpus], [printable_problem(e) for e in errors]
        views = []
        seen: set[tuple[int, str, int]] = set()
        sockets = self._control.socket_pids()
        for g in gpus:
            dev = self._device(g.gpu_key, mono)
            vram = dict(dev.pid_mem_mib) if dev is not None else {}
            account = self.accountant.update(g, self._energy(g.gpu_key, dev.energy_mj if dev is not None else None))
            rows = []
            trusted = _trusted(g)
            for p in g.peers:
                has_socket = p.pid in sockets if sockets is not None else self._control.is_managed(p.pid)
                managed, engine = has_socket and trusted, None
                if has_socket and p.alive:
                    engine = self._engine(p.pid, g.gpu_key, p.slot, mono, p.active)
                    seen.add((p.pid, g.gpu_key, p.slot))
                    managed = trusted or (engine.gpu_key == g.gpu_key and engine.slot == p.slot)
                    engine = engine if managed else None  # a slot naming someone else's engine (spoofed)
                rows.append(PeerRow(g.gpu_key, p, managed, vram.get(p.pid), engine, account.of(p)))
            rows_t = tuple(rows)
            views.append(GpuView(g, dev, rows_t, achieved_shares(rows_t), account))
        self.accountant.retain(g.segment for g in gpus)
        with self._lock:
            for gone in [e for e in self._status if e not in seen]:
                del self._status[gone]
        return DashboardModel(
            now, tuple(views), tuple(errors), mono_us(), read.foreign_not_shown, read.foreign_shown_max
        )

    def close(self) -> None:
        self.reader.close()


def _trusted(g: GpuSnapshot) -> bool:
    """A segment only we can write: its slots' pids are our own engines' claims. In any other, a row
    is managed only when the engine's own status names this key and slot (issue 17: spoofed rows)."""
    return g.owner_uid == os.geteuid() and not g.writable_by_others


def _printable_slo(slo: SloReport) -> SloReport:
    """An engine's `slo` with its text made printable (the numbers are typed already)."""
    from dataclasses import replace

    return replace(slo, state=_printable(slo.state), classes=_printable(slo.classes), reason=_printable(slo.reason))


def _printable(x: str | None) -> str | None:
    return None if x is None else printable(x)


def _same(x: str | None) -> str | None:
    return x


class FixedSource:
    """Fixed models (snapshot and pilot tests): `prime()` fills the plots' history, `collect()` repeats the last."""

    def __init__(self, models: list[DashboardModel]) -> None:
        if not models:
            raise ValueError("FixedSource needs at least one model")
        self.models = models

    def prime(self) -> list[DashboardModel]:
        return self.models[:-1]

    def collect(self) -> DashboardModel:
        return self.models[-1]

    def forget_status(self, pid: int) -> None:
        pass

    def close(self) -> None:
        pass
