"""Per activity source (issue 19): two engines at 2:1, the idle release, and the pacing cost of a lone engine.

    python -m bench.activity_sources [--seconds 8] [--sources llama,metrics,cpu,always[,gpu]] [--json PATH]

Each row runs real processes through the CLI (`gpushare-tui launch --activity SOURCE -- COMMAND`) on a
fresh registry key, with the stand-in engines of testkit/engines (llama: a real llama-server with a
tiny model, $LLAMA_SERVER or scripts/install-llama-server.sh):

- ratio: two engines at weights 2 and 1, both busy for --seconds; measured = the CPU time of engine A's
  process tree over engine B's (a CPU-bound engine's continued time); error = |measured / 2 - 1|;
- release: one engine works, then stops working; the seconds from its last work to its slot's `active`
  dropping (always: never released while it runs, `-`);
- overhead: one engine alone, throughput paced (under `launch`) vs unpaced (started directly), in %
  of unpaced (llama: tokens/s; metrics: requests/s; cpu, always: CPU seconds per second).

Targets (issue 19, quiet machine): ratio error <= 5%, release <= 2.5 s (metrics, cpu), overhead <= 1%.
`gpu` needs NVML (a GPU host) and is left out elsewhere. A source the CLI does not offer yet (`run
--help` without `--activity`) is reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from bench.pacing import CLI, engine_argv, llama_server_path
from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.observe import gpu
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.engines import engine_command
from testkit.engines.http_engine import DEFAULT_GAUGE, HttpLoad
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("llama", "metrics", "cpu", "always", "gpu")
HTTP_WORKERS = 2  # the HTTP engine's worker processes
# Requests kept in flight per worker. With one (the next sent only once the last is answered) the workers
# idled through every round trip: the pair used 0.55 of 2 cores, the client's half of each round trip ran
# in the other engine's window for free, and the 2:1 pair measured 1.45-1.51 (its continued time 1.90-1.98:
# the pacing was right); with 4, 1.14 cores and 1.88-1.92 (load 3-5, the same hour)
HTTP_QUEUED_PER_WORKER = 4


@dataclass
class Row:
    source: str
    configured: float = 2.0
    measured: float | None = None
    error_pct: float | None = None
    release_s: float | None = None
    paced_per_s: float | None = None
    unpaced_per_s: float | None = None
    overhead_pct: float | None = None
    note: str = ""
    problems: list[str] = field(default_factory=list)


@dataclass
class Started:
    """A launched engine: its pid (the slot's), its port (None: none), the work it is driven by."""

    pid: int
    port: int | None
    load: StreamLoad | HttpLoad | None = None
    proc: subprocess.Popen | None = None  # an unpaced engine started directly
    stdout_lines: list[str] = field(default_factory=list)


def cli_offers_activity() -> bool:
    out = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=60)
    return "--activity" in out.stdout


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants now (a member gone is not counted)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class Engines:
    """How each source's stand-in engine is started, driven and measured."""

    def __init__(self, model: str | None, llama: str | None) -> None:
        self.model, self.llama = model, llama

    def command(self, source: str, port: int, **kw: object) -> list[str]:
        if source == "llama":
            assert self.llama and self.model
            return engine_argv(self.llama, self.model, 2, 2048, port)
        if source == "metrics":
            return engine_command("http_engine", "--port", str(port), "--load-s", "0.5", "--workers", str(HTTP_WORKERS))
        work = [] if kw.get("work_cpu_s") is None else ["--work-cpu-s", str(kw["work_cpu_s"])]
        return engine_command("multiproc_engine", "--workers", "2", *work)

    def activity_options(self, source: str, port: int, offered: bool) -> list[str]:
        if not offered:
            return []  # today's CLI: llama-server's own activity
        if source == "metrics":
            base = f"http://127.0.0.1:{port}"
            gauge = ["--metrics-url", f"{base}/metrics", "--gauge", DEFAULT_GAUGE]
            return ["--activity", "metrics", *gauge, "--health-url", f"{base}/health"]
        return ["--activity", source, *(["--no-health"] if source != "llama" else [])]

    def drive(self, source: str, e: Started) -> None:
        if source == "llama" and e.port is not None:
            e.load = StreamLoad(e.port, n_predict=64, banned_tokens=NON_TEXT_TOKEN_IDS).start()
        elif source == "metrics" and e.port is not None:
            e.load = HttpLoad(e.port, units=20, concurrency=HTTP_WORKERS * HTTP_QUEUED_PER_WORKER).start()

    def work_done(self, source: str, e: Started, t0: float, t1: float) -> float:
        """Work in [t0, t1) (monotonic): tokens, requests; for cpu/always the caller uses CPU time."""
        if isinstance(e.load, StreamLoad):
            return sum(1 for t in list(e.load.tokens) if t0 <= t < t1)
        if isinstance(e.load, HttpLoad):
            return e.load.count_between(t0, t1)
        return 0.0


