"""What a reader may spend on input it does not trust: one place for every budget (time, bytes,
count, depth), each with its unit in its name and the reason for its value (design.md, "Budgets
at the boundary"). docs/trust.md says what each surface promises against a hostile host.
"""

from __future__ import annotations

# -- control sockets (core/pacing/control.py) --------------------------------------------------------

# A client of the control socket writes its one request line right after connecting; even a
# loaded 2-core box delivers it within milliseconds. A connection that sends nothing holds one of
# the MAX_CONNECTIONS workers this long, so a flood of idle clients delays others by at most this.
CONTROL_REQUEST_READ_S = 1.0

# The CLI (`status`, `weight`, `stop`, `logs`) retries a "busy" reply (every worker held) for this
# long: longer than CONTROL_REQUEST_READ_S, so a flood of idle connections has timed out by then;
# short enough that a sustained flood ends in one line, not a hang.
CONTROL_BUSY_RETRY_S = 5.0
CONTROL_BUSY_BACKOFF_FIRST_S = 0.05  # the first wait before a retry; doubled each time
CONTROL_BUSY_BACKOFF_MAX_S = 0.5  # no wait longer than this: the flood may clear at any moment

# An engine named on the command line (`status chat`) is looked up by asking the control sockets in
# our runtime directory for their `status`, one after another: at most this many are asked.
CONTROL_NAME_LOOKUP_MAX = 256

# -- accounting: what peers' busy counters may add (core/observe/accounting.py) -----------------------

# A peer's busy_total_us is published at heartbeats (~0.5 s), so between two reads it may rise by more
# than the time between them: by up to this much more, once. The GPU's busy total (the sum of every
# peer's rise) is a bucket of wall time with at most this carried over: over any span T it rises by at
# most T + ACCOUNTING_BUSY_SLACK_S, whatever a peer writes (a counter jumping by 1e15 a second).
ACCOUNTING_BUSY_SLACK_S = 1.0

# -- a joined segment a group member shrinks under us (core/registry/membership.py) -----------------------

# An engine whose (group-shared) segment is truncated under it re-extends it, rewrites its header and
# re-claims its slot, one line each time; a member truncating it again and again gets this many repairs a
# minute, after which the engine runs unpaced (one line) rather than spend itself on the fight.
SEGMENT_REPAIRS_PER_MIN_MAX = 10

# -- Extension 1: what a priority peer may take from a waiting member (core/schedule/ext1.py) ----------

# A member kept waiting by PRIORITY allows the holders S_P of its own windows over the last second plus
# this much before it decides without their priority (registry-abi.md §7, HoldOffCheck): an honest owner
# clears its bit at 0.8 S_i, within a step or a pace-loop round (a supervisor of a sampled engine learns of its
# running ~50 ms late, and up to ~100 ms short at a burst's start), and a burst may land on our windows more
# than on others'. Smaller is a floor sooner against a liar; it must stay above what an honest holder
# overshoots: honest bursts of 0.3-3 s at 1:1, 3:1, 1:1:1 never trip it with the holder's busy up to 250 ms
# late, 400 ms late does (tests/test_schedule_ext1.py); real supervised holders tripped it 0 times
# (tests/test_latency_class.py). Larger thins the floor a liar leaves: at 1:1 the waiting member runs at
# least W - (W/2 + this) of each second, W ~ 0.5 s (0.2 s now; the hostile tests require 0.1 s).
PRIORITY_HELD_OFF_SLACK_US = 50_000

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

# -- files and directories (issue 17, part "paths") ---------------------------------------------

CONFIG_MAX_BYTES = 1024 * 1024  # a real `up` config is a few KiB: 1 MiB is far more than any, and bounds a hostile one
ENGINES_PER_KEY_MAX = 16  # the registry has 16 slots: a 17th engine on one key could never join
LOG_TAIL_MAX_BYTES = 1024 * 1024  # `logs -n N` reads at most the log's last 1 MiB: a tail is for a person to read
LOG_OUTPUT_MAX_BYTES = 4 * 1024 * 1024  # and writes at most 4 MiB (a NUL becomes a 3-byte U+FFFD, a tab 8 spaces)
LOG_FOLLOW_READ_MAX_BYTES = 1024 * 1024  # `logs -f` reads at most 1 MiB per poll (a burst skips ahead, as the L pane)
LOG_ROTATE_BYTES = 16 * 1024 * 1024  # an engine log this long when a run starts on it is moved to LOG.1 (one kept)
LOG_FILES_PER_NAME_MAX = 8  # `run`/`launch` logs of one engine name (one file per run) kept; older ones not open go

