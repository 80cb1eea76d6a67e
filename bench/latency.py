"""Latency classes (issue 20): an interactive llama-server beside a batch one, both real, same model.

The interactive engine gets streamed requests with Poisson arrivals (mean gap --mean-gap-s, 64-128
tokens each); the batch engine streams without pause. Scenarios:

    solo      the interactive engine alone (its latency bar)
    unpaced   both, plain llama-servers side by side (no gpushare)
    v1 1:1    both supervised, TDM (spec §5), weights 1:1, both batch class
    v1 3:1    the same, interactive weight 3
    ext1 w1   Extension 1 (spec §7): the interactive engine `--class interactive`, weight 1
    ext1 w3   the same, weight 3
    ext1 2b   ext1 w1 beside two batch engines (weights 1:1:1)
    flood     interactive requests back to back for --flood-s beside the batch engine (Extension 1 at
              weight 1 when this build has it, else v1 1:1): its share of the decode steps in every 5 s
              window (each printed), against its weight share + 5 points

Per scenario (and round): interactive TTFT p50/p99, inter-token gap p50/p95/p99/max, its tokens/s (median
per request), the batch engine's tokens/s, the aggregate vs solo (both engines' decode steps/s over the
batch engine's rate alone, measured first), and the batch engine's share of what the interactive one
left idle. The targets of issue 20 are checked on the ext1 rows (gap p99 <= 1.10 x solo beside one batch engine
and beside two), and the flood's in every 5 s window. The ext1 scenarios run only when the
engines set EXT1 (the Extension-1 schedule is in this build); else they are listed as skipped.

    python -m bench.latency [--seconds 40] [--rounds 1] [--only "solo,v1 1:1"] [--quick] [--ngl 99]

--quick: a one-minute smoke (solo, v1 1:1, ext1 w1 and a 10 s flood; 5 s scenarios). Defaults (all eight,
40 s each, a 20 s flood, one round) take about 7 minutes. Writes bench/results/latency.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench import pacing
from bench.pacing import CLI, Engine, decode_count, end, engine_argv, llama_server_path, start_plain
from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SCENARIOS = ("solo", "unpaced", "v1 1:1", "v1 3:1", "ext1 w1", "ext1 w3", "ext1 2b", "flood")
QUICK_SCENARIOS = ("solo", "v1 1:1", "ext1 w1", "flood")  # --quick without --only
FLOOD_WINDOW_S = 5.0
BATCH_N_PREDICT = 256


@dataclass
class Request:
    sent_s: float
    n_predict: int
    tokens_s: list[float] = field(default_factory=list)

    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.tokens_s, self.tokens_s[1:])]

    def tok_s(self) -> float | None:
        span = self.tokens_s[-1] - self.tokens_s[0] if len(self.tokens_s) > 1 else 0.0
        return (len(self.tokens_s) - 1) / span if span > 0 else None


class InteractiveLoad:
    """Streamed requests to `port`: Poisson arrivals (each on its own thread, so a slow one delays none
    of the next arrivals), or back to back (`flood`)."""

    def __init__(self, port: int, mean_gap_s: float, seed: int, flood: bool = False) -> None:
        self.url = f"http://127.0.0.1:{port}/completion"
        self.mean_gap_s, self.flood = mean_gap_s, flood
        self.rng = random.Random(seed)
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._main = threading.Thread(target=self._run, daemon=True)

    def start(self) -> InteractiveLoad:
        self._main.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._main.join(60)
        for t in self._threads:
            t.join(60)

    def _run(self) -> None:
        if self.flood:
            with httpx.Client(timeout=120) as c:
                while not self._stop.is_set():
                    self._one(c, self.rng.randint(64, 128))
            return
        nxt = time.monotonic() + self.rng.expovariate(1 / self.mean_gap_s)
        while not self._stop.wait(max(0.0, nxt - time.monotonic())):
            t = threading.Thread(target=self._alone, args=(self.rng.randint(64, 128),), daemon=True)
            t.start()
            self._threads.append(t)
            nxt += self.rng.expovariate(1 / self.mean_gap_s)

    def _alone(self, n_predict: int) -> None:
        with httpx.Client(timeout=120) as c:
            self._one(c, n_predict)

    def _one(self, c: httpx.Client, n_predict: int) -> None:
        body = {"prompt": "the a of", "n_predict": n_predict, "ignore_eos": True, "stream": True,
                "cache_prompt": False, "logit_bias": [[t, False] for t in NON_TEXT_TOKEN_IDS]}  # fmt: skip
        r = Request(time.monotonic(), n_predict)
        try:
            with c.stream("POST", self.url, json=body) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: ") and '"content"' in line:
                        r.tokens_s.append(time.monotonic())
        except httpx.HTTPError:
            return
        self.requests.append(r)


def start_supervised(server: str, model: str, key: str, weight: float, klass: str, threads: int, ctx: int) -> Engine:
    """`gpushare-tui launch --class KLASS` of one llama-server."""
    port = free_port()
    argv = [*CLI, "launch", "--json", "--weight", str(weight), "--gpu-key", key, "--name", f"{klass}-{port}"]
    if klass != "batch":
        argv += ["--class", klass]
    out = subprocess.run([*argv, "--", *engine_argv(server, model, threads, ctx, port)], capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"launch failed: {out.stderr.strip()}")
    info = json.loads(out.stdout)
    return Engine(weight, info["port"], info["engine_pid"])


def has_ext1(key: str, pid: int) -> bool:
    """Whether the engine `pid` publishes EXT1 in its slot (this build runs the Extension-1 schedule)."""
    with Segment.attach_readonly(shm_path(key)) as seg:
        return any(r.pid == pid and r.ext1 for r in seg.read_slots())


def _p(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else None


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


@dataclass
class Setup:
    server: str
    model: str
    threads: int
    ctx: int


def engines_for(scenario: str, s: Setup, key: str) -> tuple[Engine, list[Engine]]:
    """(interactive engine, the batch engines) for `scenario`."""
    if scenario == "solo":
        return start_supervised(s.server, s.model, key, 1.0, "batch", s.threads, s.ctx), []
    if scenario == "unpaced":
        return start_plain(s.server, s.model, 1.0, s.threads, s.ctx), [
            start_plain(s.server, s.model, 1.0, s.threads, s.ctx)
        ]
    weight = 3.0 if scenario.endswith(("3:1", "w3")) else 1.0
    klass = "interactive" if scenario.startswith(("ext1", "flood")) else "batch"
    chat = start_supervised(s.server, s.model, key, weight, klass, s.threads, s.ctx)
    batches: list[Engine] = []
    try:
        for _ in range(2 if scenario.endswith("2b") else 1):
            batches.append(start_supervised(s.server, s.model, key, 1.0, "batch", s.threads, s.ctx))
    except BaseException:
        end([chat, *batches])
        raise
    return chat, batches


def run_scenario(scenario: str, s: Setup, seconds: float, mean_gap_s: float, solo_tok_s: float, seed: int) -> dict:
    key = f"lat-{uuid.uuid4().hex[:8]}"
    chat, batches = engines_for(scenario, s, key)
    engines = [chat, *batches]
    row: dict = {"scenario": scenario, "load_avg_1m": psutil.getloadavg()[0]}
    try:
        if scenario.startswith(("ext1", "flood")) and chat.managed and not has_ext1(key, chat.pid):
            if scenario != "flood":
                return {**row, "skipped": "the engines do not set EXT1 (the Extension-1 schedule is not in this build)"}
            row["flood_mode"] = "v1 1:1 (no Extension 1 in this build)"
        for batch in batches:
            batch.load = StreamLoad(batch.port, BATCH_N_PREDICT, banned_tokens=NON_TEXT_TOKEN_IDS).start()
        if batches:
            time.sleep(1.0)  # the batch engines are decoding before the first interactive request
        load = InteractiveLoad(chat.port, mean_gap_s, seed, flood=scenario == "flood").start()
        t0 = time.monotonic()
        c0 = pacing.decode_counts(engines)
        windows: list[tuple[float, float]] = []
        if scenario == "flood":
            prev = c0
            while time.monotonic() - t0 < seconds:
                time.sleep(FLOOD_WINDOW_S)
                cur = pacing.decode_counts(engines)
                di = cur[0][1] - prev[0][1]
                db = sum(c[1] - p[1] for c, p in zip(cur[1:], prev[1:]))
                windows.append((100 * di / max(1.0, di + db), 100 * db / max(1.0, di + db)))
                prev = cur
        else:
            time.sleep(seconds)
        c1 = pacing.decode_counts(engines)
        load.stop()
    finally:
        end(engines)
        Path(shm_path(key)).unlink(missing_ok=True)
    span = c1[0][0] - c0[0][0]
    rates = [(b[1] - a[1]) / max(1e-9, b[0] - a[0]) for a, b in zip(c0, c1)]
    reqs = [r for r in load.requests if r.tokens_s]
    ttft = [(r.tokens_s[0] - r.sent_s) * 1000 for r in reqs]
    gaps = [g for r in reqs for g in r.gaps_ms()]
    per_req = [x for r in reqs if (x := r.tok_s()) is not None]
    chat_rate, batch_rate = rates[0], sum(rates[1:])
    row.update(
        seconds=span, requests=len(reqs), ttft_p50_ms=_p(ttft, 0.5), ttft_p99_ms=_p(ttft, 0.99),
        gap_p50_ms=_p(gaps, 0.5), gap_p95_ms=_p(gaps, 0.95), gap_p99_ms=_p(gaps, 0.99), gap_max_ms=_p(gaps, 1.0),
        chat_tok_s=_med(per_req), chat_decode_s=chat_rate, batch_tok_s=batch_rate if batches else None,
        aggregate_pct=100 * (chat_rate + batch_rate) / solo_tok_s if solo_tok_s else None,
        batch_of_idle_pct=100 * batch_rate / max(1e-9, solo_tok_s - chat_rate) if batches and solo_tok_s else None,
    )  # fmt: skip
    if windows:
        weight_share = 100.0 / (1 + len(batches))  # flood: every engine at weight 1
        row.update(flood_windows=windows, flood_chat_max_pct=max(w[0] for w in windows),
                   flood_batch_min_pct=min(w[1] for w in windows), weight_share_pct=weight_share)  # fmt: skip
    return row


def batch_solo_rate(s: Setup, seconds: float) -> float:
    """Decode steps/s of one streaming engine alone: the device's capacity for this model."""
    e = start_plain(s.server, s.model, 1.0, s.threads, s.ctx)
    try:
        e.load = StreamLoad(e.port, BATCH_N_PREDICT, banned_tokens=NON_TEXT_TOKEN_IDS).start()
        time.sleep(1.0)
        t0, n0 = decode_count(e.port)
        time.sleep(seconds)
        t1, n1 = decode_count(e.port)
    finally:
        end([e])
    return (n1 - n0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="per scenario")
    ap.add_argument("--flood-s", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mean-gap-s", type=float, default=3.0, help="mean gap between interactive arrivals")
    ap.add_argument("--only", default=None, help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument(
        "--quick", action="store_true", help=f"a one-minute smoke: {', '.join(QUICK_SCENARIOS)}; 5 s each, a 10 s flood"
    )
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--ngl", type=int, default=None, help="offload N layers (a CUDA llama-server: 99)")
    ap.add_argument("--json", default=str(RESULTS / "latency.json"))
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.flood_s = min(a.seconds, 5.0), min(a.flood_s, 10.0)
    chosen = [x.strip() for x in a.only.split(",")] if a.only else list(QUICK_SCENARIOS if a.quick else SCENARIOS)
    unknown = [x for x in chosen if x not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r} (one of {', '.join(SCENARIOS)})")
    if a.ngl is not None:
        pacing.NGL[:] = ["-ngl", str(a.ngl)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = RESULTS / f"model-{a.embd}x{a.layers}.gguf"
    if not model.exists():
        write_tiny_llama(str(model), a.embd, a.layers)
    s = Setup(llama_server_path(), str(model), a.threads, a.ctx)
    solo_tok_s = batch_solo_rate(s, min(8.0, a.seconds))
    rows = []
    for rnd in range(a.rounds):
        for i, sc in enumerate(chosen):
            secs = a.flood_s if sc == "flood" else a.seconds
            row = run_scenario(sc, s, secs, a.mean_gap_s, solo_tok_s, seed=1000 * rnd + i)
            rows.append({"round": rnd + 1, **row})
            print_row(rows[-1])
    meta = {"solo_tok_s": solo_tok_s, "model": f"{a.embd}x{a.layers}", "threads": a.threads, "ngl": a.ngl,
            "seconds": a.seconds, "flood_s": a.flood_s, "mean_gap_s": a.mean_gap_s,
            "cpus": psutil.cpu_count()}  # fmt: skip
    checks = target_checks(rows)
    Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows, "targets": checks}, indent=1))
    print_table(rows, meta, checks)


