"""Supervised engines: `run` (in the foreground) and `launch` (detached, core/engines/launcher.py)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from dataclasses import replace

import typer

from ..core.engines.declaration import (
    EngineSources,
    SloDecl,
    SourceOptions,
    check_class,
    check_launch,
    check_slo,
    resolve_sources,
)
from ..core.host.errors import GpushareError, Interrupted, UsageError
from .common import WaitProgress, checked_group, resolve_key
from .options import (
    ActivityOpt,
    ClassOpt,
    CpuCoresOpt,
    EngineNameOpt,
    GaugeOpt,
    GpuIndexOpt,
    GpuKeyOpt,
    HealthLogOpt,
    HealthPortOpt,
    HealthUrlOpt,
    LoadTimeoutOpt,
    MetricsUrlOpt,
    NoHealthOpt,
    NoProxyOpt,
    ShareGroupOpt,
    SloClassesOpt,
    SloItlOpt,
    SloTtftOpt,
    SloWeightMaxOpt,
    SloWeightMinOpt,
    WeightOpt,
)

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}  # the engine's own arguments follow `--`
USAGE = "[OPTIONS] -- COMMAND [ARGS]..."  # the usage line: the engine's command line follows `--`
NO_ENGINE = "no engine command given (use: -- llama-server ARGS...)"


def _sources(
    activity: str | None,
    metrics_url: str | None,
    gauge: str | None,
    cpu_cores: float | None,
    health_url: str | None,
    health_port: int | None,
    health_log: str | None,
    no_health: bool,
) -> SourceOptions:
    return SourceOptions(activity, metrics_url, gauge, cpu_cores, health_url, health_port, health_log, no_health)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    ctx: typer.Context,
    weight: str = WeightOpt,
    name: str | None = EngineNameOpt,
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    load_timeout: float = LoadTimeoutOpt,
    notify_fd: int | None = typer.Option(None, "--notify-fd", hidden=True),
    listen_fd: int | None = typer.Option(None, "--listen-fd", hidden=True),  # `up`'s listening socket
    share_group: str | None = ShareGroupOpt,
    activity: str | None = ActivityOpt,
    metrics_url: str | None = MetricsUrlOpt,
    gauge: str | None = GaugeOpt,
    cpu_cores: float | None = CpuCoresOpt,
    health_url: str | None = HealthUrlOpt,
    health_port: int | None = HealthPortOpt,
    health_log: str | None = HealthLogOpt,
    no_health: bool = NoHealthOpt,
    klass: str = ClassOpt,
    no_proxy: bool = NoProxyOpt,
    slo_ttft_p99_ms: str | None = SloTtftOpt,
    slo_itl_p99_ms: str | None = SloItlOpt,
    slo_weight_min: str | None = SloWeightMinOpt,
    slo_weight_max: str | None = SloWeightMaxOpt,
    slo_classes: str | None = SloClassesOpt,
) -> None:
    """Run a paced engine in the foreground: gpushare-tui run --weight W -- llama-server ARGS... (or any command)

    While the engine loads it says what it waits for every few seconds (on a terminal), and once
    when the engine is ready. SIGTERM, SIGINT or SIGHUP stops the engine and leaves the slot: during
    the start-up with one line and exit 128 + the signal's number, later with the engine's exit code.
    A listening socket passed by systemd (LISTEN_FDS, a .socket unit: deploy/) is the public port."""
    from ..core.engines.spawn import notify_failed, notify_ready
    from ..core.host.lifecycle import Termination, on_signals

    # First of all: from here on a SIGTERM/SIGINT/SIGHUP stops us in order (nothing started, or the
    # engine ended and the slot left), never kills us half-way.
    term = Termination()
    on_signals(term)
    try:
        from ..core.host import listen_fds

        # systemd's variables are read (and removed) even when --listen-fd is given: the engine never sees them
        handed = listen_fds.from_systemd()
        if listen_fd is not None:
            if handed is not None:
                handed.close()
            handed = listen_fds.listening_socket(listen_fd, "--listen-fd")
        opts = _sources(activity, metrics_url, gauge, cpu_cores, health_url, health_port, health_log, no_health)
        slo = check_slo(slo_ttft_p99_ms, slo_itl_p99_ms, slo_weight_min, slo_weight_max, slo_classes)
        sup = _start_supervisor(
            ctx.args,
            weight,
            name,
            gpu_key,
            gpu,
            load_timeout,
            share_group,
            opts,
            term.event,
            klass,
            not no_proxy,
            listen_socket=handed,
            slo=slo,
        )
    except GpushareError as e:
        if isinstance(e, Interrupted):
            e.signum = term.signum  # its exit code: 128 + the signal's
        notify_failed(notify_fd, e)  # `launch` shows it (our stderr goes to a log there)
        raise
    assert sup.proc is not None and sup.membership is not None
    notify_ready(
        notify_fd,
        engine_pid=sup.proc.pid,
        port=sup.args.port,
        host=sup.args.host,
        log=sup.log_path,
        slot=sup.membership.slot,
    )
    code = sup.run()
    _say(f"gpushare-tui: engine {sup.proc.pid} exited with code {code}")
    raise typer.Exit(code)


def _start_supervisor(
    engine_argv: list[str],
    weight: str,
    name: str | None,
    gpu_key: str | None,
    gpu: int | None,
    load_timeout: float,
    share_group: str | None,
    opts: SourceOptions,
    quit_event: threading.Event,
    klass: str = "batch",
    proxy: bool = True,
    listen_socket: socket.socket | None = None,
    slo: SloDecl | None = None,
):
    """A Supervisor whose engine is healthy and joined; GpushareError on any failure (nothing left running).
    `listen_socket`: the public port's, handed down (its address is the engine's public --host/--port)."""
    from ..core.engines import command
    from ..core.engines import llama_server as ls
    from ..core.engines.fronted import fronted_args
    from ..core.engines.supervisor import Supervisor
    from ..core.host.paths import file_name_part, state_dir
    from ..core.pacing.sockets import check_socket_dir
    from ..core.registry.ownership import Owner

    share_group = checked_group(share_group)
    klass = check_class(klass, label="--class")
    w, sources = _checked(engine_argv, weight, name, load_timeout, opts)
    key = resolve_key(gpu_key, gpu)
    _check_gpu_source(sources, key)
    llama = sources.kind == "llama-server"
    if llama:
        args = ls.prepare_args(engine_argv, proxy=proxy)
    else:  # an HTTP engine whose port is known is fronted too
        args, sources = fronted_args(engine_argv, sources, proxy=proxy)
    if listen_socket is not None:
        args = _on_socket(args, listen_socket)
    name = name or command.display_name(args)
    check_socket_dir()  # before the engine is started and loads its model
    log_path = os.path.join(state_dir(), f"{file_name_part(name)}-{args.port or os.getpid()}.log")
    if args.port_chosen:
        _say(f"gpushare-tui: engine port {args.port} on {args.host} (free port picked)")
    sup = Supervisor(
        args,
        gpu_key=key,
        weight=w,
        name=name,
        log_path=log_path,
        kind=sources.kind,
        activity_spec=sources.activity,
        health_spec=sources.health,
        load_timeout_s=load_timeout,
        gpu_busy=_gpu_busy_for(key),
        say=_say,
        share_group=share_group,
        owner=Owner.from_env(),
        quit_event=quit_event,
        klass=klass,
        load_progress=WaitProgress(),
        seed_view=_seed_view_for(key),
        listen_socket=listen_socket,
        slo=slo.governed(w) if slo is not None else None,
    )
    _say(f"gpushare-tui: starting {args.argv[0]} (log {log_path})")
    sup.start()
    return sup


def _on_socket(args, sock: socket.socket):
    """`args` served on a listening socket handed down: its address is the public one (a --port given must be
    its port); UsageError when nothing would serve it (no front proxy)."""
    from ..core.host.listen_fds import address

    if args.upstream is None:
        raise UsageError(
            "a listening socket handed down (LISTEN_FDS, --listen-fd) is served by the front proxy:"
            " an HTTP engine whose port is known (llama-server, vLLM, SGLang, TGI, a command giving --port"
            " and an HTTP probe on it),"
            " without --no-proxy"
        )
    host, port = address(sock)
    if not args.port_chosen and args.port != port:
        raise UsageError(f"--port {args.port}: the listening socket handed down is on port {port}")
    return replace(args, host=host, port=port, port_chosen=False)


def _checked(
    engine_argv: list[str], weight: str, name: str | None, load_timeout: float, opts: SourceOptions
) -> tuple[float, EngineSources]:
    """The weight and sources of the engine to start, once its declaration is valid (core/engines/declaration.py);
    else its first problem, a UsageError (one line, exit 2), before anything is started."""
    if not engine_argv:
        raise UsageError(NO_ENGINE)
    w = check_launch(engine_argv, weight=weight, name=name, load_timeout_s=load_timeout)
    return w, resolve_sources(engine_argv, opts)


def _check_gpu_source(sources: EngineSources, key: str) -> None:
    """`--activity gpu` reads NVML for the key's device: a UsageError (exit 2) where there is none."""
    from ..core.observe import gpu

    if sources.activity.source == "gpu" and gpu.device_stats(key) is None:
        raise UsageError(
            f"--activity gpu needs NVML and a GPU (key {key} is no NVIDIA device here): use --activity cpu or metrics"
        )


