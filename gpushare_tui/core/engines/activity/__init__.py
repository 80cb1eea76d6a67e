"""Activity sources: what "this engine is working now" means, one small module per source behind
one interface (ActivitySource), built from a declaration.ActivitySpec by `make_source`.

The supervisor's monitor thread calls `poll(tick)` every MONITOR_TICK_S and asks only:
`is_active(now_us)` (worked within the registry's activity window: raise/keep `active`),
`last_us` (when, for Membership.mark_active), `in_flight` (work in flight right now, as exactly as
the source can tell: published as DEMAND) and `take_work_total()` (a work counter for tok/s; only
llama has one). It never knows the engine's kind.

- `llama` (llama.py): llama-server's /metrics probes, CPU time carrying what a probe raised;
- `metrics` (metrics.py): a Prometheus gauge at a URL counting work in flight (vLLM, SGLang, TGI);
- `cpu` (cpu.py): the engine's process tree uses >= `cpu_cores` cores while continued;
- `gpu` (gpu.py): NVML per-process utilisation summed over the tree;
- `always` (always.py): working while it runs (training, batch jobs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..declaration import ActivitySpec
from .base import ActivitySource, Tick
from .llama import EngineActivity
from .tree import CpuMeter, ProcessTree, cores_of, engine_cpu_ns, process_cpu_ns, threads_sched_ns

__all__ = [
    "ActivitySource",
    "CpuMeter",
    "EngineActivity",
    "ProcessTree",
    "Tick",
    "cores_of",
    "make_source",
    "engine_cpu_ns",
    "process_cpu_ns",
    "threads_sched_ns",
]

GpuUtil = Callable[[Sequence[int], int], float | None]  # (pids, since wall µs) -> summed SM % or None


def make_source(
    spec: ActivitySpec,
    *,
    tree: ProcessTree,
    base_url: str | None = None,
    gpu_util: GpuUtil | None = None,
    say: Callable[[str], None] | None = None,
) -> ActivitySource:
    """The source `spec` declares (checked by declaration.check_activity). `base_url`: the engine's
    own HTTP root (llama: its /metrics is there unless `spec.metrics_url` says otherwise);
    `gpu_util`: NVML per-process utilisation (the `gpu` source needs it). A /metrics answer is believed
    only while its port's listener is the tree's (listener.PortCheck; `say` tells a squatter once).
    Build it in the thread that polls it (an HTTP client is made here)."""
    if spec.source == "llama":
        from .llama import LlamaActivity

        url = spec.metrics_url or f"{base_url}/metrics"
        return LlamaActivity(url, tree, spec.cpu_cores, trusted=_trusted(url, tree, say))
    if spec.source == "metrics":
        from .metrics import GaugeActivity

        assert spec.metrics_url and spec.gauge  # check_activity
        return GaugeActivity(spec.metrics_url, spec.gauge, trusted=_trusted(spec.metrics_url, tree, say))
    if spec.source == "cpu":
        from .cpu import CpuActivity

        return CpuActivity(tree, spec.cpu_cores)
    if spec.source == "gpu":
        from .gpu import GpuActivity

        if gpu_util is None:
            raise ValueError("the gpu activity source needs NVML per-process utilisation")
        return GpuActivity(tree, gpu_util)
    if spec.source == "always":
        from .always import AlwaysActivity

        return AlwaysActivity()
    raise ValueError(f"unknown activity source {spec.source!r}")


def _trusted(url: str, tree: ProcessTree, say: Callable[[str], None] | None) -> Callable[[], bool] | None:
    """Whether `url`'s listener is the tree's now (None: a URL with no host to look at)."""
    from ..listener import PortCheck, url_address

    where = url_address(url)
    return PortCheck(*where, tree.pids, say=say).trusted if where is not None else None
