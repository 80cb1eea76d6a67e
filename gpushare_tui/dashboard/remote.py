"""Other hosts' segments, read from their `gpushare-tui serve` endpoints (`GET /gpu/peers`), read-only.

A host that cannot be read (unreachable, timeout, an HTTP error, JSON that is not a report) is an
error row naming the host, never a failure of the whole view. httpx is imported only here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import httpx

from ..core.errors import UsageError
from ..core.snapshot import GpuSnapshot, PeerSnapshot, SegmentProblem
from ..core.text import printable, printable_gpu
from .model import DashboardModel, GpuView, unmanaged_view

TIMEOUT_S = 2.0
MAX_REPORT_BYTES = 4 * 2**20
RETRY_S = 5.0  # a host that failed is asked again after this long (the view keeps its error row)


def parse_remote_url(text: str) -> str:
    """The base URL of a `serve` endpoint (`http://HOST:PORT`, https too, no trailing slash); UsageError otherwise."""
    try:
        u = urlsplit(text)
        u.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise UsageError(f"invalid --remote {text!r}: use http://HOST:PORT (a gpushare-tui serve endpoint)")
    return f"{u.scheme}://{u.netloc}{u.path.rstrip('/')}"


class RemoteError(Exception):
    """One line saying why a host could not be read."""


@dataclass(frozen=True)
class RemoteReport:
    host: str  # the base URL
    gpus: tuple[GpuSnapshot, ...] = ()
    errors: tuple[SegmentProblem, ...] = ()  # the remote host's own segment errors
    error: str | None = None  # why the host itself could not be read


def fetch(url: str, timeout_s: float = TIMEOUT_S, client: httpx.Client | None = None) -> RemoteReport:
    """One host's report; a RemoteReport with `error` set when it cannot be read (never raises)."""
    try:
        doc = _get(client, url + "/gpu/peers", timeout_s)
        ts = doc.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            ts = time.time()  # no usable timestamp in the reply: ours
        now_us = int(ts * 1e6)
        gpus = tuple(gpu_from_json(g, now_us) for g in _list(doc, "gpus"))
        errors = tuple(SegmentProblem(_str(e, "segment"), _str(e, "error")) for e in _list(doc, "errors"))
        return RemoteReport(url, gpus, errors)
    except RemoteError as e:
        return RemoteReport(url, error=str(e))


def _get(client: httpx.Client | None, url: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    try:
        c = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
        try:
            with c.stream("GET", url, timeout=timeout_s) as r:
                if r.status_code != 200:
                    raise RemoteError(f"HTTP {r.status_code} from {url}")
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_REPORT_BYTES:
                        raise RemoteError(f"reply larger than {MAX_REPORT_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise RemoteError(f"timeout after {timeout_s:g} s")
        finally:
            if client is None:
                c.close()
    except httpx.TimeoutException:
        raise RemoteError(f"timeout after {timeout_s:g} s") from None
    except httpx.HTTPError as e:
        raise RemoteError(f"unreachable: {e or type(e).__name__}") from None
    try:
        import json

        doc = json.loads(body)
    except ValueError:
        raise RemoteError("bad JSON: not a gpushare-tui serve reply") from None
    if not isinstance(doc, dict):
        raise RemoteError("bad JSON: not a gpushare-tui serve reply")
    return doc


def _list(d: object, key: str) -> list:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, list):
        raise RemoteError(f"bad JSON: {key!r} is not a list")
    return v


def _str(d: object, key: str) -> str:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, str):
        raise RemoteError(f"bad JSON: {key!r} is not a string")
    return v


