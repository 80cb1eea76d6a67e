"""Pacing benchmark: real llama-server engines sharing this machine's cores.

Scenarios (one run): solo, 1:1, 2:1, 2/1/1 under the gpushare supervisor;
unpaced (plain llama-servers side by side) and nice-weighted 2:1.
Prints a table and writes bench/results/pacing.json.

    python -m bench.pacing [--seconds 15] [--embd 768 --layers 8] [--ngl 99] [--json PATH]

--ngl N offloads N layers (a CUDA llama-server: 99 puts the whole model on the GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpushare_tui.core.engines.llama_server import free_port, parse_metrics
from gpushare_tui.core.registry import abi
from gpushare_tui.core.schedule import v1 as schedule
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

CLI = [sys.executable, "-m", "gpushare_tui"]


def llama_server_path() -> str:
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if found:
        return found
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-llama-server.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


@dataclass
class Engine:
    weight: float
    port: int
    pid: int
    proc: subprocess.Popen | None = None  # plain (unsupervised) engines only
    managed: bool = True
    load: StreamLoad | None = None

    @property
    def tokens(self) -> list[float]:
        return self.load.tokens if self.load else []


NGL: list[str] = []  # ["-ngl", N] when --ngl is given


def engine_argv(server: str, model: str, threads: int, ctx: int, port: int) -> list[str]:
    return [server, "-m", model, "-t", str(threads), "-c", str(ctx), "-np", "1", "--port", str(port), *NGL]


def start_supervised(server: str, model: str, key: str, weight: float, threads: int, ctx: int) -> Engine:
    port = free_port()
    launch = [*CLI, "launch", "--json", "--weight", str(weight), "--gpu-key", key, "--name", f"w{weight:g}-{port}"]
    out = subprocess.run(
        [*launch, "--", *engine_argv(server, model, threads, ctx, port)], capture_output=True, text=True, timeout=180
    )
    if out.returncode != 0:
        raise RuntimeError(f"launch failed: {out.stderr.strip()}")
    info = json.loads(out.stdout)
    return Engine(weight, info["port"], info["engine_pid"])


def start_plain(server: str, model: str, weight: float, threads: int, ctx: int, nice: int = 0) -> Engine:
    port = free_port()
    cmd = [*engine_argv(server, model, threads, ctx, port), "--host", "127.0.0.1", "--metrics"]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return Engine(weight, port, proc.pid, proc=proc, managed=False)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("plain llama-server did not become healthy")


def end(engines: list[Engine]) -> None:
    for e in engines:
        if e.load:
            e.load.stop_nowait()
    for e in engines:
        if e.load:
            e.load.stop()
    for e in engines:
        if e.managed:
            subprocess.run([*CLI, "stop", str(e.pid)], capture_output=True, timeout=60)
        elif e.proc:
            e.proc.terminate()
            try:
                e.proc.wait(10)
            except subprocess.TimeoutExpired:
                e.proc.kill()
                e.proc.wait()


def rate(times: list[float], t0: float, t1: float) -> float:
    return sum(1 for t in times if t0 <= t < t1) / (t1 - t0)


def gaps_ms(load: StreamLoad | None, t0: float, t1: float) -> dict:
    """Inter-token gaps within requests (a new request's prompt and HTTP set-up are not a stall)."""
    g = sorted(x * 1000 for x in load.gaps_s(t0, t1)) if load else []
    if not g:
        return {"p50": None, "p95": None, "max": None}
    return {"p50": g[len(g) // 2], "p95": g[min(len(g) - 1, int(len(g) * 0.95))], "max": g[-1]}


def decode_count(port: int) -> tuple[float, float]:
    """(monotonic time of the answer, llamacpp:n_decode_total). A stopped engine
    answers when it resumes, so the time is taken when the count is known."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return time.monotonic(), parse_metrics(text).n_decode_total


def decode_counts(engines: list[Engine]) -> list[tuple[float, float]]:
    with ThreadPoolExecutor(len(engines)) as ex:
        return list(ex.map(lambda e: decode_count(e.port), engines))


def measure(
    engines: list[Engine], seconds: float, n_predict: int, warmup_s: float = 3.0
) -> tuple[float, float, list[float]]:
    """Stream to every engine; after warm-up, a `seconds` window. Returns the window
    and each engine's decode rate over it, counted by the engine itself (two
    /metrics probes: the client sees fewer events than tokens, as a random model's
    partial UTF-8 tokens are held back)."""
    for e in engines:
        e.load = StreamLoad(e.port, n_predict, banned_tokens=NON_TEXT_TOKEN_IDS).start()
    deadline = time.monotonic() + 60
    while any(not e.tokens for e in engines) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(warmup_s)
    t0 = time.monotonic()
    first = decode_counts(engines)
    time.sleep(seconds)
    last = decode_counts(engines)
    rates = [(n1 - n0) / (t1 - t0) for (t0, n0), (t1, n1) in zip(first, last)]
    return t0, time.monotonic(), rates


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def idle_release_s(
    stays: Engine, goes: Engine, limit_s: float = 8.0, settle_s: float = 3.0
) -> tuple[float | None, float | None]:
    """After `goes` goes idle: (when `stays` streams at >= 95% of its own unthrottled
    rate in a 0.5 s window, when `stays` was last seen stopped), seconds. The rate
    reference is `stays`'s rate over the last `settle_s` of the `limit_s`, not the
    solo run: this machine's speed drifts by tens of percent between minutes."""
    goes.load.stop_nowait()  # type: ignore[union-attr]
    t_idle = time.monotonic()
    last_stopped = None
    while (now := time.monotonic()) < t_idle + limit_s:
        if proc_state(stays.pid) == "T":
            last_stopped = now - t_idle
        time.sleep(0.002)
    settled = rate(stays.tokens, t_idle + limit_s - settle_s, t_idle + limit_s)
    t = t_idle
    while t + 0.5 <= t_idle + limit_s - settle_s:
        if rate(stays.tokens, t, t + 0.5) >= 0.95 * settled:
            return t - t_idle, last_stopped
        t += 0.05
    return None, last_stopped


def scenario(
    name: str, engines: list[Engine], seconds: float, n_predict: int, solo: float | None, release: bool = False
) -> dict:
    try:
        t0, t1, rates = measure(engines, seconds, n_predict)
        gaps = [gaps_ms(e.load, t0, t1) for e in engines]
        rel, unstopped = idle_release_s(engines[0], engines[1]) if release else (None, None)
    finally:
        end(engines)
    weights = [e.weight for e in engines]
    row = {"scenario": name, "weights": weights, "tok_s": rates, "aggregate_tok_s": sum(rates), "gaps_ms": gaps}
    if len(engines) > 1:
        achieved = [r / rates[-1] if rates[-1] else math.inf for r in rates]
        configured = [w / weights[-1] for w in weights]
        row["ratio_achieved"] = achieved
        row["ratio_error_pct"] = max(abs(a / c - 1) * 100 for a, c in zip(achieved, configured))
        sched = schedule.build_schedule(list(enumerate(weights)))
        row["period_ms"] = sched.period_ms if sched else None
        if sched:
            row["stall_bound_ms"] = [(1 - s) * sched.period_ms for s in sched.shares]
    if solo:
        row["aggregate_pct_of_solo"] = 100 * sum(rates) / solo
    if release:
        row["idle_release_s"] = rel
        row["last_stopped_after_idle_s"] = unstopped
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="measurement window per scenario")
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default="", help="comma list of scenarios besides solo (1:1,2:1,2/1/1,unpaced,nice)")
    ap.add_argument(
        "--n-predict",
        type=int,
        default=128,
        help="tokens per streamed request; short, because a token's cost grows with its position "
        "(attention), and engines at different positions would skew the ratio",
    )
    ap.add_argument("--rounds", type=int, default=1, help="repeat every scenario; the table shows the median round")
    ap.add_argument("--ngl", type=int, default=None, help="layers to offload to the GPU (-ngl); default: none")
    ap.add_argument("--json", default=str(RESULTS / "pacing.json"), help="result file")
    a = ap.parse_args()
    if a.ngl is not None:
        NGL[:] = ["-ngl", str(a.ngl)]
    server = llama_server_path()
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = RESULTS / f"model-{a.embd}x{a.layers}.gguf"
    if not model.exists():
        write_tiny_llama(str(model), a.embd, a.layers)
    ctx, n_predict = 4096, a.n_predict
    key = f"bench-{uuid.uuid4().hex[:8]}"
    only = set(a.only.split(",")) if a.only else None
    rows: list[dict] = []

    def sup(*weights: float) -> list[Engine]:
        return [start_supervised(server, str(model), key, w, a.threads, ctx) for w in weights]

    def want(n: str) -> bool:
        return only is None or n in only

    try:
        for _ in range(a.rounds):
            r = scenario("solo", sup(1), a.seconds, n_predict, None)
            solo = r["tok_s"][0]
            rows.append(r)
            if want("1:1"):
                rows.append(scenario("1:1", sup(1, 1), a.seconds, n_predict, solo))
            if want("2:1"):
                rows.append(scenario("2:1", sup(2, 1), a.seconds, n_predict, solo, release=True))
            if want("2/1/1"):
                rows.append(scenario("2/1/1", sup(2, 1, 1), a.seconds, n_predict, solo))
            if want("unpaced"):
                plain = [start_plain(server, str(model), w, a.threads, ctx) for w in (1, 1)]
                rows.append(scenario("unpaced 1:1", plain, a.seconds, n_predict, solo))
            if want("nice"):
                plain = [
                    start_plain(server, str(model), 2, a.threads, ctx, 0),
                    start_plain(server, str(model), 1, a.threads, ctx, 3),
                ]
                rows.append(scenario("nice 2:1", plain, a.seconds, n_predict, solo))
    finally:
        try:
            os.unlink(f"/dev/shm/opencoti-gpu-{key}")
        except FileNotFoundError:
            pass
    # This machine's speed drifts between runs: every aggregate is against the median solo of all rounds.
    solo_ref = statistics.median(r["tok_s"][0] for r in rows if r["scenario"] == "solo")
    for r in rows:
        r["aggregate_pct_of_solo"] = 100 * r["aggregate_tok_s"] / solo_ref
    summary = [
        median_row([r for r in rows if r["scenario"] == name]) for name in dict.fromkeys(r["scenario"] for r in rows)
    ]
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(
        json.dumps(
            {
                "model": model.name,
                "ngl": a.ngl,
                "threads": a.threads,
                "seconds": a.seconds,
                "rounds": a.rounds,
                "solo_ref_tok_s": solo_ref,
                "summary": summary,
                "all_rounds": rows,
            },
            indent=1,
        )
    )
    print(
        f"model {model.name}, {a.threads} threads per engine, {a.seconds:g} s windows, "
        f"median of {a.rounds} round(s); solo reference {solo_ref:.1f} tok/s"
    )
    print_table(summary)
    for r in summary:
        if r.get("last_stopped_after_idle_s") is not None:
            print(
                f"{r['scenario']}: after its peer went idle the remaining engine was last stopped at "
                f"{r['last_stopped_after_idle_s']:.2f} s (activity window {abi.ACTIVITY_WINDOW_US / 1e6:g} s)"
            )


