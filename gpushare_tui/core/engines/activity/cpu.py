"""`cpu`: the engine's whole process tree uses at least `cpu_cores` cores while it is continued.
A CUDA process spin-waits on synchronisation, so this is a fair proxy on a GPU host too."""

from __future__ import annotations

from .base import ActivitySource, Tick
from .tree import CpuMeter, ProcessTree

# An idle server (Python's http.server, llama-server between requests, vLLM's front end) uses well under
# 0.05 cores; one busy worker, or a CUDA process waiting on its stream, uses ~1. A quarter core is far
# from both, and a busy worker on a loaded 2-core box (getting half a core) still reads above it.
CPU_ACTIVE_CORES = 0.25
# Each reading spans this much continued time: one stray 10 ms tick of an idle tree reads 0.1 core
# (a 40 ms span read it as 0.25, i.e. busy). The release after the last work is this + the 2 s window.
CPU_SPAN_US = 100_000


class CpuActivity(ActivitySource):
    """`in_flight`: the last reading was busy (kept while the engine is stopped: its work waits)."""

    name = "cpu"

    def __init__(self, tree: ProcessTree, cpu_cores: float | None = None) -> None:
        super().__init__()
        self.cpu_cores = cpu_cores if cpu_cores is not None else CPU_ACTIVE_CORES
        self._meter = CpuMeter(tree, CPU_SPAN_US)

    def poll(self, tick: Tick) -> None:
        cores = self._meter.cores(tick.run_us)
        if cores is None:
            return
        self.in_flight = cores >= self.cpu_cores
        if self.in_flight:
            self.last_us = tick.now_us
