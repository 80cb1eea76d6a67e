"""The JSON of `GET /gpu/peers`: the seed's per-GPU shape (spec §6), or the `--once --json` document."""

from __future__ import annotations

from ..core.snapshot import GpuSnapshot, report_to_json
from ..dashboard.model import DashboardModel

SEED_PEER_FIELDS = ("slot", "pid", "name", "weight", "share_pct", "busy_pct", "active", "alive", "heartbeat_age_ms")


def seed_peers(g: GpuSnapshot) -> dict:
    """`{gpu_key, period_ms, self: null, peers: [...]}` as a seed engine answers it (self is null: an observer)."""
    peers = [{f: getattr(p, f) for f in SEED_PEER_FIELDS} for p in g.peers]  # weight: None unless finite
    return {"gpu_key": g.gpu_key, "period_ms": g.period_ms, "self": None, "peers": peers}


def whole_report(model: DashboardModel) -> dict:
    """The `--once --json` document of `model` (every segment served, and the ones that failed)."""
    return report_to_json([g.snapshot for g in model.gpus], list(model.errors), model.now_us)
