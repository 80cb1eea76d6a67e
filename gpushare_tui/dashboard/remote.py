"""Other hosts' segments, read from their `gpushare-tui serve` endpoints (`GET /gpu/peers`), read-only.

A remote host is untrusted: each fetch has an overall deadline (connect, status line, headers and body
together, not only per read), a byte cap, a JSON depth cap, and every value is checked against the spec's
ranges (core/host/budgets.py, docs/trust.md). A host that cannot be read or sends anything out of range is one
error row naming the host, never a failure, a freeze or a crash of the whole view. Fetches run on their own
event loop: the dashboard's local view never waits for a remote one. httpx is imported only here.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import httpx

from ..core.host.budgets import (
    REMOTE_DEADLINE_S,
    REMOTE_MAX_ERRORS,
    REMOTE_MAX_GPUS,
    REMOTE_MAX_JSON_DEPTH,
    REMOTE_MAX_REPLY_BYTES,
    REMOTE_MAX_TEXT_CHARS,
    REMOTE_RETRY_S,
)
from ..core.host.errors import GpushareError, UsageError
from ..core.host.text import printable
from ..core.observe.accounting import SOURCE_BUSY_PPM, SOURCE_COUNTER, GpuAccount, PeerAccount, owner_key
from ..core.observe.snapshot import GpuSnapshot, PeerSnapshot, SegmentProblem, printable_gpu, window_pcts
from ..core.registry import abi
from ..core.schedule.v1 import PERIOD_MAX_MS, PERIOD_MIN_MS
from .model import DashboardModel, GpuView, unmanaged_view

TIMEOUT_S = REMOTE_DEADLINE_S  # the name callers know
F32_MAX = 3.4028234663852886e38  # a weight is an f32 in the segment (docs/registry-abi.md §2)
PID_MAX = 2**32 - 1  # a u32 in the slot
I64_MAX = 2**63 - 1
TIMESTAMP_MAX_S = 2**33  # a Unix time in seconds (year 2242): larger is not a clock, and would overflow in µs


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
    accounts: tuple[GpuAccount, ...] = ()  # each GPU's peers' accounts as the host reported them (same order)
    errors: tuple[SegmentProblem, ...] = ()  # the remote host's own segment errors (and what we left out)
    error: str | None = None  # why the host itself could not be read


# -- fetching ---------------------------------------------------------------------------------------------


def new_client(deadline_s: float = REMOTE_DEADLINE_S) -> httpx.AsyncClient:
    """The client of every fetch (per-read timeouts inside the overall deadline; no redirects, no env proxies
    config beyond httpx's defaults)."""
    return httpx.AsyncClient(timeout=deadline_s, follow_redirects=False)


async def fetch_async(client: httpx.AsyncClient, url: str, deadline_s: float = REMOTE_DEADLINE_S) -> RemoteReport:
    """One host's report within `deadline_s` in all; a RemoteReport with `error` set otherwise (never raises)."""
    try:
        async with asyncio.timeout(deadline_s):
            body = await _get_body(client, url + "/gpu/peers")
    except TimeoutError:
        return RemoteReport(url, error=f"timeout after {deadline_s:g} s")
    except RemoteError as e:
        return RemoteReport(url, error=str(e))
    return parse_report(url, body)


async def _get_body(client: httpx.AsyncClient, url: str) -> bytes:
    try:
        async with client.stream("GET", url) as r:
            if r.status_code != 200:
                raise RemoteError(f"HTTP {r.status_code} from {url}")
            length = r.headers.get("content-length", "")
            if length.isdigit() and int(length) > REMOTE_MAX_REPLY_BYTES:
                raise RemoteError(f"reply larger than {REMOTE_MAX_REPLY_BYTES} bytes")
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > REMOTE_MAX_REPLY_BYTES:
                    raise RemoteError(f"reply larger than {REMOTE_MAX_REPLY_BYTES} bytes")
            return bytes(body)
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.HTTPError as e:
        raise RemoteError(f"unreachable: {e or type(e).__name__}") from None


async def _fetch_all_async(urls: Sequence[str], deadline_s: float) -> list[RemoteReport]:
    async with new_client(deadline_s) as client:
        return list(await asyncio.gather(*(fetch_async(client, u, deadline_s) for u in urls)))


def fetch_all(urls: Sequence[str], deadline_s: float = REMOTE_DEADLINE_S) -> list[RemoteReport]:
    """Every host's report, asked at once (all of them cost at most `deadline_s`), in the order given."""
    if not urls:
        return []
    return asyncio.run(_fetch_all_async(urls, deadline_s))


# -- parsing: untrusted JSON in, a valid report or an error out ---------------------------------------------

_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check_depth(body: bytes, max_depth: int = REMOTE_MAX_JSON_DEPTH) -> None:
    """RemoteError when `body` nests arrays/objects deeper than `max_depth` (or leaves them unbalanced):
    checked on the bytes, before a recursive parser sees them. Linear: strings are cut out, then innermost
    pairs are removed `max_depth` times."""
    skeleton = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not skeleton:
            return
        shorter = skeleton.replace(b"[]", b"").replace(b"{}", b"")
        if len(shorter) == len(skeleton):
            break  # unbalanced or mismatched: not JSON
        skeleton = shorter
    if skeleton:
        raise RemoteError(f"bad JSON: nested deeper than {max_depth} levels (or unbalanced)")


def load_json(body: bytes) -> dict:
    """The reply's top-level object (RemoteError otherwise): size and depth checked first."""
    if len(body) > REMOTE_MAX_REPLY_BYTES:
        raise RemoteError(f"reply larger than {REMOTE_MAX_REPLY_BYTES} bytes")
    check_depth(body)
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise RemoteError("bad JSON: not a gpushare-tui serve reply") from None
    if not isinstance(doc, dict):
        raise RemoteError("bad JSON: not a gpushare-tui serve reply")
    return doc


def parse_report(url: str, body: bytes, wall_s: Callable[[], float] = time.time) -> RemoteReport:
    """Host `url`'s report from its reply `body` (untrusted); never raises: an error report instead."""
    try:
        doc = load_json(body)
        ts = doc.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts <= TIMESTAMP_MAX_S:
            ts = wall_s()  # no usable timestamp in the reply (absent, NaN, 1e308): ours
        now_us = int(ts * 1e6)
        gpus_json, errors_json = _list(doc, "gpus"), _list(doc, "errors")
        gpus = tuple(gpu_from_json(g, now_us) for g in gpus_json[:REMOTE_MAX_GPUS])
        accounts = tuple(account_from_json(d, g) for d, g in zip(gpus_json, gpus))
        errors = [SegmentProblem(_str(e, "segment"), _str(e, "error")) for e in errors_json[:REMOTE_MAX_ERRORS]]
        if len(gpus_json) > REMOTE_MAX_GPUS:
            errors.append(
                SegmentProblem(
                    "", f"{len(gpus_json) - REMOTE_MAX_GPUS} more GPUs not shown (at most {REMOTE_MAX_GPUS} per host)"
                )
            )
        if len(errors_json) > REMOTE_MAX_ERRORS:
            errors.append(SegmentProblem("", f"{len(errors_json) - REMOTE_MAX_ERRORS} more errors not shown"))
        return RemoteReport(url, gpus, accounts, tuple(errors))
    except RemoteError as e:
        return RemoteReport(url, error=str(e))


def _list(d: object, key: str) -> list:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, list):
        raise RemoteError(f"bad JSON: {key!r} is not a list")
    return v


