"""Energy counters (NVML's device total, RAPL's package energy) and their deltas, pure except the readers.

An `EnergyReading` is one or more cumulative counters read at one instant (RAPL: one per CPU package,
each wrapping at its own range; NVML: the device's total since the driver loaded, which never wraps in
practice and resets when the driver reloads). `energy_delta_j` is the energy between two readings; None
when it cannot be known (a counter went back without a known range: a reset, or the set of counters
changed): that interval is not attributed, the next one is.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

POWERCAP_DIR = "/sys/class/powercap"
UJ_PER_J = 1e6
MJ_PER_J = 1e3


@dataclass(frozen=True)
class EnergyCounter:
    value_j: float  # cumulative
    range_j: float | None = None  # it wraps to 0 after this (RAPL's max_energy_range_uj); None: never wraps


@dataclass(frozen=True)
class EnergyReading:
    source: str  # "nvml" or "rapl": what `gpushare_gpu_idle_energy_joules_total` and the docs call it
    counters: tuple[EnergyCounter, ...]


def energy_delta_j(prev: EnergyReading, cur: EnergyReading) -> float | None:
    """Joules from `prev` to `cur`: each counter's rise, a wrap (below its previous value, range known)
    counted as rising through the range; None for a reset (below, no range) or other counters."""
    if prev.source != cur.source or len(prev.counters) != len(cur.counters):
        return None
    total = 0.0
    for a, b in zip(prev.counters, cur.counters):
        if b.value_j >= a.value_j:
            total += b.value_j - a.value_j
        elif b.range_j is not None and b.range_j > 0 and a.value_j <= b.range_j:
            total += b.range_j - a.value_j + b.value_j
        else:
            return None
    return total


def nvml_reading(energy_mj: int | None) -> EnergyReading | None:
    """NVML's nvmlDeviceGetTotalEnergyConsumption (mJ since the driver loaded; Volta and later) as a reading."""
    return None if energy_mj is None else EnergyReading("nvml", (EnergyCounter(energy_mj / MJ_PER_J),))


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read(64).strip())
    except (OSError, ValueError):
        return None


def rapl_package_zones(powercap_dir: str = POWERCAP_DIR) -> list[str]:
    """The top-level RAPL zones (`intel-rapl:N`, one per package; not their `intel-rapl:N:M` subzones)
    whose energy_uj this user can read (recent kernels make it root-only)."""
    zones = sorted(glob.glob(os.path.join(powercap_dir, "intel-rapl:*")))
    packages = [z for z in zones if os.path.basename(z).count(":") == 1]
    return [z for z in packages if _read_int(os.path.join(z, "energy_uj")) is not None]


class RaplReader:
    """The host's CPU package energy (every readable package's counter), for a CPU host's segments.
    `read()` is None when no package counter is readable (no RAPL, or root-only)."""

    def __init__(self, powercap_dir: str = POWERCAP_DIR) -> None:
        self.zones = rapl_package_zones(powercap_dir)
        self._ranges = {z: _read_int(os.path.join(z, "max_energy_range_uj")) for z in self.zones}

    def read(self) -> EnergyReading | None:
        counters = []
        for z in self.zones:
            uj = _read_int(os.path.join(z, "energy_uj"))
            if uj is None:
                return None
            rng = self._ranges[z]
            counters.append(EnergyCounter(uj / UJ_PER_J, None if rng is None else rng / UJ_PER_J))
        return EnergyReading("rapl", tuple(counters)) if counters else None


def split_energy(energy_j: float, busy_s: dict, interval_s: float) -> tuple[dict, float]:
    """Attribute `energy_j` spent over `interval_s` to the peers by their busy seconds `busy_s` over it
    (key -> s): each gets energy × busy ÷ max(interval, Σ busy), the idle fraction's share goes to idle.
    Σ busy beyond the interval (counters published at heartbeats arrive in lumps) splits it all."""
    busy = {k: max(0.0, v) for k, v in busy_s.items()}
    total = sum(busy.values())
    denom = max(interval_s, total)
    if denom <= 0:
        return {k: 0.0 for k in busy}, energy_j
    shares = {k: energy_j * v / denom for k, v in busy.items()}
    return shares, energy_j * (1.0 - total / denom)


class EnergySources:
    """The energy reading for one segment's refresh: NVML's device total for a GPU's key (its
    `energy_mj`, read with the device's stats), else the host's RAPL package energy when readable
    (a CPU host's keys: every such segment sees the whole package). None when neither exists."""

    def __init__(self, powercap_dir: str = POWERCAP_DIR) -> None:
        self._powercap_dir = powercap_dir
        self._rapl: RaplReader | None = None

    def __call__(self, gpu_key: str, energy_mj: int | None) -> EnergyReading | None:
        if energy_mj is not None:
            return nvml_reading(energy_mj)
        from .gpu import NVML_UUID_PREFIXES

        if gpu_key.startswith(NVML_UUID_PREFIXES):
            return None  # a GPU without the energy counter (before Volta, or not read this time)
        if self._rapl is None:
            self._rapl = RaplReader(self._powercap_dir)
        return self._rapl.read()