# -- segments (any local user can create /opencoti-gpu-* in /dev/shm; a share group's members write ours) --

# A torn slot (odd or changing seqlock word) is re-read this many times in all, with no sleep between: a
# live writer finishes its seqlock write in nanoseconds; one descheduled mid-write, or a static file with
# odd words, must cost a reader microseconds, not a sleeping back-off (what is still torn is reported).
SEQLOCK_REREADS = 2

# A segment ours alone (our uid, not writable by others) is written only by our own processes: a slot
# still torn after those re-reads is a writer descheduled mid-write (seen once in a full suite on a
# loaded box: a fresh reader then showed a live engine's slot as free). Such a read waits for it, at
# most OWN_TORN_WAITS x OWN_TORN_WAIT_S; a segment others can write never waits.
OWN_TORN_WAIT_S = 0.001
OWN_TORN_WAITS = 20

# Foreign segments (not our uid, not root's, not our share group's, not the --gpu-key named) read per
# refresh at most: the dashboard, --once and serve show this many, and count the rest as not shown. Each
# shown segment is a dashboard panel (timeline, plots, up to 16 rows): measured on 2 quiet cores beside
# 2,000 and 10,000 live foreign segments, our own rows took 0.6-3.3 s to appear at 64, 0.45-1.0 s at 16.
FOREIGN_SEGMENTS_SHOWN_MAX = 16

# Wall time one refresh may spend reading foreign segments (ours are read first, outside this budget):
# the dashboard refreshes every second and our own rows must be shown within it.
FOREIGN_READ_BUDGET_S = 0.25

# With --all-owners (no count cap) one refresh still stops reading foreign segments after this long.
FOREIGN_READ_BUDGET_ALL_OWNERS_S = 5.0

# -- supervised engines' own endpoints and logs (core/engines/activity/, core/engines/health.py) --

# One activity probe of an engine's /metrics (llama-server, or a gauge at --metrics-url): a probe goes out
# only inside the engine's window (PROBE_MARGIN_US before its end), and the monitor's other duties wait
# for it; an answer later than this is no answer.
ENGINE_PROBE_DEADLINE_S = 0.25
# vLLM's /metrics with every histogram bucket is ~50-200 KiB for one model; 4 MiB is far more than any
# real exposition and bounds one that never ends.
ENGINE_PROBE_MAX_BYTES = 4 * 2**20
# What the monitor thread may spend on a sampled source's probes (fetching and parsing an exposition), as a
# fraction of one core: a probe that cost more is followed by a longer wait (cost / this), so a 4 MB
# exposition is probed less often instead of taking most of a core (it took 0.7-0.9 of one, parsed whole
# every 50 ms). A gauge is found by scanning for its lines only; the rest is never parsed.
SAMPLED_PROBE_CPU_FRACTION = 0.05
# One readiness probe (--health-url) while the engine loads: it answers when its HTTP server is up.
HEALTH_PROBE_DEADLINE_S = 1.0
HEALTH_PROBE_MAX_BYTES = 64 * 2**10  # the body is not used: a /health reply is a few bytes
# --health-log: the log is read incrementally, at most this much per 0.1 s poll (a burst skips ahead to
# its last bytes, as `logs -f` does); a line longer than logtail.MAX_LINE_BYTES is matched in pieces.
HEALTH_LOG_READ_MAX_BYTES = 1024 * 1024

# -- the front proxy on a supervised llama-server's public port (core/engines/front_proxy.py) ----------
# Anyone who can reach the engine's port is its client: these bound what one of them may hold. None bounds
# the engine's own reply: a response is awaited as long as the engine keeps its connection open and the
# client keeps its own (a non-streamed completion may compute for many minutes; llama-server's --timeout
# bounds its socket reads and writes, not a reply's compute time).

