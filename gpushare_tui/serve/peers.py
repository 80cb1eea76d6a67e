"""`GET /gpu/peers[?gpu_key=K]`, pure: the whole report (`--once --json`'s, dashboard.report), or one
GPU's entry of it (the seed's `{gpu_key, period_ms, self, peers}` shape, spec §6, with the rest added)."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from ..core.host.errors import GpushareError
from ..core.observe.snapshot import SegmentsRead
from ..core.registry.abi import validate_gpu_key
from ..dashboard.model import DashboardModel, unmanaged_view
from ..dashboard.report import ReportData, gpu_json, report_json


def peers_reply(
    gpu_keys: list[str] | None, model: Callable[[], DashboardModel], hostname: str
) -> tuple[HTTPStatus, dict]:
    """Status and JSON body for the `gpu_key` query values `gpu_keys` (the last wins; none: the whole
    report of a fresh `model()`, from host `hostname`): 400 for an invalid key, 404 for an unknown one."""
    if not gpu_keys:
        return HTTPStatus.OK, report_json(ReportData.of_model(model(), hostname))
    try:
        key = validate_gpu_key(gpu_keys[-1])
    except GpushareError as e:
        return HTTPStatus.BAD_REQUEST, {"error": str(e)}
    view = model().gpu(key)
    if view is None:
        return HTTPStatus.NOT_FOUND, {"error": f"no segment for gpu_key {key!r} on this host"}
    return HTTPStatus.OK, gpu_json(view)


def engine_view(gpu_key: str, slot: int | None, read: SegmentsRead) -> dict:
    """A supervised engine's own GPU entry, for its port's `GET /gpu/peers` and its `/props`'s
    `opencoti.gpu_share` (spec §5, served by core/engines/front_proxy.py): the entry `?gpu_key=K` gives, of
    its segment as `read` (SegmentReader(gpu_key=...)), with `self` its own peer (the one in `slot`). Its
    peers are unmanaged: an engine's port answers anyone, for no one's control sockets."""
    g = next((g for g in read.gpus if g.gpu_key == gpu_key), None)
    if g is None:
        why = next((e.error for e in read.errors), "no segment")
        return {"gpu_key": gpu_key, "period_ms": None, "self": None, "peers": [], "error": why}
    return gpu_json(unmanaged_view(g), self_slot=slot)
