"""An honest interactive llama-server keeps its latency beside a streaming batch one (spec §7, Extension 1):
real engines under `run`, the interactive one `--class interactive`, weights 1:1. Its requests are short
(48 tokens, ~0.25 s alone) and rare (one every ~2 s): its busy stays far within its budget (S = 1/2 of each
second), so it holds PRIORITY through every request and runs as if alone. Its inter-token gap p99 beside the
batch engine stays within 1.25x its solo p99, and the batch engine never judged its priority over budget.

It failed on 4d2395d and on 81bfca6 (p99 44 ms beside against 7.7-8.1 ms solo, 5.4-5.7x; 0.79x after): the
supervisor counted the engine's continued time between two requests as busy whenever their activity marks lay
< 1.2 s apart, so an engine with work in flight 2-11 % of the last second read 97-100 %, dropped PRIORITY, and
its next requests ran by §5's windows (a 40 ms stop every 80 ms). The batch engine's check of the budget never
tripped (0 in every run)."""

from __future__ import annotations

import pytest
from llama_env import Engines

from gpushare_tui.core.pacing import control
from testkit.latency_class import percentile, stream_requests
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama
from testkit.wait import wait_for

# alone: a latency ratio between two stretches of real time (other tests' CPU between them moved it 3.5x once)
pytestmark = [pytest.mark.slow, pytest.mark.llama, pytest.mark.alone]

# 30 requests of 48 tokens: 1,410 gaps, so the p99 is the 15th largest (a few stray gaps of a loaded host do
# not move it); a failing build shows ~30 % of its gaps at the §5 stop (~45 ms), far above any tolerance
N_REQUESTS = 30
N_PREDICT = 48
EVERY_S = 2.0  # one request every 1-3 s
RATIO_MAX = 1.25
MODEL = (512, 4)  # ~5 ms a token on 1 thread (a gap is more than the 4 ms in which a batch member yields), and
THREADS = 1  # the other core is left to the supervisors, proxies and this client (2 threads each: p50 5.8 -> 7.4 ms)


def _status(pid: int) -> dict:
    return control.request(pid, "status")  # the reply as sent (this test also runs against older builds)


@pytest.fixture
def engines(procs, gpu_key, llama_server, tmp_path, runtime_dir):
    model = write_tiny_llama(str(tmp_path / "mid.gguf"), *MODEL)
    e = Engines(procs, gpu_key, llama_server, model)
    yield e
    e.end()


def test_an_honest_interactive_engine_keeps_its_solo_gaps_beside_a_batch_engine(engines) -> None:
    _, chat, _ = engines.run(1.0, name="chat", threads=THREADS, options=("--class", "interactive"))
    port = _status(chat)["port"]
    stream_requests(port, 3, N_PREDICT, 0.2)  # warm: the first requests of a fresh engine are slower
    solo = percentile(stream_requests(port, N_REQUESTS, N_PREDICT, EVERY_S, seed=1).gaps_ms(), 0.99)
    _, batch, _ = engines.run(1.0, name="batch", threads=THREADS)
    load = StreamLoad(_status(batch)["port"], 256, banned_tokens=NON_TEXT_TOKEN_IDS).start()
    try:
        wait_for(lambda: len(load.tokens) > 10, 30, what="the batch engine streaming")
        beside = percentile(stream_requests(port, N_REQUESTS, N_PREDICT, EVERY_S, seed=1).gaps_ms(), 0.99)
        trips = _status(batch).get("held_off_trips")
    finally:
        load.stop()
    print(f"gap p99 solo {solo:.1f} ms, beside a batch engine {beside:.1f} ms ({beside / solo:.2f}x); trips {trips}")
    assert beside <= RATIO_MAX * solo, (solo, beside)
    assert trips == 0  # the batch engine believed the honest holder's priority throughout
