"""A bounded HTTP GET of an engine's endpoint (its /metrics, its /health): the engine is a
program we run, not one we trust to answer in time or in size (core/host/budgets.py)."""

from __future__ import annotations

import time

import httpx

from .budgets import ENGINE_PROBE_DEADLINE_S, ENGINE_PROBE_MAX_BYTES


class ProbeError(Exception):
    """No usable answer: unreachable, too slow, too large."""


def new_client(deadline_s: float = ENGINE_PROBE_DEADLINE_S) -> httpx.Client:
    """The client of an engine's probes (per-read timeouts inside the deadline; no redirects)."""
    return httpx.Client(timeout=deadline_s, follow_redirects=False)


def get(
    client: httpx.Client,
    url: str,
    *,
    deadline_s: float = ENGINE_PROBE_DEADLINE_S,
    max_bytes: int = ENGINE_PROBE_MAX_BYTES,
) -> tuple[int, bytes]:
    """(status code, body) of GET `url` within `deadline_s` (checked between reads, each read
    bounded by the client's timeout) and `max_bytes`; ProbeError otherwise."""
    deadline = time.monotonic() + deadline_s
    try:
        with client.stream("GET", url) as r:
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ProbeError(f"reply from {url} larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ProbeError(f"reply from {url} took longer than {deadline_s:g} s")
            return r.status_code, bytes(body)
    except httpx.HTTPError as e:
        raise ProbeError(f"{url}: {e or type(e).__name__}") from None
