"""What a reader may spend on untrusted input: one place, each budget with its unit and its reason.

Untrusted: whatever another local user, a group member or another host controls. docs/trust.md says what
each surface promises against a hostile peer. (Issue 17; each part adds its own section.)
"""

from __future__ import annotations

# -- HTTP: `serve`'s clients --------------------------------------------------------------------------------

SERVE_HEADER_DEADLINE_S = 2.0  # request line + headers: a scraper sends them in one packet; a slowloris never does
SERVE_REQUEST_DEADLINE_S = 5.0  # a whole request, the reply written included (a slow reader is cut off here)
SERVE_MAX_CONNECTIONS = 256  # open connections; a coroutine each (a few KiB), not a thread
SERVE_MAX_HEADER_BYTES = 16 * 2**10  # request line + headers: a GET of ours needs < 1 KiB
SERVE_MAX_QUERY_CHARS = 1024  # `?gpu_key=K`: a key is at most 64 characters
SERVE_MODEL_MAX_AGE_S = 0.5  # concurrent scrapes share one collect no older than this (Prometheus scrapes >= 1 s)
SERVE_COLLECT_THREADS = 2  # collects and renders run here, off the event loop (one at a time: single-flight)

# -- HTTP: `--remote` hosts (another host's `serve`, or anything at that URL) ----------------------------------

REMOTE_DEADLINE_S = 2.0  # one host's whole fetch (connect, status line, headers, body); httpx's per-read
#                          timeouts alone let a host that drips a byte every 0.5 s hold us for hours
REMOTE_MAX_REPLY_BYTES = 2 * 2**20  # a full report of MAX_GPUS x 16 peers is ~0.5 MB
REMOTE_MAX_JSON_DEPTH = 16  # a report nests 6 deep (doc.gpus[].peers[].window_us[]); 10^5 deep was a RecursionError
REMOTE_MAX_GPUS = 128  # GPUs shown per host (more are counted in one error row); 3,000 froze the UI
REMOTE_MAX_ERRORS = 64  # the host's own segment errors shown (more are counted)
REMOTE_MAX_TEXT_CHARS = 256  # a name, key, segment or error string from the host (longer is cut)
REMOTE_RETRY_S = 5.0  # a host that failed is asked again after this long (its error row stays meanwhile)
