"""`gpu`: NVML per-process SM utilisation summed over the engine's process tree (core/observe/gpu.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...host.clock import wall_us
from .base import ActivitySource, Tick
from .tree import ProcessTree

GPU_ACTIVE_PCT = 5.0  # summed SM utilisation that counts as working (an idle CUDA context reads 0)
GPU_POLL_US = 100_000  # NVML samples per-process utilisation every ~1/6 s: polling faster sees nothing new
GPU_SAMPLES_US = 500_000  # the samples looked at: the last half second (NVML stamps them in wall µs)


class GpuActivity(ActivitySource):
    """Working while the tree's summed utilisation over the last GPU_SAMPLES_US is >= GPU_ACTIVE_PCT."""

    name = "gpu"

    def __init__(self, tree: ProcessTree, util: Callable[[Sequence[int], int], float | None]) -> None:
        super().__init__()
        self.tree, self._util = tree, util
        self._polled_us: int | None = None

    def poll(self, tick: Tick) -> None:
        if self._polled_us is not None and tick.now_us - self._polled_us < GPU_POLL_US:
            return
        self._polled_us = tick.now_us
        util = self._util(self.tree.pids(), wall_us() - GPU_SAMPLES_US)
        if util is None or not tick.running:  # no reading; stopped: its work waits, as it was
            return
        self.in_flight = util >= GPU_ACTIVE_PCT
        if self.in_flight:
            self.last_us = tick.now_us