PROXY_MAX_HEAD_BYTES = 64 * 2**10  # a request's or a response's head (line + headers): a real one is < 4 KiB
PROXY_HEAD_DEADLINE_S = 10.0  # a request head, from the connection (or its first byte) to its blank line
PROXY_IDLE_KEEPALIVE_S = 60.0  # a kept-alive client connection with no request begun is closed after this
# A request body with no byte for this long is cut (408, both connections closed). DEMAND is raised only at a
# body's end, so a stalled body never holds one; this bounds the connection (and the engine's HTTP thread it holds).
PROXY_BODY_IDLE_S = 30.0
PROXY_UPSTREAM_CONNECT_S = 5.0  # connecting to the engine's internal port (localhost: ms, unless it is stopped)
# Client connections open at once. Each holds 2 fds (client, engine); the cap is also held below the soft
# RLIMIT_NOFILE less PROXY_FD_HEADROOM, so the supervisor's other threads (the monitor's /proc and HTTP reads,
# the control socket, logs) never meet EMFILE. At the cap the oldest connection that has no request in flight
# (idle, or still sending its head) is closed for a newcomer; when none is, newcomers wait in the backlog.
PROXY_MAX_CONNECTIONS = 512
PROXY_FD_HEADROOM = 64  # fds kept for the rest of the supervisor (the control socket alone may hold 17)
PROXY_ACCEPT_BACKOFF_S = 0.05  # after accept() failed for want of fds (EMFILE, ENFILE): no busy loop
# Connections accepted in one wake of the listening socket: each is served from its accept (its request, when
# whole in its first bytes, sent on there), so a flood is taken this many at a time, the proxy's other
# connections served between (a wake of 16 costs the loop ~5-10 ms at most).
PROXY_ACCEPTS_PER_WAKE = 16
# Bytes read ahead from a client while its request is answered (the next pipelined requests); past this the
# client is not read until the reply ends (TCP back-pressure), so pipelining costs at most this much memory.
PROXY_PIPELINE_BUFFER_BYTES = 64 * 2**10
PROXY_PROPS_MAX_BYTES = 256 * 2**10  # a /props reply parsed to add opencoti.gpu_share (~5-20 KiB); larger: unchanged
# A request's bytes kept while it is answered, so that it can be sent again when the engine closed the kept-alive
# connection it went on (as idle, while the request crossed); a request whose body passes this is not kept, and
# gets 502 in that case. Memory: at most this per connection in flight (llama-server's requests are < 64 KiB).
PROXY_RESEND_MAX_BYTES = 256 * 2**10
PROXY_SEED_VIEW_MAX_AGE_S = 0.25  # /gpu/peers and /props share one read of the segment at most this old
# A request that comes while the engine (re)loads its model waits for it this long, then gets 503 (GET /health is
# answered 503 at once). Loading a model from a local disk takes seconds to a few minutes; the waiting connections
# count against PROXY_MAX_CONNECTIONS like any other.
PROXY_ENGINE_WAIT_S = 300.0
# A streamed reply is relayed by a C thread (core/engines/_relay.c) from its response head on: what the client
# has not taken yet is kept up to this much per stream, then the engine is not read until the client takes some
# (TCP back-pressure, as the loop's transports do at their high-water mark).
PROXY_RELAY_OUT_MAX_BYTES = 64 * 2**10
# ... and the arrival times it records (a token each) reach the latency figures within this (or at 256 kept).
PROXY_RELAY_TIMES_FLUSH_S = 0.25
# ... and until the loop has found the stream's first token in them, its reads are also kept for it (what is a
# token is the latency recorder's rule): up to this many bytes per stream (and the read that passed it, at most
# 64 KiB), then the engine is not read until the loop has looked (it is told within PROXY_RELAY_TIMES_FLUSH_S, or
# at half of this). A 96-token stream of llama-server's (~14 KiB) is looked at once, at its end.
PROXY_RELAY_HOLD_MAX_BYTES = 64 * 2**10

