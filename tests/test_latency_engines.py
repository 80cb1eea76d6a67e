"""The latency recorder against known delays: a stand-in engine speaking vLLM's HTTP API (testkit/engines/
openai_engine.py, its TTFT and inter-token gap set by the test) and a real llama-server, each read by a client
that feeds the recorder what a front proxy would see (the body sent, the head, each chunk as it arrives, the end).
Real processes; tolerances hold on 2 loaded cores (the delays are floors: a loaded host only adds to them)."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.observe.latency import LatencyRecorder, is_stream_content_type
from testkit.engines import engine_command
from testkit.procs import Procs
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

SLACK_MS = 150  # what a loaded host may add to an injected delay (a thread's wake-up, the GIL, the client)


def feed(rec: LatencyRecorder, client: httpx.Client, url: str, body: dict) -> list[bytes]:
    """One request through `rec` as the front proxy will feed it; the raw chunks read."""
    chunks: list[bytes] = []
    r = rec.begin(time.monotonic())
    try:
        with client.stream("POST", url, json=body) as resp:
            streamed = is_stream_content_type(resp.headers.get("content-type", ""))
            rec.head(r, time.monotonic(), resp.status_code, streamed)
            for data in resp.iter_raw():
                rec.chunk(r, time.monotonic(), data)
                chunks.append(data)
    finally:
        rec.end(r, time.monotonic())
    return chunks


@pytest.fixture
def vllm_like(procs: Procs):
    """An openai_engine on a free port: TTFT 250 ms, 40 ms between tokens, 12 tokens, one request at a time."""
    port = free_port()
    argv = engine_command("openai_engine", "--port", str(port), "--ttft-ms", "250", "--itl-ms", "40", "--tokens",
                          "12", "--max-running", "1")  # fmt: skip
    p = procs.start(argv)
    assert p.stdout is not None and p.stdout.readline().split() == ["ready", str(port)]
    yield f"http://127.0.0.1:{port}"
    procs.kill(p)


def test_a_streamed_chat_gives_the_injected_ttft_and_gaps(vllm_like: str) -> None:
    rec = LatencyRecorder()
    with httpx.Client(timeout=30) as c:
        for _ in range(3):
            chunks = feed(rec, c, f"{vllm_like}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                          "stream": True})  # fmt: skip
    first = json.loads(chunks[0].split(b"data: ", 1)[1])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # vLLM's role-only first chunk
    rep = rec.report()
    assert rep.requests == 3 and rep.status_2xx_total == 3 and (rep.in_flight, rep.waiting) == (0, 0)
    assert rep.ttft_p50_ms is not None and 250 * 0.99 <= rep.ttft_p50_ms <= 250 + SLACK_MS  # not the role chunk's
    assert rep.itl_p50_ms is not None and 40 * 0.99 <= rep.itl_p50_ms <= 40 + SLACK_MS / 3
    assert rep.itl_hist is not None and rep.itl_hist.counts is not None
    assert rep.itl_hist.counts[-1] >= 3 * 11 * 0.8  # about 11 gaps a request (reads may merge a few)
    assert rep.e2e_p50_ms is not None and 250 + 11 * 40 <= rep.e2e_p50_ms * 1.01 <= 250 + 11 * 40 + 2 * SLACK_MS


def test_completions_streamed_and_whole_and_a_per_request_delay(vllm_like: str) -> None:
    rec = LatencyRecorder()
    with httpx.Client(timeout=30) as c:
        body = {"prompt": "a", "stream": True, "max_tokens": 4, "test_ttft_ms": 500}
        feed(rec, c, f"{vllm_like}/v1/completions", body)
        streamed = rec.report()
        assert streamed.ttft_p99_ms is not None and 495 <= streamed.ttft_p99_ms <= 500 + SLACK_MS
        whole = LatencyRecorder()
        chunks = feed(whole, c, f"{vllm_like}/v1/completions", {"prompt": "a", "max_tokens": 5})
        doc = json.loads(b"".join(chunks))
        assert doc["choices"][0]["text"] == " tok" * 5 and doc["usage"]["completion_tokens"] == 5
        rep = whole.report()
        assert rep.ttft_p99_ms is not None and 250 + 4 * 40 <= rep.ttft_p99_ms * 1.01 <= 250 + 4 * 40 + SLACK_MS
        assert rep.itl_hist is not None and rep.itl_hist.counts is not None and rep.itl_hist.counts[-1] == 0


def test_a_queued_request_waits_and_its_ttft_says_so(vllm_like: str) -> None:
    """One request at a time (--max-running 1): a second one waits out the first (vllm:num_requests_waiting 1)."""
    rec = LatencyRecorder()
    body = {"prompt": "a", "stream": True, "max_tokens": 10}
    with httpx.Client(timeout=30) as c1, httpx.Client(timeout=30) as c2:
        first = threading.Thread(target=feed, args=(rec, c1, f"{vllm_like}/v1/completions", body))
        first.start()
        wait_for(lambda: rec.in_flight == 1, 10, what="the first request in flight")
        time.sleep(0.05)
        second = threading.Thread(target=feed, args=(rec, c2, f"{vllm_like}/v1/completions", body))
        second.start()
        wait_for(lambda: _gauge(vllm_like, "vllm:num_requests_waiting") == 1, 10, what="the second waiting")
        assert rec.in_flight == 2 and rec.waiting >= 1
        first.join()
        second.join()
    w = rec.window()
    queued = 250 + 9 * 40  # the second one's first token comes after the whole first reply
    assert w.percentile("ttft", 0.99) * 1000 >= queued  # type: ignore[operator]
    assert _gauge(vllm_like, "vllm:num_requests_running") == 0
    assert _gauge(vllm_like, "vllm:generation_tokens_total") == 20


def test_the_engines_other_endpoints(vllm_like: str) -> None:
    assert httpx.get(f"{vllm_like}/health").status_code == 200
    assert httpx.get(f"{vllm_like}/v1/models").json()["data"][0]["id"] == "test-model"
    bad = httpx.post(f"{vllm_like}/v1/chat/completions", content=b"[1, 2]")
    assert bad.status_code == 400 and bad.json()["object"] == "error"
    rec = LatencyRecorder()
    with httpx.Client(timeout=30) as c:
        r = rec.begin(time.monotonic())
        resp = c.post(f"{vllm_like}/v1/completions", content=b"nope")
        rec.head(r, time.monotonic(), resp.status_code, False)
        rec.chunk(r, time.monotonic(), resp.content)
        rec.end(r, time.monotonic())
    rep = rec.report()
    assert rep.status_4xx_total == 1 and rep.requests == 0 and rep.ttft_p99_ms is None


def _gauge(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


@pytest.mark.llama
def test_a_real_llama_server_stream(llama_server, tiny_model, procs: Procs) -> None:
    """llama-server's OpenAI chat stream through the recorder: its first token is not its role chunk (when it
    sends one), every token after it is one gap, and the figures are the client's own."""
    port = free_port()
    p = procs.start([llama_server, "-m", tiny_model, "-t", "1", "-c", "512", "--host", "127.0.0.1", "--port",
                     str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _status(f"{url}/health") == 200, 60, what="llama-server health")
    rec = LatencyRecorder()
    with httpx.Client(timeout=60) as c:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 24,
                "ignore_eos": True}  # fmt: skip
        sent = time.monotonic()
        contents: list[float] = []
        r = rec.begin(sent)
        with c.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            rec.head(r, time.monotonic(), resp.status_code, is_stream_content_type(resp.headers["content-type"]))
            for data in resp.iter_raw():
                now = time.monotonic()
                rec.chunk(r, now, data)
                if b'"content":"' in data and b'"content":""' not in data:
                    contents.append(now)
        rec.end(r, time.monotonic())
    rep = rec.report()
    assert rep.status_2xx_total == 1 and contents
    assert rep.ttft_p99_ms == pytest.approx((contents[0] - sent) * 1000, rel=0.011)
    assert rep.itl_hist is not None and rep.itl_hist.counts is not None
    assert 1 <= rep.itl_hist.counts[-1] <= len(contents) + 2  # a gap per chunk after the first token
    procs.kill(p)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None
