"""Supervised engines: `run` (in the foreground) and `launch` (detached, core/engines/launcher.py)."""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, get_type_hints

import typer

from ..core.engines.declaration import (
    EngineSources,
    SourceOptions,
    check_class,
    check_launch,
    check_slo,
    resolve_sources,
)
from ..core.host.errors import EngineFinished, GpushareError, Interrupted, UsageError
from ..core.host.text import printable
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

if TYPE_CHECKING:
    from ..core.engines.launcher import LaunchSpec

# The engine's command line is everything from its program on, passed through untouched: our options come
# before it (an option after the program is the engine's: `run echo hello --weight 5` prints
# "hello --weight 5"); `--` before the program is optional (needed only where the program's name starts
# with `-`, or for engine arguments that are not UTF-8 text: cli/common.check_argv_text). An unknown option
# before the program is an error (exit 2), never taken for the engine's.
CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}
USAGE = "[OPTIONS] [--] COMMAND [ARGS]..."  # the usage line: the engine's command line follows our options
NO_ENGINE = "no engine command given (use: -- llama-server ARGS...)"


@dataclass(frozen=True)
class EngineOptions:
    """The options `run` and `launch` take, as given: their one option set (each field's typer option in its
    metadata; `with_engine_options` adds them to a command). `checked` validates them once, with the
    engine's command, into core's LaunchSpec (what launch_detached and the supervisor start): `up` and the
    launch form build that LaunchSpec too (`up` as `run`'s command line)."""

    weight: str = field(default="1", metadata={"option": WeightOpt})
    name: str | None = field(default=None, metadata={"option": EngineNameOpt})
    gpu_key: str | None = field(default=None, metadata={"option": GpuKeyOpt})
    gpu: int | None = field(default=None, metadata={"option": GpuIndexOpt})
    load_timeout: float = field(default=600.0, metadata={"option": LoadTimeoutOpt})
    share_group: str | None = field(default=None, metadata={"option": ShareGroupOpt})
    activity: str | None = field(default=None, metadata={"option": ActivityOpt})
    metrics_url: str | None = field(default=None, metadata={"option": MetricsUrlOpt})
    gauge: str | None = field(default=None, metadata={"option": GaugeOpt})
    cpu_cores: float | None = field(default=None, metadata={"option": CpuCoresOpt})
    health_url: str | None = field(default=None, metadata={"option": HealthUrlOpt})
    health_port: int | None = field(default=None, metadata={"option": HealthPortOpt})
    health_log: str | None = field(default=None, metadata={"option": HealthLogOpt})
    no_health: bool = field(default=False, metadata={"option": NoHealthOpt})
    klass: str = field(default="batch", metadata={"option": ClassOpt})
    no_proxy: bool = field(default=False, metadata={"option": NoProxyOpt})
    slo_ttft_p99_ms: str | None = field(default=None, metadata={"option": SloTtftOpt})
    slo_itl_p99_ms: str | None = field(default=None, metadata={"option": SloItlOpt})
    slo_weight_min: str | None = field(default=None, metadata={"option": SloWeightMinOpt})
    slo_weight_max: str | None = field(default=None, metadata={"option": SloWeightMaxOpt})
    slo_classes: str | None = field(default=None, metadata={"option": SloClassesOpt})

    def sources(self) -> SourceOptions:
        return SourceOptions(
            self.activity,
            self.metrics_url,
            self.gauge,
            self.cpu_cores,
            self.health_url,
            self.health_port,
            self.health_log,
            self.no_health,
        )

    def checked(self, engine_argv: Sequence[str]) -> tuple[LaunchSpec, EngineSources]:
        """The engine to start, once every option and its command are valid (core/engines/declaration.py): its
        LaunchSpec (the key resolved) and its resolved sources; else the first problem, a UsageError (one line,
        exit 2), or a GpuKeyError without such a GPU, before anything is started."""
        from ..core.engines.launcher import LaunchSpec

        share_group = checked_group(self.share_group)
        klass = check_class(self.klass, label="--class")
        if not engine_argv:
            raise UsageError(NO_ENGINE)
        w = check_launch(engine_argv, weight=self.weight, name=self.name, load_timeout_s=self.load_timeout)
        sources = resolve_sources(engine_argv, self.sources())
        key = resolve_key(self.gpu_key, self.gpu)
        _check_gpu_source(sources, key)
        slo = check_slo(
            self.slo_ttft_p99_ms, self.slo_itl_p99_ms, self.slo_weight_min, self.slo_weight_max, self.slo_classes
        )
        spec = LaunchSpec(
            tuple(engine_argv),
            key,
            w,
            name=self.name,
            load_timeout_s=self.load_timeout,
            share_group=share_group,
            sources=self.sources(),
            klass=klass,
            proxy=not self.no_proxy,
            slo=slo,
        )
        return spec, sources


