"""Test double for llama-server where the engine itself is not under test (control socket, signals):
serves /health and /metrics, never decodes, idle on the CPU. Accepts llama-server's flags; only
--host/--port are used."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = b"llamacpp:n_decode_total 0\nllamacpp:requests_processing 0\nllamacpp:tokens_predicted_total 0\n"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS if self.path == "/metrics" else b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


argv = sys.argv
ThreadingHTTPServer((argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])), Handler).serve_forever()