def _seed_view_for(key: str):
    """The engine's GPU entry given its slot, read afresh from its segment (serve.peers.engine_view)."""
    from ..core.host.clock import wall_us
    from ..core.observe.snapshot import SegmentReader
    from ..serve.peers import engine_view

    return lambda slot: engine_view(key, slot, SegmentReader(gpu_key=key).read_all(wall_us()))


def _gpu_busy_for(key: str):
    """NVML utilisation of a process tree when the key is a real device, else None (CPU time is used)."""
    from ..core.observe import gpu

    if gpu.device_stats(key) is None:
        return None
    return lambda pids, since_us: gpu.pids_util_pct(key, pids, since_us)


def launch(
    ctx: typer.Context,
    weight: str = WeightOpt,
    name: str | None = EngineNameOpt,
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    load_timeout: float = LoadTimeoutOpt,
    as_json: bool = typer.Option(
        False, "--json", help='Print the result as one JSON object (on failure {"ok": false, "error": ...}).'
    ),
    share_group: str | None = ShareGroupOpt,
    activity: str | None = ActivityOpt,
    metrics_url: str | None = MetricsUrlOpt,
    gauge: str | None = GaugeOpt,
    cpu_cores: float | None = CpuCoresOpt,
    health_url: str | None = HealthUrlOpt,
    health_port: int | None = HealthPortOpt,
    health_log: str | None = HealthLogOpt,
    no_health: bool = NoHealthOpt,
    klass: str = ClassOpt,
    no_proxy: bool = NoProxyOpt,
    slo_ttft_p99_ms: str | None = SloTtftOpt,
    slo_itl_p99_ms: str | None = SloItlOpt,
    slo_weight_min: str | None = SloWeightMinOpt,
    slo_weight_max: str | None = SloWeightMaxOpt,
    slo_classes: str | None = SloClassesOpt,
) -> None:
    """Start a supervised engine detached; returns once it is healthy (or failed).

    SIGTERM, SIGINT (Ctrl+C) or SIGHUP before then stops what it started: one line, exit 128 + the
    signal's number.

    While the model loads it says what it waits for every few seconds (on a terminal), and once
    when the engine is ready (on stderr: --json's stdout stays one object)."""
    from ..core.engines.launcher import LaunchSpec, launch_detached
    from ..core.host.lifecycle import Termination, on_signals

    term = Termination()  # SIGTERM/SIGINT/SIGHUP while it waits: what was started is stopped
    on_signals(term)
    try:
        share_group = checked_group(share_group)
        opts = _sources(activity, metrics_url, gauge, cpu_cores, health_url, health_port, health_log, no_health)
        klass = check_class(klass, label="--class")
        w, sources = _checked(ctx.args, weight, name, load_timeout, opts)
        key = resolve_key(gpu_key, gpu)
        _check_gpu_source(sources, key)
        spec = LaunchSpec(tuple(ctx.args), key, w, name=name, load_timeout_s=load_timeout, share_group=share_group)
        slo = check_slo(slo_ttft_p99_ms, slo_itl_p99_ms, slo_weight_min, slo_weight_max, slo_classes)
        spec = replace(spec, sources=opts, klass=klass, proxy=not no_proxy, slo=slo)
        reply = launch_detached(spec, progress=WaitProgress(), termination=term)
    except GpushareError as e:
        if as_json:  # a script reads stdout; the one line on stderr and the exit code follow as ever
            print(json.dumps({"ok": False, "error": str(e)}))
        raise
    print(json.dumps(reply.to_json()) if as_json else reply.summary())
