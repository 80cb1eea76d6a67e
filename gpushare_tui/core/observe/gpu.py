"""NVML access (nvidia-ml-py): gpu keys, device stats and per-pid stats.

Every query returns None for what NVML cannot tell; only `gpu_key_for_index`
raises, with a message fit for the user.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..host.errors import GpushareError
from ..registry.abi import derive_gpu_key


class GpuKeyError(GpushareError, RuntimeError):
    """No registry key for a GPU index (no NVML, no such device)."""


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _str(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


CLI_KEY_HINT = "pass --gpu-key KEY"  # how the command line gives a key instead: the default hint


def gpu_key_for_index(index: int, *, key_hint: str = CLI_KEY_HINT) -> str:
    """NVML UUID of visible device `index` (CUDA_VISIBLE_DEVICES respected) as a key. GpuKeyError where there
    is none; `key_hint`: how the caller's surface gives a key instead (its flag, its file key, its parameter),
    said when there is no GPU to take one from."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entry: str | None = None
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if index < 0 or index >= len(items):
            raise GpuKeyError(
                f"no GPU {index}: CUDA_VISIBLE_DEVICES={visible!r} makes {len(items)} visible; "
                f"{key_hint} to share a segment without a GPU"
            )
        entry = items[index]
        if not entry.lstrip("-").isdigit():
            return derive_gpu_key(entry)  # a UUID (or MIG id) given directly
        index = int(entry)
    nv = _nvml()
    if nv is None:
        raise GpuKeyError(f"no NVIDIA driver (NVML unavailable): {key_hint} to share a segment without a GPU")
    try:
        count = nv.nvmlDeviceGetCount()
        if index < 0 or index >= count:
            raise GpuKeyError(f"no GPU {index}: NVML sees {count} device(s)")
        return derive_gpu_key(_str(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index))))
    except nv.NVMLError as e:
        raise GpuKeyError(f"NVML error for GPU {index}: {e}") from None


@dataclass(frozen=True)
class DeviceStats:
    name: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    pid_mem_mib: tuple[tuple[int, float], ...] = ()
    pid_util_pct: tuple[tuple[int, float], ...] = ()
    energy_mj: int | None = None  # nvmlDeviceGetTotalEnergyConsumption: mJ since the driver loaded (Volta+)


def _try(f, *args):
    try:
        return f(*args)
    except Exception:
        return None


NVML_UUID_PREFIXES = ("GPU-", "MIG-")  # what NVML device UUIDs (and so keys derived from them) start with


def device_stats(gpu_key: str, since_us: int = 0) -> DeviceStats | None:
    """Stats for the device whose UUID is `gpu_key`; None when there is no such device. A key that is
    no NVML UUID (a CPU host's, a test's) is None at once: NVML is not even loaded for it."""
    if not gpu_key.startswith(NVML_UUID_PREFIXES):
        return None
    nv = _nvml()
    if nv is None:
        return None
    handle = _try(nv.nvmlDeviceGetHandleByUUID, gpu_key)
    if handle is None:
        return None
    util = _try(nv.nvmlDeviceGetUtilizationRates, handle)
    mem = _try(nv.nvmlDeviceGetMemoryInfo, handle)
    temp = _try(nv.nvmlDeviceGetTemperature, handle, 0)
    power = _try(nv.nvmlDeviceGetPowerUsage, handle)
    procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
    samples = _try(nv.nvmlDeviceGetProcessUtilization, handle, since_us) or []
    energy = _try(nv.nvmlDeviceGetTotalEnergyConsumption, handle)  # NVMLError (None) before Volta
    return DeviceStats(
        name=_str(n) if (n := _try(nv.nvmlDeviceGetName, handle)) else None,
        util_pct=float(util.gpu) if util else None,
        mem_used_mib=mem.used / 2**20 if mem else None,
        mem_total_mib=mem.total / 2**20 if mem else None,
        temperature_c=float(temp) if temp is not None else None,
        power_w=power / 1000 if power is not None else None,
        pid_mem_mib=tuple((p.pid, (p.usedGpuMemory or 0) / 2**20) for p in procs),
        pid_util_pct=tuple((s.pid, float(s.smUtil)) for s in samples),
        energy_mj=int(energy) if energy is not None else None,
    )


def pid_util_pct(gpu_key: str, pid: int, since_us: int) -> float | None:
    """SM utilisation of one process since `since_us` (host pid), or None."""
    stats = device_stats(gpu_key, since_us)
    if stats is None:
        return None
    values = [u for p, u in stats.pid_util_pct if p == pid]
    return max(values) if values else 0.0


def pids_util_pct(gpu_key: str, pids: Sequence[int], since_us: int) -> float | None:
    """SM utilisation of a process tree since `since_us` (host pids): the sum of each pid's, at most
    100; None when the key is no device here."""
    stats = device_stats(gpu_key, since_us)
    if stats is None:
        return None
    wanted = set(pids)
    per_pid: dict[int, float] = {}
    for p, u in stats.pid_util_pct:
        if p in wanted:
            per_pid[p] = max(per_pid.get(p, 0.0), u)
    return min(100.0, sum(per_pid.values()))