def launch(key: str, weight: float, name: str, argv: list[str], options: list[str]) -> Started:
    cmd = [*CLI, "launch", "--json", "--gpu-key", key, "--weight", str(weight), "--name", name, *options, "--", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(
            f"launch failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        )
    info = json.loads(out.stdout)
    return Started(info["engine_pid"], info.get("port"))


def stop(e: Started) -> None:
    if e.load is not None:
        e.load.stop_nowait() if isinstance(e.load, StreamLoad) else e.load.stop(join_s=5)
    if e.proc is not None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(e.proc.pid, sig)
            except ProcessLookupError:
                break
        e.proc.wait(10)
        return
    subprocess.run([*CLI, "stop", str(e.pid)], capture_output=True, timeout=60)


def slot_active(key: str, pid: int) -> bool:
    with Segment.attach_readonly(shm_path(key)) as seg:
        return any(r.pid == pid and r.active for r in seg.read_slots())


def measure_ratio(src: str, engines: Engines, offered: bool, seconds: float, row: Row) -> None:
    key = f"bas-{src}-{uuid.uuid4().hex[:6]}"
    started: list[Started] = []
    try:
        for weight in (2.0, 1.0):
            port = free_port()
            e = launch(
                key,
                weight,
                f"{src}-w{weight:g}",
                engines.command(src, port),
                engines.activity_options(src, port, offered),
            )
            e.port = e.port or port
            engines.drive(src, e)
            started.append(e)
        time.sleep(2.0)  # both active, the schedule settled
        cpu0 = [tree_cpu_s(e.pid) for e in started]
        time.sleep(seconds)
        cpu1 = [tree_cpu_s(e.pid) for e in started]
        a, b = (c1 - c0 for c0, c1 in zip(cpu0, cpu1))
        if b > 0:
            row.measured = a / b
            row.error_pct = abs(row.measured / row.configured - 1) * 100
    finally:
        for e in started:
            stop(e)
        Path(shm_path(key)).unlink(missing_ok=True)


def measure_release(src: str, engines: Engines, offered: bool, row: Row) -> None:
    """One engine works ~1 s, then stops: seconds from its last work to `active` dropped."""
    if src == "always":
        row.note = "always: active while it runs (no release)"
        return
    key = f"bar-{src}-{uuid.uuid4().hex[:6]}"
    port = free_port()
    e: Started | None = None
    try:
        argv = engines.command(src, port, work_cpu_s=1.0)
        e = launch(key, 1.0, f"{src}-release", argv, engines.activity_options(src, port, offered))
        e.port = e.port or port
        last_work: Callable[[], float | None]
        if src == "cpu":
            # the workers spin for 1 s of CPU each from their start, then sleep: the last work is when the
            # tree's CPU time stops rising (sampled here, monotonic clock)
            last = [time.monotonic(), tree_cpu_s(e.pid)]

            def last_work() -> float | None:
                now, cpu = time.monotonic(), tree_cpu_s(e.pid)  # type: ignore[union-attr]
                if cpu - last[1] > 0.02:
                    last[0], last[1] = now, cpu
                return last[0] if now - last[0] > 0.3 else None
        else:
            engines.drive(src, e)
            time.sleep(1.0)
            assert e.load is not None
            e.load.stop_nowait() if isinstance(e.load, StreamLoad) else e.load.stop(join_s=30)
            done = e.load.tokens if isinstance(e.load, StreamLoad) else e.load.done

            def last_work() -> float | None:
                return max(done) if done else None

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if last_work() is not None and not slot_active(key, e.pid):
                t = last_work()
                assert t is not None
                row.release_s = time.monotonic() - t
                return
            time.sleep(0.02)
        row.problems.append("release: still active after 30 s")
    finally:
        if e is not None:
            stop(e)
        Path(shm_path(key)).unlink(missing_ok=True)


def measure_overhead(src: str, engines: Engines, offered: bool, seconds: float, row: Row) -> None:
    """A lone engine's throughput under the supervisor vs started directly (same command)."""
    rates: dict[str, float] = {}
    for how in ("unpaced", "paced"):
        key = f"bao-{src}-{uuid.uuid4().hex[:6]}"
        port = free_port()
        argv = engines.command(src, port)
        e: Started | None = None
        try:
            if how == "paced":
                e = launch(key, 1.0, f"{src}-alone", argv, engines.activity_options(src, port, offered))
                e.port = e.port or port
            else:
                proc = subprocess.Popen(
                    argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=ROOT
                )
                e = Started(proc.pid, port, proc=proc)
                if src in ("llama", "metrics"):
                    _wait_health(port)
            engines.drive(src, e)
            time.sleep(1.5)
            t0, cpu0 = time.monotonic(), tree_cpu_s(e.pid)
            time.sleep(seconds)
            t1, cpu1 = time.monotonic(), tree_cpu_s(e.pid)
            work = engines.work_done(src, e, t0, t1) if src in ("llama", "metrics") else cpu1 - cpu0
            rates[how] = work / (t1 - t0)
        finally:
            if e is not None:
                stop(e)
            Path(shm_path(key)).unlink(missing_ok=True)
    row.unpaced_per_s, row.paced_per_s = rates["unpaced"], rates["paced"]
    if rates["unpaced"] > 0:
        row.overhead_pct = (1 - rates["paced"] / rates["unpaced"]) * 100


def _wait_health(port: int, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"engine on port {port} not healthy within {timeout_s:g} s")


def _fmt(x: float | None, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0])) if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per ratio and overhead run")
    ap.add_argument("--sources", default="llama,metrics,cpu,always,gpu")
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    wanted = [s for s in a.sources.split(",") if s]
    bad = [s for s in wanted if s not in SOURCES]
    if bad:
        ap.error(f"unknown source(s) {', '.join(bad)} (known: {', '.join(SOURCES)})")
    offered = cli_offers_activity()
    try:
        gpu.gpu_key_for_index(0)
        have_gpu = True
    except gpu.GpuKeyError:
        have_gpu = False
    llama = model = None
    if "llama" in wanted:
        llama = llama_server_path()
        model_path = ROOT / "bench" / "results" / "model-256x4.gguf"
        model_path.parent.mkdir(parents=True, exist_ok=True)
        if not model_path.exists():
            write_tiny_llama(str(model_path), 256, 4)
        model = str(model_path)
    engines = Engines(model, llama)
    rows: list[Row] = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; `run --activity` offered: {offered}")
    for src in wanted:
        row = Row(src)
        rows.append(row)
        if src == "gpu":  # the stand-in engines do CPU work: a gpu row needs a CUDA engine on a GPU host
            row.note = (
                "gpu: not measured (needs a CUDA engine on a GPU host)" if have_gpu else "gpu: no NVML device here"
            )
            continue
        if src != "llama" and not offered:
            row.note = "not run: this CLI has no `run --activity` (issue 19's runtime)"
            continue
        steps: list[tuple[Callable[..., None], tuple]] = [
            (measure_ratio, (src, engines, offered, a.seconds, row)),
            (measure_release, (src, engines, offered, row)),
            (measure_overhead, (src, engines, offered, a.seconds, row)),
        ]
        for step, args in steps:
            try:
                step(*args)
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
                row.problems.append(f"{step.__name__}: {e}")
    names = (("source", 8), ("2:1 measured", 12), ("error %", 8), ("release s", 10), ("paced/s", 9), ("unpaced/s", 9))
    print(" ".join(n.ljust(w) if n == "source" else n.rjust(w) for n, w in names), "overhead %".rjust(10))
    for r in rows:
        print(
            f"{r.source:<8} {_fmt(r.measured, '12.3f')} {_fmt(r.error_pct, '8.1f')} {_fmt(r.release_s, '10.2f')} "
            f"{_fmt(r.paced_per_s, '9.2f')} {_fmt(r.unpaced_per_s, '9.2f')} {_fmt(r.overhead_pct, '10.1f')}"
            + (f"  {r.note}" if r.note else "")
            + (f"  problems: {'; '.join(r.problems)}" if r.problems else "")
        )
    print("targets (quiet machine): error <= 5%, release <= 2.5 s (metrics, cpu), overhead <= 1%")
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