def median_row(rows: list[dict]) -> dict:
    """The round whose aggregate is the median (ties: the lower)."""
    ranked = sorted(rows, key=lambda r: r["aggregate_tok_s"])
    return ranked[(len(ranked) - 1) // 2]


def _f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'scenario':<12} {'tok/s per engine':<24} {'ratio':<16} {'err%':>6} {'agg%solo':>9} "
        f"{'release_s':>9}  gaps p50/p95/max ms per engine (stall bound)"
    )
    for r in rows:
        toks = "/".join(f"{t:.1f}" for t in r["tok_s"])
        ratio = ":".join(f"{x:.2f}" for x in r.get("ratio_achieved", [1.0]))
        gaps = "  ".join(f"{_f(g['p50'], '.0f')}/{_f(g['p95'], '.0f')}/{_f(g['max'], '.0f')}" for g in r["gaps_ms"])
        bound = ("  (" + "/".join(f"{b:.0f}" for b in r["stall_bound_ms"]) + ")") if r.get("stall_bound_ms") else ""
        print(
            f"{r['scenario']:<12} {toks:<24} {ratio:<16} {_f(r.get('ratio_error_pct')):>6} "
            f"{_f(r.get('aggregate_pct_of_solo')):>9} {_f(r.get('idle_release_s'), '.2f'):>9}  {gaps}{bound}"
        )


if __name__ == "__main__":
    main()