def target_checks(rows: list[dict]) -> list[dict]:
    """Issue 20's targets on every ext1 and flood row, against the same round's solo row."""
    out = []
    for r in rows:
        solo = next(
            (x for x in rows if x["scenario"] == "solo" and x["round"] == r["round"] and "skipped" not in x), None
        )
        if "skipped" in r:
            continue
        if r["scenario"].startswith("ext1") and solo and solo["gap_p99_ms"] and r["gap_p99_ms"] is not None:
            out += [
                _check(r, "gap p99 <= 1.10 x solo", r["gap_p99_ms"] <= 1.10 * solo["gap_p99_ms"]),
                _check(r, "TTFT p99 <= solo + 20 ms", (r["ttft_p99_ms"] or 1e9) <= (solo["ttft_p99_ms"] or 0) + 20),
                _check(r, "batch >= 90% of the idle device", (r["batch_of_idle_pct"] or 0) >= 90),
                _check(r, "aggregate >= 95% of solo", (r["aggregate_pct"] or 0) >= 95),
            ]
        if r["scenario"] == "flood" and r.get("flood_windows"):
            out += [
                _check(
                    r,
                    "interactive <= weight share + 5 pts (every 5 s)",
                    r["flood_chat_max_pct"] <= r["weight_share_pct"] + 5,
                ),  # fmt: skip
                _check(r, "batch never starved (every 5 s)", r["flood_batch_min_pct"] > 0),
            ]
    return out


