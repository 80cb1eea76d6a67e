"""`llama`: llama-server's /metrics (`n_decode_total`, `requests_processing`), probed while idle
every 50 ms and while decoding once a second, with the tree's CPU time carrying "still decoding"
between probes."""

from __future__ import annotations

from collections.abc import Callable

from ...host import probe
from ...host.clock import mono_us
from ...registry import abi
from .. import llama_server as ls
from .base import ActivitySource, ProbeCost, Tick
from .tree import CpuMeter, ProcessTree

CPU_ACTIVE_CORES = 0.25  # engine CPU use (in cores, while continued) that counts as decoding


class EngineActivity:
    """Tracks `last_us`, the latest time the engine is known to have been decoding.

    A probe showing a request in flight dates activity at the probe. A probe showing
    only that `n_decode_total` rose since the previous probe (up to 1 s earlier while
    active) dates it at that previous probe: the decode happened somewhere in between,
    and dating it at the later probe kept a finished engine active up to 1 s too long.
    CPU time only carries activity a probe raised: an idle engine answering probes on
    a loaded box can show a burst of ticks, which must not pace its peers.
    Times are monotonic µs (the engine's own intervals: a wall-clock step must not
    keep an idle engine active).
    """

    def __init__(self, idle_probe_us: int = 50_000, active_probe_us: int = 1_000_000) -> None:
        self.last_us: int | None = None  # never seen decoding
        self.idle_probe_us = idle_probe_us  # raise `active` within ~100 ms of the first decode
        self.active_probe_us = active_probe_us  # each probe costs a decoding engine throughput
        self._decode_total: float | None = None
        self._probe_us: int | None = None  # the last answered probe
        self._attempt_us: int | None = None  # the last probe sent, answered or not

    def probe_due(self, now_us: int, active: bool, stretch: Callable[[int], int] = int) -> bool:
        """Whether to probe /metrics now. The cadence follows `active` as it is now,
        not as it was at the last probe: an engine that went idle (whoever dropped
        the flag) is probed at the idle cadence at once; `stretch`: ProbeCost.interval_us."""
        interval = stretch(self.active_probe_us if active else self.idle_probe_us)
        return self._attempt_us is None or now_us - self._attempt_us >= interval

    def probe_sent(self, now_us: int) -> None:
        self._attempt_us = now_us

    def on_probe(self, now_us: int, n_decode_total: float, requests_processing: float) -> None:
        if requests_processing > 0:
            self.last_us = now_us
        elif self._probe_us is not None and self._decode_total is not None and n_decode_total > self._decode_total:
            self.last_us = self._probe_us if self.last_us is None else max(self.last_us, self._probe_us)
        self._decode_total, self._probe_us = n_decode_total, now_us

    def on_cpu(self, now_us: int, busy: bool, active: bool) -> None:
        """`busy`: the engine used >= CPU_ACTIVE_CORES while running; `active`: our slot's flag."""
        if busy and active:
            self.last_us = now_us

    def is_active(self, now_us: int) -> bool:
        return self.last_us is not None and now_us - self.last_us <= abi.ACTIVITY_WINDOW_US


class LlamaActivity(ActivitySource):
    """`in_flight`: the last answered probe's `requests_processing` > 0."""

    name = "llama"

    def __init__(
        self,
        metrics_url: str,
        tree: ProcessTree,
        cpu_cores: float | None = None,
        trusted: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self.metrics_url, self._trusted = metrics_url, trusted
        self.cpu_cores = cpu_cores if cpu_cores is not None else CPU_ACTIVE_CORES
        self.window = EngineActivity()
        self._cpu = CpuMeter(tree)
        self._client = probe.new_client()
        self._n_decode: float | None = None
        self.cost = ProbeCost()

    def poll(self, tick: Tick) -> None:
        cores = self._cpu.cores(tick.run_us)
        busy = cores is not None and cores >= self.cpu_cores
        self.window.on_cpu(tick.now_us, busy and tick.running, tick.active)
        if self.window.probe_due(tick.now_us, tick.active, self.cost.interval_us) and tick.may_probe():
            self.window.probe_sent(tick.now_us)
            self.cost.start()
            try:
                status, body = probe.get(self._client, self.metrics_url)
                met = ls.parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None
            except probe.ProbeError:
                met = None
            finally:
                self.cost.stop()
            if met is not None and (self._trusted is None or self._trusted()):  # the engine's own answer only
                self.window.on_probe(mono_us(), met.n_decode_total, met.requests_processing)
                self.in_flight = met.requests_processing > 0
                self._n_decode = met.n_decode_total
        self.last_us = self.window.last_us

    def is_active(self, now_us: int) -> bool:
        return self.window.is_active(now_us)

    def take_work_total(self) -> float | None:
        n, self._n_decode = self._n_decode, None
        return n

    @property
    def counts_work(self) -> bool:
        return True

    def close(self) -> None:
        self._client.close()
