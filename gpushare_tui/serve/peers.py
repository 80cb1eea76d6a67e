"""`GET /gpu/peers[?gpu_key=K]`, pure: the whole report (`--once --json`'s, dashboard.report), or one
GPU's entry of it (the seed's `{gpu_key, period_ms, self, peers}` shape, spec §6, with the rest added)."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from ..core.host.errors import GpushareError
from ..core.registry.abi import validate_gpu_key
from ..dashboard.model import DashboardModel
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