def _check(r: dict, what: str, ok: bool) -> dict:
    return {"round": r["round"], "scenario": r["scenario"], "target": what, "met": bool(ok)}


def _f(x: object, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


HEAD = ("scenario", "rnd", "req", "TTFT p50", "p99", "gap p50", "p95", "p99", "max", "int tok/s", "batch tok/s",
        "agg%", "batch/idle%", "load")  # fmt: skip


def _cells(r: dict) -> list[str]:
    if "skipped" in r:
        return [r["scenario"], str(r["round"]), f"skipped: {r['skipped']}"]
    keys = ("ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms", "gap_p95_ms", "gap_p99_ms", "gap_max_ms", "chat_tok_s",
            "batch_tok_s", "aggregate_pct", "batch_of_idle_pct")  # fmt: skip
    return [r["scenario"], str(r["round"]), str(r["requests"]), *(_f(r[k]) for k in keys), _f(r["load_avg_1m"])]


def print_row(r: dict) -> None:
    print("  ".join(_cells(r)), flush=True)


def print_table(rows: list[dict], meta: dict, checks: list[dict]) -> None:
    print(
        f"\nlatency classes: model {meta['model']}, {meta['threads']} thread(s) per engine, batch alone "
        f"{meta['solo_tok_s']:.0f} tok/s; {meta['seconds']:g} s per scenario, interactive arrivals every "
        f"{meta['mean_gap_s']:g} s on average (64-128 tokens, streamed); times in ms"
    )
    widths = (9, 3, 4, 9, 7, 8, 7, 7, 7, 10, 12, 6, 12, 5)
    print(" ".join(h.rjust(w) if i > 0 else h.ljust(w) for i, (h, w) in enumerate(zip(HEAD, widths))))
    for r in rows:
        cells = _cells(r)
        if "skipped" in r:
            print(f"{cells[0]:<9} {cells[1]:>3} {cells[2]}")
            continue
        print(" ".join(c.rjust(w) if i > 0 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    for r in rows:
        if r.get("flood_windows"):
            shares = ", ".join(f"{c:.0f}/{b:.0f}" for c, b in r["flood_windows"])
            mode = r.get("flood_mode", "ext1 w1")
            print(f"flood round {r['round']} ({mode}): interactive/batch % of decode steps per 5 s: {shares}")
    for c in checks:
        print(f"target ({c['scenario']}, round {c['round']}): {c['target']}: {'met' if c['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