# -- latency as clients see it (core/observe/latency.py: fed by the front proxy; the `status` reply's `latency`) --

# The last-minute figures are a ring of this many one-second slots, each a fixed array of counts per figure:
# the memory is fixed whatever the request rate (60 x 3 x ~1050 x 4 bytes, ~0.75 MB per engine).
LATENCY_WINDOW_S = 60
# A streamed reply's first token is the first SSE chunk that carries text (an OpenAI stream begins with a
# role-only delta: counting it would make TTFT the engine's queueing, not its prefill). The chunks are parsed
# for that up to this many bytes per request (a first event is ~100-300 bytes); past it, the next chunk counts.
LATENCY_FIRST_TOKEN_SCAN_MAX_BYTES = 64 * 2**10
# A `status` reply's lists, as `serve`, `--once` and the dashboard read them from an engine's control socket (any
# local process of ours may answer there): its only lists are the latency histograms' bounds and counts (vLLM's
# have 19-23 items); a longer list is no histogram (the field is None: the p50/p99 beside it are still shown).
STATUS_REPLY_LIST_MAX_ITEMS = 64

# -- who listens on an engine's port (core/host/sockets.py, core/engines/listener.py) ---------------------

# The listening sockets come from the kernel's sock_diag dump (listening ones only: ~0.1 ms of CPU a look);
# where that is refused, from /proc/net/tcp{,6}, which list every socket, listening ones first (~5 ms a
# look: the kernel walks its whole connection hash). A dump or table is read up to this much (a table
# only while its lines listen): a host with 10^5 connections has ~15 MB of table, ~150 bytes a line.
LISTEN_TABLE_MAX_BYTES = 2 * 2**20
LISTEN_TABLE_READ_BYTES = 1024  # a /proc table is read this much at a time, to stop at its first connection
# fd links read for one engine tree when its sockets are looked for (vLLM holds a few hundred per process).
TREE_FDS_MAX = 65536
# A port found the engine's is believed this long before it is looked at again (a squatter can only take a
# port the engine let go of; each look costs ~0.4 ms of CPU). A health probe looks at the answer that makes it ready.
LISTENER_RECHECK_S = 1.0

# -- an engine's process tree (core/engines/process_group.py) ----------------------------------------------

# Descendants that left the engine's process group (setsid, setpgid) paced and ended one by one, a pidfd
# each (signals never reach a reused pid): more than this are not tracked (those still in the group are
# paced with it whatever their number). vLLM and SGLang start a handful of workers, all in the group.
ESCAPED_DESCENDANTS_MAX = 64
# The engine's threads' CPU time is read at each window edge (/proc/PID/task/TID/schedstat, ~5 µs a thread) to
# say how much of the window it ran: an engine with more threads than this is not read (its windows' run is
# unknown), so a thousand threads cannot delay the pace loop's signals. llama-server runs ~10, vLLM ~100.
EDGE_THREADS_READ_MAX = 256

# A new request through the front proxy wakes the pace loop (a real-time thread) to decide at once; a client
# opening and ending requests as fast as it can would otherwise buy a round (~150-200 µs of Python at SCHED_FIFO)
# per request. Woken rounds stay this far apart (a request then waits at most this long for its decision).
PACE_WAKE_GAP_US = 2_000

# -- other users' processes (Extension 2, spec registry-abi.md §8.1: core/observe/users.py) ----------------

# A slot's user is the real uid of its pid from /proc/<pid>/status. Its Uid: and NSpid: lines come after
# Name/Umask/State/Tgid/Ngid/Pid/PPid/TracerPid (~250 bytes; Name is at most 64 escaped bytes) and the
# Groups: line, which root can make long (65,536 groups): a status read stops here, and lines not within it
# make the slot unverifiable (Extension 2 falls back), never a longer read.
PROC_STATUS_MAX_BYTES = 4096
# A slot's verified user is read again this often while its (pid, boot_us) is unchanged (a process may
# change its real uid): at most 16 status reads per second per reader, ~20 µs each.
USER_RECHECK_S = 1.0
