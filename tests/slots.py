"""Registry records and dashboard models built through the real core code, for unit tests."""

from __future__ import annotations

from gpushare_tui.core.observe.snapshot import GpuSnapshot, build_gpu_snapshot
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares

NOW = 1_800_000_000_000_000


def slot(
    i: int,
    weight: float,
    active: int = 1,
    pid: int | None = None,
    name: str = "",
    age_s: float = 0.1,
    busy: float = 0.5,
    now: int = NOW,
) -> abi.SlotRecord:
    return abi.SlotRecord(
        i,
        pid or 1000 + i,
        2,
        7,
        abi.to_f32(weight),
        active,
        now - int(age_s * 1e6),
        int(busy * 1e6),
        abi.encode_name(name or f"p{i}"),
    )


def snap(slots: list[abi.SlotRecord], now: int = NOW, key: str = "k") -> GpuSnapshot:
    return build_gpu_snapshot(key, f"/opencoti-gpu-{key}", slots, now)


def model_at(t_s: float, share_weights=(2, 1), tok=(None, None), key: str = "k", busy=None) -> DashboardModel:
    """One GPU `key` at NOW + t_s, managed peers with these weights, tok/s and busy fractions (0.5 each)."""
    now = NOW + int(t_s * 1e6)
    busy = busy or (0.5,) * len(share_weights)
    s = snap([slot(i, w, now=now, busy=b) for i, (w, b) in enumerate(zip(share_weights, busy))], now=now, key=key)
    rows = tuple(PeerRow(key, p, True, None, EngineInfo(tok_s=tok[p.slot])) for p in s.peers)
    return DashboardModel(now, (GpuView(s, None, rows, achieved_shares(rows)),))
