"""Test double for llama-server that never finishes loading: /health answers 503 for ever (a big
model still loading). Accepts llama-server's flags; only --host/--port are used."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"error":{"code":503,"message":"Loading model"}}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


argv = sys.argv
ThreadingHTTPServer((argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])), Handler).serve_forever()
