"""Test double for llama-server that is still loading: /health answers 503 (a big model loading) for
ever, or, with READY_AFTER_S in the environment, for that many seconds and then 200 (with idle
/metrics). Accepts llama-server's flags; only --host/--port are used."""

import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY_AT = time.monotonic() + float(os.environ.get("READY_AFTER_S", "inf"))
METRICS = b"llamacpp:n_decode_total 0\nllamacpp:requests_processing 0\nllamacpp:tokens_predicted_total 0\n"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ready = time.monotonic() >= READY_AT
        body = b'{"error":{"code":503,"message":"Loading model"}}'
        if ready:
            body = METRICS if self.path == "/metrics" else b'{"status":"ok"}'
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


argv = sys.argv
ThreadingHTTPServer((argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])), Handler).serve_forever()