def _str(d: object, key: str) -> str:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, str):
        raise RemoteError(f"bad JSON: {key!r} is not a string")
    return v[:REMOTE_MAX_TEXT_CHARS]


def _opt_num(d: dict, key: str, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    """A number in [lo, hi] as the JSON has it (an int stays an int), None when absent or null."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    if not (math.isfinite(v) and lo <= v <= hi):
        raise RemoteError(f"bad JSON: {key!r} is out of range ({lo:g} to {hi:g})")
    return v


def _num(d: dict, key: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    v = _opt_num(d, key, lo, hi)
    if v is None:
        raise RemoteError(f"bad JSON: {key!r} is not a number")
    return v


def _opt_int(d: dict, key: str, lo: int, hi: int) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RemoteError(f"bad JSON: {key!r} is not an integer")
    if not lo <= v <= hi:
        raise RemoteError(f"bad JSON: {key!r} is out of range ({lo} to {hi})")
    return v


def _int(d: dict, key: str, lo: int, hi: int) -> int:
    v = _opt_int(d, key, lo, hi)
    if v is None:
        raise RemoteError(f"bad JSON: {key!r} is not an integer")
    return v


def _bool(d: dict, key: str) -> bool:
    v = d.get(key)
    if not isinstance(v, bool):
        raise RemoteError(f"bad JSON: {key!r} is not a boolean")
    return v


UID_MAX = 2**32 - 2  # (uid_t)-1 is no uid


def peer_from_json(d: object) -> PeerSnapshot:
    """One peer (untrusted): every value in the spec's range (RemoteError otherwise); its window is checked
    against the period by gpu_from_json."""
    if not isinstance(d, dict):
        raise RemoteError("bad JSON: a peer is not an object")
    win = d.get("window_us")
    window = None
    if win is not None:
        if not (isinstance(win, list) and len(win) == 2 and all(type(x) is int for x in win)):
            raise RemoteError("bad JSON: 'window_us' is not [start, end]")
        if not 0 <= win[0] <= win[1] <= PERIOD_MAX_MS * 1000:
            raise RemoteError("bad JSON: 'window_us' is not inside a period")
        window = (win[0], win[1])
    weight = _opt_num(d, "weight", 0, F32_MAX)
    if weight is not None and not abi.weight_is_valid(weight):
        raise RemoteError("bad JSON: 'weight' is not > 0")
    return PeerSnapshot(
        slot=_int(d, "slot", 0, abi.SLOT_COUNT - 1),
        pid=_int(d, "pid", 1, PID_MAX),
        name=_str(d, "name"),
        weight=weight,
        share_pct=float(_num(d, "share_pct", 0, 100)),
        window_us=window,
        busy_pct=float(_num(d, "busy_pct", 0, 100)),
        active=_bool(d, "active"),
        alive=_bool(d, "alive"),
        heartbeat_age_ms=_opt_num(d, "heartbeat_age_ms", 0, I64_MAX / 1000),
        boot_us=_opt_int(d, "boot_us", 0, I64_MAX) or 0,
        achieved_pct=_opt_num(d, "achieved_pct", 0, 100),
        window_pct=_opt_num(d, "window_pct", 0, 100),
        klass=d.get("class") if d.get("class") in ("interactive", "batch") else None,  # Extension 1: absent, null
        demand=_opt_flag(d, "demand"),
        priority=_opt_flag(d, "priority"),
        uid=_opt_int(d, "uid", 0, UID_MAX),  # Extension 2 (§8): absent or null for an older serve
        user=_opt_text(d, "user"),
        user_share_pct=_opt_num(d, "user_share_pct", 0, 100),
    )


def _opt_text(d: dict, key: str) -> str | None:
    """A string cut at REMOTE_MAX_TEXT_CHARS; None when absent, null or not a string."""
    v = d.get(key)
    return v[:REMOTE_MAX_TEXT_CHARS] if isinstance(v, str) else None


def _with_window_pcts(peers: tuple[PeerSnapshot, ...]) -> tuple[PeerSnapshot, ...]:
    """A report without `window_pct` (a C peer's /gpu/peers, an older gpushare-tui): the window shares its
    members' weights give (the members: peers with a share), as every peer computes them."""
    if any(p.window_pct is not None for p in peers):
        return peers
    members = sorted((p.slot, p.weight) for p in peers if p.share_pct > 0 and p.weight is not None)
    windows = window_pcts(members)
    return tuple(replace(p, window_pct=windows.get(p.slot)) for p in peers)


def _opt_flag(d: dict, key: str) -> bool | None:
    """An Extension 1 boolean (spec §7); None when absent, null or not a boolean (a v1 peer, an older serve)."""
    v = d.get(key)
    return v if isinstance(v, bool) else None


def account_from_json(d: dict, g: GpuSnapshot) -> GpuAccount:
    """The peers' accounts of one GPU entry `d` (already parsed as `g`): `busy_source`, `busy_total_s`,
    `energy_j` of each peer (untrusted: RemoteError when out of range; a peer without them has none)."""
    accounts = []
    for pd, p in zip(_list(d, "peers"), g.peers):
        source = pd.get("busy_source")
        if source not in (SOURCE_COUNTER, SOURCE_BUSY_PPM):
            continue
        busy = _opt_num(pd, "busy_total_s", 0, 2**64 / 1e6)  # busy_total_us is a u64
        energy = _opt_num(pd, "energy_j", 0)
        accounts.append((owner_key(p), PeerAccount(source, busy, energy)))
    return GpuAccount(tuple(accounts))


def gpu_from_json(d: object, now_us: int = 0) -> GpuSnapshot:
    """A GpuSnapshot from one entry of a report's `gpus` (untrusted); RemoteError when malformed or out of
    the spec's ranges: period 80–400 ms, at most SLOT_COUNT peers in distinct slots, windows inside the period."""
    if not isinstance(d, dict):
        raise RemoteError("bad JSON: a gpu is not an object")
    mode = d.get("mode", "0000")
    try:
        mode_bits = int(mode, 8) & 0o7777 if isinstance(mode, str) and len(mode) <= 6 else 0
    except ValueError:
        mode_bits = 0
    key = _str(d, "gpu_key")
    try:
        abi.validate_gpu_key(key)
    except GpushareError:
        raise RemoteError("bad JSON: 'gpu_key' is not a valid key") from None
    period_ms = _opt_int(d, "period_ms", PERIOD_MIN_MS, PERIOD_MAX_MS)
    peers_json = _list(d, "peers")
    if len(peers_json) > abi.SLOT_COUNT:
        raise RemoteError(f"bad JSON: more than {abi.SLOT_COUNT} peers in one segment")
    peers = _with_window_pcts(tuple(peer_from_json(p) for p in peers_json))
    if len({p.slot for p in peers}) != len(peers):
        raise RemoteError("bad JSON: two peers in one slot")
    for p in peers:
        if p.window_us is not None and (period_ms is None or p.window_us[1] > period_ms * 1000):
            raise RemoteError("bad JSON: a window outside the period")
    owner, owner_uid = d.get("owner"), d.get("owner_uid")
    return GpuSnapshot(
        gpu_key=key,
        segment=_str(d, "segment"),
        period_ms=period_ms,
        peers=peers,
        now_us=now_us,
        owner=owner[:REMOTE_MAX_TEXT_CHARS] if isinstance(owner, str) else "",
        owner_uid=owner_uid if type(owner_uid) is int and -1 <= owner_uid <= PID_MAX else -1,
        mode=mode_bits,
        schedule_mode=mode if (mode := d.get("schedule_mode")) in ("ext1", "priority") else "v1",
        v1_peer=v1 if type(v1 := d.get("v1_peer")) is int and 0 <= v1 < abi.SLOT_COUNT else None,
        users_applied=d.get("users_applied") is True,
        users_fallback=_opt_text(d, "users_fallback"),
    )


# -- the dashboard's view of remote hosts -------------------------------------------------------------------


def host_label(url: str) -> str:
    """How the dashboard names a host: its URL without the scheme (`10.0.0.5:9464`), host first, so a
    narrow GPU column still tells hosts apart."""
    return url.split("://", 1)[-1]


def host_view(r: RemoteReport) -> tuple[list[GpuView], list[SegmentProblem]]:
    """Dashboard views of one host: each GPU keyed `HOST:PORT/KEY` (its identity and its host column), its
    peers unmanaged (no admin action reaches another host); its errors, and the host's own, named by host."""
    views = []
    for i, g in enumerate(r.gpus):
        account = r.accounts[i] if i < len(r.accounts) else None
        views.append(unmanaged_view(printable_gpu(replace(g, gpu_key=f"{host_label(r.host)}/{g.gpu_key}")), account))
    errors = [SegmentProblem(printable(f"{r.host} {e.segment}".rstrip()), printable(e.error)) for e in r.errors]
    if r.error is not None:
        errors.append(SegmentProblem(r.host, printable(r.error)))
    return views, errors


class RemoteFetcher:
    """A daemon thread running an event loop on which every host's fetch runs, off the caller's thread:
    `submit(url)` returns at once; the report comes to `done(report)` (on the fetcher's thread)."""

    def __init__(self, deadline_s: float = REMOTE_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-fetch", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient = asyncio.run_coroutine_threadsafe(self._new_client(), self._loop).result()
        self._tasks: set[Future] = set()

    async def _new_client(self) -> httpx.AsyncClient:
        return new_client(self.deadline_s)

    def submit(self, url: str, done: Callable[[RemoteReport], None]) -> None:
        fut = asyncio.run_coroutine_threadsafe(fetch_async(self._client, url, self.deadline_s), self._loop)
        self._tasks.add(fut)

        def finished(f: Future) -> None:
            self._tasks.discard(f)
            if not f.cancelled():
                done(f.result())

        fut.add_done_callback(finished)

    def close(self) -> None:
        for f in list(self._tasks):
            f.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=1.0)
        except Exception:
            pass  # closing: nothing to report
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():
            self._loop.close()


class RemoteSource:
    """A `DataSource` merging the local one (if any) with remote hosts, whose fetches run on a RemoteFetcher:
    `collect` returns the local model at once with each host's latest report (none before its first), and
    asks each host again when due: `refresh_s` after its last fetch began, or REMOTE_RETRY_S after a failure
    (its error row stays meanwhile). `on_report` (if set) is called when a report arrives, e.g. to refresh."""

    def __init__(
        self,
        local,
        urls: Sequence[str],
        timeout_s: float = REMOTE_DEADLINE_S,
        refresh_s: float = 1.0,
        retry_s: float = REMOTE_RETRY_S,
    ) -> None:
        self.local = local
        self.urls = list(dict.fromkeys(urls))
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.on_report: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._latest: dict[str, RemoteReport] = {}
        self._due: dict[str, float] = {}  # monotonic s
        self._in_flight: set[str] = set()
        self._fetcher = RemoteFetcher(timeout_s) if self.urls else None

    def prime(self) -> list[DashboardModel]:
        return []

    def forget_status(self, pid: int) -> None:
        if self.local is not None:
            self.local.forget_status(pid)

    def _ask_due_hosts(self) -> None:
        if self._fetcher is None:
            return
        now = time.monotonic()
        with self._lock:
            due = [u for u in self.urls if u not in self._in_flight and self._due.get(u, 0.0) <= now]
            for u in due:
                self._in_flight.add(u)
                self._due[u] = now + self.refresh_s
        for u in due:
            self._fetcher.submit(u, self._arrived)

    def _arrived(self, r: RemoteReport) -> None:
        with self._lock:
            self._in_flight.discard(r.host)
            self._latest[r.host] = r
            if r.error is not None:
                self._due[r.host] = time.monotonic() + self.retry_s
        if self.on_report is not None:
            self.on_report()

    def reports(self) -> list[RemoteReport]:
        """Each host's latest report, in the order given (hosts not yet answered left out)."""
        with self._lock:
            return [self._latest[u] for u in self.urls if u in self._latest]

    def collect(self) -> DashboardModel:
        self._ask_due_hosts()
        base = self.local.collect() if self.local is not None else None
        gpus = list(base.gpus) if base else []
        errors = list(base.errors) if base else []
        for r in self.reports():
            v, e = host_view(r)
            gpus += v
            errors += e
        if base is not None:
            return replace(base, gpus=tuple(gpus), errors=tuple(errors))
        from ..core.host.clock import mono_us, wall_us

        return DashboardModel(wall_us(), tuple(gpus), tuple(errors), mono_us())

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        if self._fetcher is not None:
            self._fetcher.close()