def _opt_num(d: dict, key: str) -> float | None:
    """A finite number as the JSON has it (an int stays an int), None when absent or null."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    if not math.isfinite(v):
        raise RemoteError(f"bad JSON: {key!r} is not finite")
    return v


def _num(d: dict, key: str) -> float:
    v = _opt_num(d, key)
    if v is None:
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    return v


def _opt_int(d: dict, key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    return v


def _int(d: dict, key: str) -> int:
    v = _opt_int(d, key)
    if v is None:
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    return v


def _bool(d: dict, key: str) -> bool:
    v = d.get(key)
    if not isinstance(v, bool):
        raise RemoteError(f"bad JSON: {key!r} is not a boolean")
    return v


def peer_from_json(d: object) -> PeerSnapshot:
    if not isinstance(d, dict):
        raise RemoteError("bad JSON: a peer is not an object")
    win = d.get("window_us")
    window = None
    if win is not None:
        if not (isinstance(win, list) and len(win) == 2 and all(type(x) is int for x in win)):
            raise RemoteError("bad JSON: 'window_us' is not [start, end]")
        window = (win[0], win[1])
    return PeerSnapshot(
        slot=_int(d, "slot"),
        pid=_int(d, "pid"),
        name=_str(d, "name"),
        weight=_opt_num(d, "weight"),
        share_pct=float(_num(d, "share_pct")),
        window_us=window,
        busy_pct=float(_num(d, "busy_pct")),
        active=_bool(d, "active"),
        alive=_bool(d, "alive"),
        heartbeat_age_ms=_opt_num(d, "heartbeat_age_ms"),
        boot_us=_opt_int(d, "boot_us") or 0,
        achieved_pct=_opt_num(d, "achieved_pct"),
    )


def gpu_from_json(d: object, now_us: int = 0) -> GpuSnapshot:
    """A GpuSnapshot from one entry of a report's `gpus` (untrusted); RemoteError when malformed."""
    if not isinstance(d, dict):
        raise RemoteError("bad JSON: a gpu is not an object")
    mode = d.get("mode", "0000")
    try:
        mode_bits = int(mode, 8) if isinstance(mode, str) else 0
    except ValueError:
        mode_bits = 0
    owner, owner_uid = d.get("owner"), d.get("owner_uid")
    return GpuSnapshot(
        gpu_key=_str(d, "gpu_key"),
        segment=_str(d, "segment"),
        period_ms=_opt_int(d, "period_ms"),
        peers=tuple(peer_from_json(p) for p in _list(d, "peers")),
        now_us=now_us,
        owner=owner if isinstance(owner, str) else "",
        owner_uid=owner_uid if type(owner_uid) is int else -1,
        mode=mode_bits,
    )


def fetch_all(urls: Sequence[str], timeout_s: float = TIMEOUT_S) -> list[RemoteReport]:
    """Every host's report, asked at once (a slow host costs at most `timeout_s`), in the order given."""
    if not urls:
        return []
    with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
        with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            return list(pool.map(lambda u: fetch(u, timeout_s, client), urls))


def host_label(url: str) -> str:
    """How the dashboard names a host: its URL without the scheme (`10.0.0.5:9464`), host first, so a
    narrow GPU column still tells hosts apart."""
    return url.split("://", 1)[-1]


def host_view(r: RemoteReport) -> tuple[list[GpuView], list[SegmentProblem]]:
    """Dashboard views of one host: each GPU keyed `HOST:PORT/KEY` (its identity and its host column), its
    peers unmanaged (no admin action reaches another host); its errors, and the host's own, named by host."""
    views = []
    for g in r.gpus:
        views.append(unmanaged_view(printable_gpu(replace(g, gpu_key=f"{host_label(r.host)}/{g.gpu_key}"))))
    errors = [SegmentProblem(printable(f"{r.host} {e.segment}"), printable(e.error)) for e in r.errors]
    if r.error is not None:
        errors.append(SegmentProblem(r.host, printable(r.error)))
    return views, errors


class RemoteSource:
    """A `DataSource` merging the local one (if any) with remote hosts. A host that failed keeps its error
    row and is asked again after RETRY_S, so one dead host does not slow every refresh by the timeout."""

    def __init__(self, local, urls: Sequence[str], timeout_s: float = TIMEOUT_S) -> None:
        self.local = local
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self._failed: dict[str, tuple[RemoteReport, float]] = {}
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False)
        self._pool = ThreadPoolExecutor(max_workers=min(8, max(1, len(self.urls))))

    def prime(self) -> list[DashboardModel]:
        return []

    def forget_status(self, pid: int) -> None:
        if self.local is not None:
            self.local.forget_status(pid)

    def _reports(self) -> list[RemoteReport]:
        now = time.monotonic()
        due = [u for u in self.urls if self._failed.get(u, (None, 0.0))[1] <= now]
        fresh = dict(zip(due, self._pool.map(lambda u: fetch(u, self.timeout_s, self._client), due)))
        out = []
        for u in self.urls:
            r = fresh.get(u)
            if r is None:
                r = self._failed[u][0]
            elif r.error is not None:
                self._failed[u] = (r, now + RETRY_S)
            else:
                self._failed.pop(u, None)
            out.append(r)
        return out

    def collect(self) -> DashboardModel:
        base = self.local.collect() if self.local is not None else None
        gpus = list(base.gpus) if base else []
        errors = list(base.errors) if base else []
        for r in self._reports():
            v, e = host_view(r)
            gpus += v
            errors += e
        if base is not None:
            return replace(base, gpus=tuple(gpus), errors=tuple(errors))
        from ..core.clock import mono_us, wall_us

        return DashboardModel(wall_us(), tuple(gpus), tuple(errors), mono_us())

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        self._pool.shutdown(wait=False)
        self._client.close()
