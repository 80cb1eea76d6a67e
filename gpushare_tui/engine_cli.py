"""Engine commands: run / launch (supervised llama-server), status / weight / stop (control socket)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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


def _notify(fd: int | None, msg: dict) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(msg) + "\n").encode())
        os.close(fd)
    except OSError:
        pass


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
    from .core.supervisor import Supervisor

    def refuse(msg: str, code: ExitCode = ExitCode.ERROR, tail: str = "") -> None:
        _notify(notify_fd, {"ok": False, "error": msg, "log_tail": tail})
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
    _notify(
        notify_fd,
        {
            "ok": True,
            "engine_pid": sup.proc.pid,
            "port": args.port,
            "host": args.host,
            "log": log_path,
            "slot": sup.membership.slot,
            "supervisor_pid": os.getpid(),
        },
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
    from .core.control import ControlError, state_dir

    checked_weight(weight)
    checked_group(share_group)
    if gpu_key is not None or gpu is None:
        resolve_key(gpu_key, gpu)  # fail fast on a bad key
    if not ctx.args:
        fail("no engine command given (use: -- llama-server ARGS...)", ExitCode.USAGE)
    try:
        sup_log = os.path.join(state_dir(), f"supervisor-{int(time.time())}-{os.getpid()}.log")
    except ControlError as e:
        fail(str(e))
    read_fd, write_fd = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "gpushare_tui",
        "run",
        "--weight",
        weight,
        "--load-timeout",
        str(load_timeout),
        "--notify-fd",
        str(write_fd),
    ]
    if name:
        cmd += ["--name", name]
    if gpu_key:
        cmd += ["--gpu-key", gpu_key]
    if gpu is not None:
        cmd += ["--gpu", str(gpu)]
    if share_group:
        cmd += ["--share-group", share_group]
    with open(sup_log, "ab") as log:
        proc = subprocess.Popen(
            [*cmd, "--", *ctx.args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        line = r.readline()
    try:
        msg = json.loads(line)
    except ValueError:
        proc.poll()
        fail(f"supervisor exited (code {proc.returncode}) before the engine was ready; see {sup_log}")
    if not msg.get("ok"):
        tail = msg.get("log_tail") or ""
        print(
            f"gpushare-tui: {msg.get('error')}" + (f"\n--- last lines of the engine log ---\n{tail}" if tail else ""),
            file=sys.stderr,
        )
        raise typer.Exit(int(ExitCode.ERROR))
    msg["supervisor_log"] = sup_log
    if as_json:
        print(json.dumps(msg))
    else:
        print(
            f"engine pid {msg['engine_pid']} port {msg['port']} (slot {msg['slot']})\n"
            f"engine log {msg['log']}\nsupervisor pid {msg['supervisor_pid']} log {sup_log}"
        )


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