def with_engine_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` (`def command(ctx, OWN OPTIONS..., **options)`) taking EngineOptions' options too: its signature,
    as typer reads it, is its own parameters then EngineOptions' fields (their options, in their order)."""
    own = [p for p in inspect.signature(command).parameters.values() if p.kind != p.VAR_KEYWORD]
    hints = get_type_hints(EngineOptions)
    shared = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["option"], annotation=hints[f.name]
        )
        for f in fields(EngineOptions)
    ]
    command.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
    return command


def _begin_log(log_path: str, name: str) -> None:
    """Mark this run's start in its log (moved aside first when long), and collect the older per-run logs of
    the same name beyond budgets.LOG_FILES_PER_NAME_MAX (core/host/logfiles.py)."""
    import time

    from ..core.host import logfiles
    from ..core.host.paths import file_name_part

    logfiles.begin_run(log_path, printable(name), os.getpid(), time.time())
    directory = os.path.dirname(log_path)
    logfiles.collect(directory, logfiles.family(f"{file_name_part(name)}-"))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@with_engine_options
def run(
    ctx: typer.Context,
    notify_fd: int | None = typer.Option(None, "--notify-fd", hidden=True),
    listen_fd: int | None = typer.Option(None, "--listen-fd", hidden=True),  # `up`'s listening socket
    **options: Any,
) -> None:
    """Run a paced engine in the foreground: gpushare-tui run --weight W llama-server ARGS... (or any command)

    Our options come first; the engine's command line is everything from its program on, passed to it
    untouched (`--` before it is optional).

    While the engine loads it says what it waits for every few seconds (on a terminal), and once
    when the engine is ready. SIGTERM, SIGINT or SIGHUP stops the engine and leaves the slot: during
    the start-up with one line and exit 128 + the signal's number, later with the engine's exit code
    (an engine that finishes with 0 before it was ready: exit 0).
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
        spec, sources = EngineOptions(**options).checked(ctx.args)
        sup = _start_supervisor(spec, sources, term.event, listen_socket=handed)
    except EngineFinished as e:  # it ran and ended well: no failure (a `launch` waiting on us hears of it)
        notify_failed(notify_fd, e)
        _say(f"gpushare-tui: {e}")
        raise typer.Exit(0) from None
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
    spec: LaunchSpec,
    sources: EngineSources,
    quit_event: threading.Event,
    *,
    listen_socket: socket.socket | None = None,
):
    """A Supervisor whose engine (`spec`, checked: EngineOptions.checked) is healthy and joined; GpushareError
    on any failure (nothing left running). `listen_socket`: the public port's, handed down (its address is the
    engine's public --host/--port)."""
    from ..core.engines import command, start
    from ..core.engines.kinds import kind
    from ..core.engines.supervisor import Supervisor
    from ..core.host.paths import file_name_part, state_dir
    from ..core.pacing.sockets import check_socket_dir
    from ..core.registry.ownership import Owner

    args, sources = start.prepare(kind(sources.kind), spec.engine_argv, sources, proxy=spec.proxy)
    if listen_socket is not None:
        args = _on_socket(args, listen_socket)
    name = spec.name or command.display_name(args)
    check_socket_dir()  # before the engine is started and loads its model
    log_path = os.path.join(state_dir(), f"{file_name_part(name)}-{args.port or os.getpid()}.log")
    _begin_log(log_path, name)
    if args.port_chosen:
        _say(f"gpushare-tui: engine port {args.port} on {args.host} (free port picked)")
    key = spec.gpu_key
    sup = Supervisor(
        args,
        gpu_key=key,
        weight=spec.weight,
        name=name,
        log_path=log_path,
        kind=sources.kind,
        activity_spec=sources.activity,
        health_spec=sources.health,
        load_timeout_s=spec.load_timeout_s,
        gpu_busy=_gpu_busy_for(key),
        say=_say,
        share_group=spec.share_group,
        owner=Owner.from_env(),
        quit_event=quit_event,
        klass=spec.klass,
        load_progress=WaitProgress(),
        seed_view=_seed_view_for(key),
        listen_socket=listen_socket,
        slo=spec.slo.governed(spec.weight) if spec.slo is not None else None,
    )
    if quit_event.is_set():  # a signal during the checks: nothing is started, and nothing said to be
        raise Interrupted(f"interrupted before {printable(args.argv[0])} was started (nothing is running)")
    _say(f"gpushare-tui: starting {printable(args.argv[0])} (log {printable(log_path)})")
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


@with_engine_options
def launch(
    ctx: typer.Context,
    as_json: bool = typer.Option(
        False, "--json", help='Print the result as one JSON object (on failure {"ok": false, "error": ...}).'
    ),
    **options: Any,
) -> None:
    """Start a supervised engine detached; returns once it is healthy (or failed).

    Our options come first; the engine's command line is everything from its program on, passed to it
    untouched (`--` before it is optional).

    SIGTERM, SIGINT (Ctrl+C) or SIGHUP before then stops what it started: one line, exit 128 + the
    signal's number.

    While the model loads it says what it waits for every few seconds (on a terminal), and once
    when the engine is ready (on stderr: --json's stdout stays one object)."""
    from ..core.engines.launcher import launch_detached
    from ..core.host.lifecycle import Termination, on_signals

    term = Termination()  # SIGTERM/SIGINT/SIGHUP while it waits: what was started is stopped
    on_signals(term)
    try:
        spec, _ = EngineOptions(**options).checked(ctx.args)
        reply = launch_detached(spec, progress=WaitProgress(), termination=term)
    except EngineFinished as e:  # it ran and ended well before it was ready (run exits 0 for it): no failure
        if as_json:
            print(json.dumps({"ok": True, "finished": str(e)}))
        _say(f"gpushare-tui: {e}")
        raise typer.Exit(0) from None
    except GpushareError as e:
        if as_json:  # a script reads stdout; the one line on stderr and the exit code follow as ever
            print(json.dumps({"ok": False, "error": str(e)}))
        raise
    print(json.dumps(reply.to_json()) if as_json else reply.summary())
