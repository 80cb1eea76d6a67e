"""The front proxy for every HTTP engine, not only llama-server: a vLLM, SGLang or TGI command, or any command that
declares its port (`--port N` in its command line) and shows it serves HTTP there (its readiness or metrics URL
is on that port: `--health-url`, `--metrics-url`, or up's `health`/`activity`), is started on ENGINE_HOST and a
free internal port, and the front proxy serves its public address, so its DEMAND is exact (each request's start
and end) and its latency is known (core/observe/latency.py). llama-server's own rewrite is
llama_server.prepare_args.

    args, sources = fronted_args(argv, sources, proxy=True)

Only the engine's host and port flags are changed (each kind's `host_flag` in its record, core/engines/kinds.py;
`--port` for all), and a readiness or metrics URL on its public address (the presets'
`http://127.0.0.1:PORT/...`, or one given) is moved to the internal one: the proxy answers /health 503 until
the engine is ready, and the listener check wants the engine's own tree there. A command without a port of its
own, or with no HTTP probe on it, is not fronted (the activity source stays its DEMAND: a gauge, CPU readings)."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

from . import command
from .declaration import PORT_FLAG, EngineSources, flag_value
from .kinds import LLAMA_SERVER
from .kinds import kind as kind_record
from .llama_server import ENGINE_HOST, _without, free_port

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"})


def fronted_args(
    argv: list[str], sources: EngineSources, *, proxy: bool = True
) -> tuple[command.EngineArgs, EngineSources]:
    """The command to start and its sources: fronted (EngineArgs.upstream set) when `proxy` and the engine is an
    HTTP engine whose port is known (a kind with a `host_flag`; a command giving `--port` and an HTTP probe on
    it); else as given (command.prepare)."""
    known_flag = kind_record(sources.kind).host_flag  # a kind whose flags for where it listens we know
    fronted = known_flag is not None or (sources.kind != LLAMA_SERVER and _speaks_http(sources))
    if not proxy or sources.port is None or not fronted:
        return command.prepare(argv, sources.port), sources
    host_flag, default_host = known_flag or ("--host", command.HOST_DEFAULT)
    host = flag_value(argv, host_flag) or default_host
    inner = free_port(ENGINE_HOST)
    while inner == sources.port:  # a port just closed may be handed out again
        inner = free_port(ENGINE_HOST)
    upstream = (ENGINE_HOST, inner)
    given_host = flag_value(argv, host_flag) is not None
    out = _without(list(argv), (host_flag, PORT_FLAG))
    if known_flag is not None or given_host:  # an unknown command's host flag is moved only when it gives one
        out += [host_flag, ENGINE_HOST]
    out += [PORT_FLAG, str(inner)]
    args = command.EngineArgs(tuple(out), host, sources.port, None, False, upstream)
    moved = replace(
        sources,
        activity=replace(sources.activity, metrics_url=retarget(sources.activity.metrics_url, sources.port, upstream)),
        health=replace(sources.health, url=retarget(sources.health.url, sources.port, upstream)),
    )
    if moved.health.kind == "tcp" and moved.health.port == sources.port:
        moved = replace(moved, health=replace(moved.health, port=inner))
    return args, moved


def _speaks_http(sources: EngineSources) -> bool:
    """Whether a command of no known kind serves HTTP on its `--port` (sources.port): its readiness URL or its
    metrics URL is there. A command's `--port` alone may be anything (a gRPC server, a training job's rendezvous
    port): an HTTP proxy in front of it would break it."""
    urls = (sources.health.url if sources.health.kind == "http" else None, sources.activity.metrics_url)
    return sources.port is not None and any(u is not None and retarget(u, sources.port, ("", 0)) != u for u in urls)


def retarget(url: str | None, public_port: int, upstream: tuple[str, int]) -> str | None:
    """`url` moved to `upstream` when it is on this host's `public_port`; else as it was."""
    if url is None:
        return None
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return url
    if parts.hostname not in LOCAL_HOSTS or port != public_port:
        return url
    return urlunsplit(parts._replace(netloc=f"{upstream[0]}:{upstream[1]}"))
