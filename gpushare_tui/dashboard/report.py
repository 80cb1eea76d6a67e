"""The JSON report: one builder for `--once --json`, `serve`'s `GET /gpu/peers` (the whole report, and
one GPU's entry for `?gpu_key=K`) and what `--remote` reads back (`dashboard.remote` parses it).

Pure: the host name, the time and the hosts the GPUs and errors belong to are parameters. Changes only
add keys (scripts read it); a GPU's entry keeps the seed's `{gpu_key, period_ms, self, peers}` and each
peer the seed's fields (docs/registry-abi.md §6), so a seed reader takes `?gpu_key=K` as a seed engine's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..core.observe.snapshot import SegmentProblem, UserSnapshot
from .model import DashboardModel, GpuView, PeerRow

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReportData:
    """What one report is made of: GPU views and segment errors, each with the host it belongs to (None:
    not named, a report of one host; else this host's name or a `serve` endpoint's URL). Text as read."""

    hostname: str  # this host's
    now_us: int  # the report's timestamp (wall clock)
    views: Sequence[tuple[str | None, GpuView]] = ()
    errors: Sequence[tuple[str | None, SegmentProblem]] = ()
    foreign_not_shown: int = 0  # this host's segments of other users not read (over the cap or the time budget)
    foreign_shown_max: int | None = None  # that cap (None: none, --all-owners)

    @classmethod
    def of_model(cls, model: DashboardModel, hostname: str, host: str | None = None) -> ReportData:
        """The report of one host's `model`, its GPUs and errors named `host`."""
        return cls(
            hostname,
            model.now_us,
            [(host, g) for g in model.gpus],
            [(host, e) for e in model.errors],
            model.foreign_not_shown,
            model.foreign_shown_max,
        )


def _json_number(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def engine_json(row: PeerRow) -> dict | None:
    """A managed engine's `engine` object (what its control socket said; null fields unknown, `error` why
    it did not answer); None for a foreign peer, a dead one, or another host's."""
    e = row.engine
    if not (row.managed and row.peer.alive) or e is None:
        return None
    return {
        "state": e.state,
        "tok_s": e.tok_s,
        "solo_tok_s": e.solo_tok_s,
        "speed_pct": row.speed_pct,  # null while idle
        "model": e.model,
        "port": e.port,
        "kind": e.kind,
        "activity": e.activity,
        "log": e.log,
        "error": e.error,
        "latency": latency_json(e.latency),
        "slo": None if e.slo is None else _finite(asdict(e.slo)),
    }


LATENCY_JSON_LEFT_OUT = ("ttft_hist", "itl_hist", "e2e_hist")  # Prometheus material: `serve`'s /metrics has them


def latency_json(latency: object) -> dict | None:
    """A managed engine's `latency` (core.observe.latency.LatencyReport): the last minute's p50/p99 (ms), requests
    and rate, what is in flight and the counters by status; null when the engine reports none (no front proxy).
    The cumulative histograms are left out (LATENCY_JSON_LEFT_OUT)."""
    if latency is None:
        return None
    doc = asdict(latency)  # type: ignore[call-overload]
    return _finite({k: v for k, v in doc.items() if k not in LATENCY_JSON_LEFT_OUT})


def _finite(doc: dict) -> dict:
    """`doc` with its non-finite floats null (the report is JSON without NaN)."""
    return {k: _json_number(v) if isinstance(v, float) else v for k, v in doc.items()}


def account_json(row: PeerRow) -> dict:
    """A peer's accounting (core.accounting): `busy_total_s` (busy seconds: since it joined for source
    "counter", since this reader first saw it for "busy_ppm"), `busy_source`, `energy_j` (attributed since
    this reader first saw it); null when unknown (a single `--once` knows no energy interval)."""
    a = row.account
    if a is None:
        return {"busy_total_s": None, "busy_source": None, "energy_j": None}
    return {"busy_total_s": _json_number(a.busy_s), "busy_source": a.source, "energy_j": _json_number(a.energy_j)}


def peer_json(row: PeerRow) -> dict:
    """One peer: its snapshot's fields (NaN/inf weights null), `managed` and `engine` (engine_json)."""
    p = row.peer
    d = {"class" if k == "klass" else k: v for k, v in asdict(p).items()}  # `class`: a Python keyword
    del d["busy_total_us"]  # the slot's raw Extension 1 counter: account_json says what it means
    d["weight"] = _json_number(p.weight)
    d["window_us"] = list(p.window_us) if p.window_us else None
    d["achieved_pct"] = _json_number(p.achieved_pct)
    d["window_pct"] = _json_number(p.window_pct)  # after share_pct's w ÷ Σw: the share the floor gives (or null)
    d.update(account_json(row))
    d["managed"] = row.managed  # has our control socket (this user's engines on this host only)
    d["engine"] = engine_json(row)
    return d


def user_json(u: UserSnapshot) -> dict:
    """One user of a GPU (spec §8): uid, name, engines, window share, user share, achieved and busy (%)."""
    return {
        "uid": u.uid,
        "user": u.user,
        "engines": u.engines,
        "share_pct": _json_number(u.share_pct),
        "user_share_pct": _json_number(u.user_share_pct),
        "achieved_pct": _json_number(u.achieved_pct),
        "busy_pct": _json_number(u.busy_pct),
    }


def gpu_json(view: GpuView, host: str | None = None, self_slot: int | None = None) -> dict:
    """One GPU's entry (the body of `/gpu/peers?gpu_key=K`), with `host` when named; `self` is the peer in
    `self_slot` (an engine's own port answers for it), else null (an observer's)."""
    g = view.snapshot
    peers = [peer_json(r) for r in view.rows]
    doc = {
        "gpu_key": g.gpu_key,
        "segment": g.segment,
        "period_ms": g.period_ms,
        "self": next((p for r, p in zip(view.rows, peers) if r.peer.slot == self_slot), None),  # spec §6
        "peers": peers,
        "owner": g.owner,
        "owner_uid": g.owner_uid,
        "mode": f"{g.mode:04o}",
        "writable_by_others": g.writable_by_others,
        "schedule_mode": g.schedule_mode,  # "v1" | "ext1" | "priority" (spec §7, schedule_ext1.decide)
        "v1_peer": g.v1_peer,  # the slot that puts everyone on §5, or null
        # Extension 2 (spec §8): the user shares are in force, or why not (null: no members, nothing to say)
        "users_applied": g.users_applied,
        "users_fallback": g.users_fallback,
        "users": [user_json(u) for u in g.users],
    }
    return doc if host is None else {**doc, "host": host}


def report_json(data: ReportData) -> dict:
    """The whole report: `--once --json`, and `GET /gpu/peers` without a key."""
    return {
        "schema_version": SCHEMA_VERSION,
        "hostname": data.hostname,
        "timestamp": data.now_us / 1e6,
        "gpus": [gpu_json(v, host) for host, v in data.views],
        "errors": [
            {"segment": e.segment, "error": e.error, **({} if host is None else {"host": host})}
            for host, e in data.errors
        ],
        # this host's segments of other users left out (`--all-owners` shows them), and the cap
        "foreign_segments_not_shown": data.foreign_not_shown,
        "foreign_segments_shown_max": data.foreign_shown_max,
    }
