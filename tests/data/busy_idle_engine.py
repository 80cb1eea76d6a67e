"""Test double for one piece (the supervisor's activity monitor): an engine that
serves llama-server's /health and /metrics, never decodes, and burns a core, as
an idle engine answering probes on a loaded box can look. Accepts llama-server's
flags; only --host/--port are used."""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = b"llamacpp:n_decode_total 7\nllamacpp:requests_processing 0\nllamacpp:tokens_predicted_total 0\n"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS if self.path == "/metrics" else b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def burn() -> None:
    while True:
        pass


argv = sys.argv
host = argv[argv.index("--host") + 1]
port = int(argv[argv.index("--port") + 1])
threading.Thread(target=burn, daemon=True).start()
ThreadingHTTPServer((host, port), Handler).serve_forever()
