"""A stand-in engine that speaks vLLM's HTTP API (the OpenAI-compatible server), with delays set by the test, so
latency figures can be checked against known ones. It knows nothing of gpushare.

    python -m testkit.engines.openai_engine --port N [--host 127.0.0.1] [--ttft-ms 200] [--itl-ms 20]
        [--tokens 16] [--max-running 4] [--load-s 0] [--model test-model]

- `POST /v1/completions` and `POST /v1/chat/completions`: `stream: true` answers Server-Sent Events as vLLM does
  (chunked transfer coding, one event per write): a chat stream begins at once with a role-only delta
  (`{"role": "assistant", "content": ""}`), then after the TTFT one event per token `--itl-ms` apart, a last event
  with `finish_reason` (and `usage` when `stream_options.include_usage`), then `data: [DONE]`. Not streamed: one
  JSON reply (`choices[0].message.content` or `.text`, `usage`) after TTFT + (tokens - 1) x ITL. `max_tokens`
  sets the tokens (default `--tokens`); the body's `test_ttft_ms` / `test_itl_ms` override the delays for that
  request. A body that is not a JSON object: 400 with vLLM's error shape.
- At most `--max-running` requests are worked on at once; the rest wait (queued, FIFO), and their TTFT includes
  the wait, as in an engine whose batch is full.
- `GET /health`: 503 for the first `--load-s` seconds, then 200 with an empty body (vLLM's).
  `GET /v1/models`: the model. `GET /metrics`: vLLM's gauges `vllm:num_requests_running` and
  `vllm:num_requests_waiting` (label `model_name`) and counters `vllm:generation_tokens_total`,
  `vllm:request_success_total` (label `finished_reason`).
Prints `ready <port>` once it serves 200. SIGTERM/SIGINT: exits."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from testkit.engines import JsonHandler

WORD = " tok"


class Engine:
    def __init__(self, *, model: str, ttft_ms: float, itl_ms: float, tokens: int, max_running: int, load_s: float):
        self.model = model
        self.ttft_ms, self.itl_ms, self.tokens = ttft_ms, itl_ms, tokens
        self.ready_at = time.monotonic() + load_s
        self.slots = threading.Semaphore(max_running)
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                             registry=self.registry).labels(model)  # fmt: skip
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
                             registry=self.registry).labels(model)  # fmt: skip
        self.generated = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                 registry=self.registry).labels(model)  # fmt: skip
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=self.registry)  # fmt: skip

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(doc: dict | str) -> bytes:
    return b"data: " + (doc if isinstance(doc, str) else json.dumps(doc)).encode() + b"\n\n"


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _error(self, status: int, message: str) -> None:
            doc = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
            self._reply(status, json.dumps(doc).encode())

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/health":
                self._reply(200 if engine.ready() else 503, b"")
            elif path == "/v1/models":
                doc = {"object": "list", "data": [{"id": engine.model, "object": "model", "owned_by": "vllm"}]}
                self._reply(200, json.dumps(doc).encode())
            elif path == "/metrics":
                self._reply(200, generate_latest(engine.registry), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._reply(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            path = urlparse(self.path).path
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._reply(404, b'{"detail":"Not Found"}')
                return
            if not engine.ready():
                self._error(503, "the model is loading")
                return
            try:
                req = json.loads(raw)
            except ValueError:
                req = None
            if not isinstance(req, dict):
                self._error(400, "the body must be a JSON object")
                return
            chat = path.endswith("/chat/completions")
            n = int(req.get("max_tokens") or req.get("max_completion_tokens") or engine.tokens)
            ttft_s = float(req.get("test_ttft_ms", engine.ttft_ms)) / 1000
            itl_s = float(req.get("test_itl_ms", engine.itl_ms)) / 1000
            engine.waiting.inc()
            with engine.slots:
                engine.waiting.dec()
                started = time.monotonic()  # the delays count from here: a wait for a slot comes before them
                with engine.running.track_inprogress():
                    if req.get("stream"):
                        self._stream(req, chat, n, started, ttft_s, itl_s)
                    else:
                        self._whole(chat, n, started, ttft_s, itl_s)

        def _whole(self, chat: bool, n: int, started: float, ttft_s: float, itl_s: float) -> None:
            time.sleep(max(0.0, started + ttft_s + max(0, n - 1) * itl_s - time.monotonic()))
            text = WORD * n
            choice: dict = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
            doc = {"id": _id(chat), "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": engine.model, "choices": [choice], "usage": usage}  # fmt: skip
            engine.generated.inc(n)
            engine.success.labels(engine.model, "length").inc()
            self._reply(200, json.dumps(doc).encode())

        def _stream(self, req: dict, chat: bool, n: int, started: float, ttft_s: float, itl_s: float) -> None:
            rid, created = _id(chat), int(time.time())
            kind = "chat.completion.chunk" if chat else "text_completion"

            def doc(choice: dict, **more: object) -> dict:
                return {"id": rid, "object": kind, "created": created, "model": engine.model, "choices": [choice],
                        **more}  # fmt: skip

            def token(text: str, finish: str | None = None) -> dict:
                body = {"delta": {"content": text} if text else {}} if chat else {"text": text}
                return doc({"index": 0, **body, "logprobs": None, "finish_reason": finish})

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                if chat:  # vLLM's first chat chunk: the role, at once, before any token
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    self.wfile.write(_chunk(_event(doc({**role, "finish_reason": None}))))
                for k in range(n):
                    time.sleep(max(0.0, started + ttft_s + k * itl_s - time.monotonic()))
                    self.wfile.write(_chunk(_event(token(WORD))))
                    engine.generated.inc()
                last = token("", "length")
                options = req.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    last["usage"] = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
                self.wfile.write(_chunk(_event(last)) + _chunk(_event("[DONE]")) + _chunk(b""))
                engine.success.labels(engine.model, "length").inc()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client left: vLLM aborts the request

    return Handler


def _id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", default="test-model")
    ap.add_argument("--ttft-ms", type=float, default=200.0, help="request received -> first token")
    ap.add_argument("--itl-ms", type=float, default=20.0, help="between two tokens")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per reply unless max_tokens says")
    ap.add_argument("--max-running", type=int, default=4, help="requests worked on at once (the rest wait)")
    ap.add_argument("--load-s", type=float, default=0.0, help="seconds /health answers 503 (loading)")
    a = ap.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a background job of a shell starts with it ignored
        signal.signal(sig, lambda *_: sys.exit(0))
    engine = Engine(model=a.model, ttft_ms=a.ttft_ms, itl_ms=a.itl_ms, tokens=a.tokens, max_running=a.max_running,
                    load_s=a.load_s)  # fmt: skip
    server = ThreadingHTTPServer((a.host, a.port), make_handler(engine))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(max(0.0, engine.ready_at - time.monotonic()))
    print("ready", a.port, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
