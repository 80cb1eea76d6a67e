"""Engine commands: run / launch (supervised llama-server), status / weight / stop (control socket)."""

from __future__ import annotations

import json
import os
import signal
import sys

import typer

from .cli import (
    ExitCode,
    GpuIndexOpt,
    GpuKeyOpt,
    ShareGroupOpt,
    app,
    checked_group,
    checked_weight,
    fail,
    resolve_key,
)

ENGINE_CTX = {"allow_extra_args": True, "ignore_unknown_options": True}


def _log_path(name: str, port: int) -> str:
    from .core.control import state_dir

    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]
    return os.path.join(state_dir(), f"{safe}-{port}.log")


@app.command(context_settings=ENGINE_CTX)
def run(
    ctx: typer.Context,
    weight: str = typer.Option("1", "--weight", help="Share weight (finite, > 0)."),
    name: str | None = typer.Option(None, "--name", help="Display name (default: the model file's stem)."),
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    load_timeout: float = typer.Option(600.0, "--load-timeout", help="Seconds to wait for /health 200."),
    notify_fd: int | None = typer.Option(None, "--notify-fd", hidden=True),
    share_group: str | None = ShareGroupOpt,
) -> None:
    """Run a paced engine in the foreground: gpushare-tui run --weight W -- llama-server ARGS..."""
    from .core.engines import llama_server as ls
    from .core.launcher import notify_failed, notify_ready
    from .core.supervisor import Supervisor

    def refuse(msg: str, code: ExitCode = ExitCode.ERROR, tail: str = "") -> None:
        notify_failed(notify_fd, ls.EngineError(msg, tail))
        if tail:
            print(f"gpushare-tui: {msg}\n--- last lines of the engine log ---\n{tail}", file=sys.stderr)
            raise typer.Exit(int(code))
        fail(msg, code)

    w = checked_weight(weight)
    key = resolve_key(gpu_key, gpu)
    share_group = checked_group(share_group)
    try:
        args = ls.prepare_args(list(ctx.args))
        ls.resolve_binary(args.argv[0])
    except ls.EngineError as e:
        refuse(str(e), ExitCode.USAGE if not ctx.args else ExitCode.ERROR)
    from .core.control import ControlError, check_socket_dir

    name = name or ls.model_stem(args)
    try:
        check_socket_dir()  # before the engine is started and loads its model
        log_path = _log_path(name, args.port)
    except ControlError as e:
        refuse(str(e))
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.port_chosen:
        say(f"gpu-share: engine port {args.port} on {args.host} (free port picked)")
    sup = Supervisor(
        args,
        gpu_key=key,
        weight=w,
        name=name,
        log_path=log_path,
        load_timeout_s=load_timeout,
        gpu_busy=_gpu_busy_for(key),
        say=say,
        share_group=share_group,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: sup.request_stop())
    say(f"gpu-share: starting {args.argv[0]} (log {log_path})")
    try:
        sup.start()
    except ls.EngineError as e:
        refuse(str(e), tail=e.log_tail)
    except Exception as e:  # registry full, bad segment, ...
        refuse(str(e))
    notify_ready(
        notify_fd,
        engine_pid=sup.proc.pid,
        port=args.port,
        host=args.host,
        log=log_path,
        slot=sup.membership.slot,
    )
    code = sup.run()
    say(f"gpu-share: engine {sup.proc.pid} exited with code {code}")
    raise typer.Exit(code)


def _gpu_busy_for(key: str):
    """NVML per-pid utilisation when the key is a real device, else None (CPU time is used)."""
    from .core import gpu

    if gpu.device_stats(key) is None:
        return None
    return lambda pid, since_us: gpu.pid_util_pct(key, pid, since_us)


@app.command(context_settings=ENGINE_CTX)
def launch(
    ctx: typer.Context,
    weight: str = typer.Option("1", "--weight", help="Share weight (finite, > 0)."),
    name: str | None = typer.Option(None, "--name"),
    gpu_key: str | None = GpuKeyOpt,
    gpu: int | None = GpuIndexOpt,
    load_timeout: float = typer.Option(600.0, "--load-timeout"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    share_group: str | None = ShareGroupOpt,
) -> None:
    """Start a supervised engine detached; returns once it is healthy (or failed)."""
    from .core.errors import GpushareError
    from .core.launcher import LaunchSpec, launch_detached

    w = checked_weight(weight)
    checked_group(share_group)
    key = resolve_key(gpu_key, gpu)
    if not ctx.args:
        fail("no engine command given (use: -- llama-server ARGS...)", ExitCode.USAGE)
    spec = LaunchSpec(tuple(ctx.args), key, w, name=name, load_timeout_s=load_timeout, share_group=share_group)
    try:
        reply = launch_detached(spec)
    except GpushareError as e:
        tail = f"\n--- last lines of the engine log ---\n{e.log_tail}" if e.log_tail else ""
        print(f"gpushare-tui: {e}{tail}", file=sys.stderr)
        raise typer.Exit(int(ExitCode.ERROR)) from None
    print(json.dumps(reply.to_json()) if as_json else reply.summary())


def _control(pid: int, cmd: str, **args: object) -> dict:
    from .core.control import ControlError, request

    try:
        return request(pid, cmd, **args)
    except ControlError as e:
        fail(str(e))


@app.command()
def status(pid: int = typer.Argument(..., help="Engine pid."), as_json: bool = typer.Option(False, "--json")) -> None:
    """Show a managed engine's status."""
    from .core.control import StatusReply

    reply = StatusReply.from_json(_control(pid, "status")).to_json()
    if as_json:
        print(json.dumps(reply))
    else:
        for k, v in reply.items():
            print(f"{k:>10}: {v:.2f}" if isinstance(v, float) else f"{k:>10}: {v}")


@app.command()
def weight(
    pid: int = typer.Argument(..., help="Engine pid."),
    value: str = typer.Argument(..., help="New weight (finite, > 0)."),
) -> None:
    """Change a managed engine's weight."""
    w = checked_weight(value)
    reply = _control(pid, "set_weight", weight=w)
    print(f"engine {pid}: weight {reply['weight']:g}")


@app.command()
def stop(
    pid: int = typer.Argument(..., help="Engine pid."),
    wait: float = typer.Option(15.0, "--wait", help="Seconds to wait for the engine to exit."),
) -> None:
    """Stop a managed engine (SIGCONT, SIGTERM, SIGKILL after 10 s) and leave its slot."""
    import psutil

    _control(pid, "stop")
    try:
        psutil.Process(pid).wait(wait)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        fail(f"engine {pid} still running after {wait:g} s")
    print(f"engine {pid}: stopped")
