"""What the front proxy (gpushare_tui/core/engines/front_proxy.py) costs a real llama-server's clients, beside
nginx: one engine under `gpushare-tui launch` (its supervisor runs the proxy, as users run it), reached three
ways in one run, in an order that rotates each round, each path's window cut in `--slices` taken in turn, the order
reversed at each turn (A B C C B A A B C: the engine's own rate drifts by tens of % over a minute on a shared
machine, and a drift, linear within the round, hits every path alike instead of the one whose window it falls in):

- direct: the engine's internal port;
- ours: the public port (the proxy, in a process of its own beside the supervisor);
- nginx: nginx 1.22 on the same engine, `proxy_buffering off`, HTTP/1.1 keep-alive upstream, one worker (what
  a user would put in front of it otherwise). Without nginx installed this path is skipped (one line says so).

    python -m bench.proxy [--levels 1,8,32,64] [--rounds 2] [--window-s 6] [--slices 3] [--n-predict 96]
                          [--keep-alive]
    python -m bench.proxy --mix [--control] [--levels ...] [--rounds ...] [--window-s ...]
    python -m bench.proxy --lateness [--lateness-streams 1,32]

--mix: the streams go in groups of one a path (the last group smaller), a group's members sending their requests
at the same instant, each member taking the paths in turn request by request (member j starting at path j); one
stream alone takes them in an order drawn for each round of them. Every path then meets the engine in the same
state: the slices above still leave a round's engine drift in each path's figure (the tiny model's own rate moves by
10-40 % within seconds on this shared machine: direct at one stream 1,165 then 1,596 tok/s in two 4 s windows a few
seconds apart), and requests sent at the same instant enter the same decoding step. A path's tok/s is a stream's
while on it (its tokens in the window over the seconds its requests spent there, connect to last chunk), so a
proxy's per-request cost (its TTFT, its end) counts as it would for a client that always took it. Each request is
also paired with direct's of its turn (sent with it; one stream alone: of its round of the paths): the median and
mean of its TTFT less direct's, and the median of its tokens/s over direct's. At 32 and 64 streams a TTFT is 70-280
ms of the engine's queue and a proxy's ~0.3 ms now and then moves a request to the next decoding step (~10 ms
later): each path's p50 then moves by milliseconds with where the requests land (an unpaired p50 difference read
-0.9 to +14 ms through either proxy), while the paired median reads the delay of the typical request. --control
adds the direct path a second time (`direct2`): what the comparison reads between two paths alike, its resolution.
What it cannot show: a proxy carrying all of a level's load (it carries a third of it here). With --keep-alive,
direct still connects for each request (llama-server closes each stream's connection: a request on a kept one it
closed is sent again on a new one, timed from there); ours and nginx keep the client's. CPU per token: the proxy
process's over its tokens, the supervisor's over every path's (it runs for all of them alike); read from the
processes' CPU-time clocks (ns: /proc's 10 ms ticks were ±10 % of a proxy's CPU in a short window).

Per level (llama-server `-np` = the level, `-t 1`, the tiny test model: 1,000-3,000 tok/s on this CPU, a GPU-like
rate), round and path: tokens/s received by the clients in the window (its slices, each after its own warm-up), TTFT
p50/p99 (request sent -> first token event), and CPU per streamed token: ours the supervisor's whole CPU (its proxy
process, pace loop and monitor included), its proxy's alone (its process; a thread named gpushare-proxy before it had
one), and its proxy's with what the supervisor spent over its spend in the same round's direct window (the proxy's
whole cost: the pace loop and monitor run either way); nginx its worker's. Streamed `/completion`s back to back, a new
connection per request (--keep-alive: one per client). The clients are asyncio coroutines on raw sockets (cheap: on 2
shared cores a heavier client would measure itself). Prints a table per round and a summary per level; writes
bench/results/proxy.json.

Measured here, 2026-12-05 05:34 (2 cores shared with other engineers' jobs, load average 1.6-2.3 through the
run: not quiet; 6 s windows, 2 rounds, 96 tokens, a new connection per request; medians of the rounds):

    streams   CPU µs/token: ours (supervisor + proxy) / its proxy alone / nginx    tok/s vs direct: ours / nginx
    1         102 / 72 / 37   (2.8× / 2.0× nginx)                                   97.5 % / 99.4 %
    8          43 / 32 / 20   (2.2× / 1.65×)                                        96.7 % / 98.7 %
    32         52 / 39 / 27   (1.9× / 1.45×)                                        96.6 % / 97.7 %
    64         50 / 37 / 26   (1.9× / 1.40×)                                        99.0 % / 99.2 %

TTFT p50 ours − direct: +1.0, +3.1, +22 (a direct round at 66 ms against ~105), +6 ms. The code before (h11 for
every chunk, asyncio, a thread of the supervisor), load 2.1-5.1: ours 190 / 82 / 92 / 103 µs (4.8× / 4.1× /
3.7× / 3.2× nginx). What is left at 1 stream: ~30 µs/token of the supervisor itself (pace loop and monitor, not
the proxy), the proxy's per-request h11 work (~350 µs a request) and its per-wake cost (uvloop and Python around
one read and one write: ~25-35 µs over nginx's, cache-cold).

2026-12-06 08:11, load 0.7-2.7 (medians of 2 rounds; proxy alone / nginx): 1 stream 37.8 / 12.3 µs (3.1×), 8:
19.6 / 11.6 (1.7×), 32: 22.7 / 14.2 (1.6×), 64: 39.6 / 32.3 (1.2×); the supervisor beside it 4-14 µs a token
more (its own loops: fixed per second, not per token). A proxy whose sockets were driven by add_reader/add_writer
(recv and send from Python) instead of uvloop's transports measured no cheaper (09:13, load 1.0-3.0, 3 rounds:
44 / 11.6, 22.5 / 12.4, 25.6 / 18.2, 28.8 / 18.6) and was not kept. Syscalls per token are nginx's (perf trace,
1 and 8 streams: one epoll_wait, one read, one write per token; ~40 more per request: accept, connect, close -
llama-server closes its connection after each streamed reply, for nginx too). What differs: the CPU around them
(perf, 1 stream: Python ~19 µs a token cache-cold; 1.6 context switches a token against nginx's 1.1: the client
woken by our write preempts us before we sleep) and the per-request work (cProfile: ~1,100 Python calls a
request, a third in h11's head parsing; ~0.3 ms a request warm: 3 µs a token at 96 tokens, more cache-cold).
--lateness the same day (load 1.7-2.3, 8 s windows; p50/p99/max µs at 1 and 32 streams): main's code 540/821/859
and 526/849/966, the add_reader proxy 532/795/815 and 508/782/848: in its own process, the proxy's streams leave
the pace loop's edges alone.

2026-12-06 11:30-12:15 (load 1.3-2.6 throughout: not quiet), where a stream's proxy CPU goes, with a harness (one
llama-server, ProxyProcess in front, this file's clients; proxy process CPU per token; 5 s windows). A bare uvloop
byte relay (no HTTP, a Protocol writing each read to the other side) costs about nginx: 1 stream 17.8-22 µs a token
against nginx's 13-17, 8 streams 12.9 against 11.1; so the floor of a Python proxy on uvloop is near nginx, and
what ours costs over it is its own Python. Split by tokens per request (n_predict 16 and 400, 1 stream): ours ~21-26
µs a token and ~1.1-1.3 ms a request, nginx ~9-15 µs and ~0.2-0.35 ms: per request ~1,100 Python calls
(h11: parsing the request and the response head, serialising both heads - its response clean-up validates every
header about four times - and its state machine), per token the relay's frames. A read that is one whole chunk now
takes one step (feed -> recorder -> write: 1.55 -> 0.84 µs warm); A/B in one job (load 1.6-2.2, 2 reps each):
1 stream 44.3 / 41.2 -> 37.2 / 35.4 µs a token, 8 streams 21.2 / 20.2 -> 18.6 / 18.9 (nginx 9.5-17.2 beside).
What is left is per request: at 8 or more streams ~1 ms a request is about half of ours; a C head parser
(httptools) for the request and the response heads, writing the heads ourselves, is the next lever.

2026-12-06 14:15-15:00, the per-request cost (harness: FrontProxy alone in a child process, a canned upstream
shaped as llama-server - its head, one event chunk, closing after each streamed reply - one request after
another, a new connection each; the proxy process's CPU a request from /proc schedstat, 8 batches of 100 per
round, p25 of the batches; A/B alternating in one cpu-turn job). Where a request went (cProfile, 1,214 Python
calls a request): h11 on both sides ~680 calls (warm: ~55 µs the client's server side, ~37 µs the engine's
client side), asyncio.timeout on each read ~10 µs, the accept/connect/close syscalls and uvloop's transports
(a bare uvloop relay: 162-166 µs a request, load 0.75), the latency recorder's first token (one json.loads)
and the DEMAND line a few µs each; the upstream connect is already cheap (uvloop skips getaddrinfo for an IP
literal: 24 µs a connect, accept and close together). Kept, one at a time:
- the engine's side on llhttp (httptools): its request head and body framing written by us, its response head
  parsed by httptools.HttpResponseParser: 966 calls a request; load 0.69-0.96: main p25 650-724 µs a request,
  this 512-759 (noisy), min 495-534 against 505-641;
- the client's side on llhttp too (`_RequestReader`: heads, bodies, trailers, pipelining; responses framed by
  `_Client` as h11 framed them): 537 calls a request; same job: 441-485 µs (-33% on main);
- a read's deadline as a timer that fails its wait (not asyncio.timeout), the loop kept per connection: load
  1.29-1.52, p25 419-434 against 433-486 (-4%).
With a real llama-server under `gpushare-tui launch` (1 stream, 4 tokens a request, ~165 requests/s, 5 s
windows, 3 rounds each, alternating, load 1.1-2.2): the proxy process 706-747 µs a request against main's
903-985 (-22%; ~20 µs of each token included). The supervisor beside it spends 245-299 µs a request over idle,
the same on both: 122-159 µs with the pace loop's wake on each DEMAND rise taken out (a copy, not kept: the
pacing code is not this file's), so ~120 µs is that wake and the rest the control line's reader thread (~60 µs
for a request's two lines, measured with a trivial callback) and the membership write. llhttp is stricter than
h11 was (docs/trust.md): bare-LF heads, obs-fold, duplicate or conflicting lengths, Content-Length beside
Transfer-Encoding get 400, a request head over the budget in one read 431, an Upgrade request with a body 400.
`python -m bench.proxy --levels 1,8,32,64 --rounds 2`, this branch then main back to back (14:48-14:54, load
1.4-3.4 through both: not quiet; medians of 2 rounds, µs a token, proxy alone / nginx):

    streams   this branch            main
    1         44.2 / 31.0 (1.43x)    39.6 / 13.1 (3.02x)
    8         19.4 / 13.0 (1.49x)    20.5 / 12.5 (1.64x)
    32        23.6 / 17.4 (1.36x)    20.8 / 14.7 (1.41x)
    64        23.6 / 17.5 (1.35x)    23.1 / 16.5 (1.40x)

again 15:20-15:27 (load 1.4-2.5; the branch with the trailers' budget, the same hot path):

    streams   this branch            main
    1         34.4 / 12.6 (2.74x)    37.4 / 12.7 (2.95x)
    8         19.8 / 12.9 (1.53x)    21.7 / 13.0 (1.67x)
    32        21.2 / 15.5 (1.36x)    24.2 / 17.7 (1.37x)
    64        25.2 / 16.7 (1.51x)    27.5 / 18.9 (1.46x)

at these loads the per-token figures of the two are within each other's noise (a request's ~200 µs saved is ~2 µs
a token at 96 tokens: 8-12% lower in the second run, not in the first); the per-request A/Bs above are the
measurement of this change. What is left a request: the kernel's and uvloop's part (accept, two transports,
connect, close: the bare relay's ~165 µs in the harness), ~250 µs more in ~540 Python calls and their syscalls
(the accept task, the futures a request waits on, the recorder, the DEMAND line), and the supervisor's ~250 µs
of DEMAND.

2026-12-06 17:45-17:50, the C relay (core/engines/_relay.c: a stream's tokens after its first relayed by a C thread)
and the supervisor's cheaper DEMAND (a rise wakes the pace loop only where a peer may share; DEMAND falls 5 ms after
the last request), load 1.2-2.6 (5.4 in the 64-stream rounds), 3 rounds, medians; µs of CPU a token: ours all (the
supervisor and its proxy process) / its proxy process / the proxy and what the supervisor spent over its spend in
the direct window (the proxy's own cost: the pace loop and monitor run either way) / nginx:

    streams   ours all / proxy / proxy + supervisor's extra / nginx      tok/s vs direct   TTFT p50 ours − direct
    1         33.5 / 22.9 / 23.9 / 12.7   (2.64× / 1.81× / 1.88×)      97.0 %            +0.58 ms
    8         21.2 / 17.5 / 18.3 / 13.1   (1.62× / 1.33× / 1.40×)      101.3 %           +0.57 ms
    32        23.2 / 19.5 / 19.5 / 16.9   (1.37× / 1.15× / 1.15×)      101.9 %           +2.04 ms
    64        30.2 / 24.2 / 25.2 / 22.1   (1.37× / 1.10× / 1.14×)      96.2 %            −20.4 ms

Before them (the same day, 16:00, load 0.6-2.2): the proxy alone 39.8 / 21.4 / 23.0 / 26.6 µs (2.84× / 1.62× /
1.22× / 1.44×), ours all 58.2 / 26.6 / 28.4 / 34.2. At one stream the C relay thread costs ~9.5-12 µs a token (one
epoll_wait, recv and send, as nginx's worker) and the proxy's loop ~1.2 ms a request (~5 wake-ups: the request, the
response head, the first token, the relay's report, the connections' ends; perf: half of it the interpreter, 15 %
the context switches): 12.5 µs a token at 96 tokens, what is left between it and nginx.

2026-12-06 19:55-21:05, the stream handed to the C relay at its response head (the first token relayed there, its
reads kept for the recorder until it has found the first token) and the last chunk written there, 3 rounds, medians
(µs of CPU a token: ours all / proxy / proxy + supervisor's extra / nginx):

    19:55, load 0.9-3.7   streams 1: 33.5 / 22.7 / 22.7 / 14.5 (2.32× / 1.57× / 1.57×)  100.5 %  TTFT +0.44 ms
                                  8: 21.2 / 17.3 / 17.3 / 13.6 (1.56× / 1.27× / 1.27×)  101.0 %        +0.69 ms
                                 32: 27.1 / 22.0 / 22.5 / 17.6 (1.54× / 1.25× / 1.28×)  100.6 %        +1.82 ms
                                 64: 31.7 / 25.4 / 26.1 / 22.8 (1.39× / 1.11× / 1.15×)   94.8 %       +28.7 ms
    21:00, load 0.6-4.9   streams 1: 39.9 / 27.4 / 27.4 / 16.7 (2.39× / 1.64× / 1.64×)   99.4 %  TTFT +0.68 ms
                                  8: 24.0 / 19.2 / 19.2 / 15.5 (1.56× / 1.24× / 1.24×)  103.4 %        +0.65 ms
                                 32: 28.6 / 22.7 / 22.7 / 19.0 (1.51× / 1.20× / 1.20×)   99.7 %        +4.52 ms
                                 64: 31.1 / 23.7 / 23.7 / 21.4 (1.46× / 1.11× / 1.11×)   98.4 %        -1.58 ms

(the machine itself ran slower in the second: nginx too; A/Bs of the proxy's threads in one job,
alternating with the code before, showed no change between the two commits). In the proxy's own setup (the loop
thread's CPU a token, 1 stream, 3 rounds each, alternating, load 1.1-1.5): 13.5 / 14.1 / 14.5 µs before, 12.7 /
12.6 / 12.5 after, its wake-ups 81-82 a second -> 57-59; the C relay's thread 11.5-13.7 -> 11.9-15.4 (noise: its
one wake-up a token is the same). With 400 tokens a request (19:58, 2 rounds, load 1.1-2.2) the proxy is 18.4 µs a
token at 1 stream (1.32× nginx's 13.9) and 18.3 at 8 (1.15×): at 96 tokens, one stream, the proxy's ~1 ms of CPU a
request is what stands between it and 1.5× (nginx's is ~0.2-0.3 ms). Where that 1 ms goes (perf: the interpreter
half, the kernel 30 %: accept, connect and close of two connections, three sends, ~4.5 wake-ups a request;
uvloop 10 %, llhttp 3 %); tried and not kept: a connect without uvloop's create_connection (82-116 against 93-108 µs
a connect), accepts from a reader left on the listening socket instead of sock_accept (43-65 against 58-73 µs).

2026-12-07 06:18-07:35, another machine (an AMD EPYC under KVM, where a wake-up costs 2-3× the last one's: nginx
23-46 µs a token), --mix, 3 rounds, medians (tok/s vs direct, ours / nginx; CPU µs a token: the proxy process /
nginx; TTFT p50 ours − direct), a new connection per request, 20 s windows, load 0.7-3.7:

    streams   tok/s vs direct         CPU: proxy / nginx        TTFT p50 ours − direct
    1         96.4 % / 99.1 %         41.2 / 31.9 (1.29×)       +0.65 ms
    8         99.7 % / 100.0 %        45.5 / 39.5 (1.15×)       +0.94 ms
    32        99.5 % / 100.1 %        35.3 / 34.2 (1.03×)       +2.11 ms (the engine's queue: 92-95 ms)
    64        99.6 % / 99.9 %         34.7 / 34.0 (1.02×)       +0.59 ms

and with --keep-alive, 15 s windows, load 1.0-4.9: 94.4 % / 96.6 %, 100.3 / 99.9, 99.7 / 99.5, 99.2 / 99.4; CPU
1.31×, 1.08×, 1.01×, 0.99×; TTFT +0.56, +0.30, +1.95, +13.8 ms (64 streams: ~190-230 ms of queue); nginx answered
1-11 requests a round 502 at 8 streams and more (an upstream connection llama-server had closed). At one stream
the rounds scatter by ±3 % for both proxies (direct's rate 1,160-1,720 tok/s between rounds). What one stream
still pays per request, the loop's part between the accept and the request handed to the C relay (marks in an
in-process FrontProxy, 8-token requests back to back, p50, µs): the accept to its task's first step 66-70, the
client's transport 54-58, its first read 26-32, the request's parse and exchange to `_request_in_c` ~60-100, the
engine socket and its connect ~70-110, the C relay's `request` 19-25: ~370-475 µs, against nginx's whole added
TTFT of ~200-300 µs (paired, one request at a time: ours +0.42-0.58 ms over direct, nginx +0.19-0.28); no one
step dominates (the syscalls are the largest: accept 15-24, connect 40, close 45), so what is left is the accept
and the request's head in C.

2026-12-07 09:15-10:00, the same machine: a new connection served from its accept (its first bytes read there, a
request whole in them sent on before the loop makes the socket a transport), DEMAND told once the C relay has the
request (the line to the supervisor was on its way), and the next request's engine connection connected ahead (the
connect was ~50-90 µs of the loop's time on each stream's way). Paired, one request at a time, 16 tokens, an engine
under `launch` per tree, 120 requests a path (load 1.4-1.9; TTFT and whole request ours − direct, p50 of the
pairs, ms): before +0.73 / +0.82 / +0.57 / +0.78 and +1.25 / +1.27 / +0.92 / +1.07; the first two alone +0.53 /
+0.48 / +0.45 / +0.46 and +0.74 / +0.56 / +0.79 / +0.61; all three +0.60 / +0.40 / +0.27 / +0.27 and +0.44 / +0.14
/ +0.34 / +0.09 (asyncio and blocking clients in turn). --mix after them, 20 s windows, 3 rounds, 09:55-10:01
(load 1.1-4.6: the 32- and 64-stream levels' own threads):

    streams   tok/s vs direct         CPU: proxy / nginx        TTFT p50 ours − direct (per round)
    1         98.3 % / 97.5 %         37.4 / 28.8 (1.30×)       +0.41 / +0.39 / +0.36 ms
    8         99.4 % / 99.9 %         34.2 / 27.6 (1.24×)       +0.74 / +0.36 / +0.49 ms
    32        99.3 % / 99.4 %         32.3 / 29.5 (1.10×)       -0.05 / +0.76 / +2.55 ms (nginx -0.88 / -0.80 / +3.59)
    64        99.6 % / 99.7 %         34.4 / 32.7 (1.05×)       +5.0 / +4.5 / -0.3 ms (nginx +1.9 / +14.4 / +2.2)

(at 32 and 64 streams a request's TTFT is 70-280 ms of the engine's queue, and where in it a request lands moves
its p50 by milliseconds through either proxy). Where one stream's proxy CPU goes (the proxy process's threads,
96 tokens a request): the C relay's thread ~29 µs a token (one epoll_wait, recv and send: nginx's worker ~25-28
µs in all), the loop ~0.75 ms a request.

2026-12-07 11:55-12:30, the same machine, --mix with each group's requests sent together and paired (this file's
code as it is now; the proxy's code unchanged since 9a7c359), a new connection per request, load 0.9-2.0 through one
and eight streams, 1.8-5.2 through 32 and 64 (the level's own clients, engine and proxies). One stream, 5 rounds of
60 s (tok/s vs direct, paired median in brackets; TTFT ours − direct, paired median; CPU µs a token, the proxy
process / nginx; load):

    round   ours                    nginx                   TTFT ours / nginx    CPU proxy / nginx     load
    1       99.3 % (99.4 %)         98.0 % (98.8 %)         +0.364 / +0.207      42.5 / 33.3 (1.28x)   1.43
    2       99.4 % (98.8 %)         98.8 % (98.8 %)         +0.338 / +0.207      41.2 / 31.1 (1.32x)   1.91
    3       98.2 % (98.6 %)         97.4 % (98.6 %)         +0.348 / +0.220      44.1 / 34.1 (1.29x)   1.42
    4       99.7 % (99.6 %)         98.4 % (98.1 %)         +0.435 / +0.386      45.2 / 35.3 (1.28x)   2.00
    5      100.7 % (100.2 %)        98.8 % (98.6 %)         +0.346 / +0.278      42.8 / 32.7 (1.31x)   1.28

(pooled over the rounds: ours 99.5 %, nginx 98.3 %). 8, 32 and 64 streams, 3 rounds of 30 s: tok/s ours 99.6-99.9 %
(nginx 99.4-100.0 %); TTFT paired median ours +0.009 / +0.046 / +0.075, +0.034 / +0.036 / -0.060, +0.353 / +0.274 /
+0.373 ms (nginx +0.13 / +0.13 / +0.23, +0.13 / +0.23 / +0.03, +0.44 / +0.25 / +0.69), paired mean ours -0.20 to
+0.84 ms (nginx -0.13 to +0.90); CPU the proxy 1.15 / 1.07 / 1.03x nginx (medians). The unpaired p50 differences at
64 streams read +1.4 / +1.3 / +2.7 ms for ours and -0.3 / +0.6 / -2.4 for nginx: with --control (4 paths, 30 s,
3 rounds) the direct path against itself read -0.6 / -1.7 / +0.4 ms there, and -0.04 to +0.09 ms paired at every
level: at 64 streams a p50 difference resolves no better than ~2 ms. The supervisor's own CPU is the same whichever
path carries the stream (one stream, 8 s, by thread: through ours 12.1 ms a second, direct 11.3: the pace loop's
unpaced rounds 7-7.5, the monitor 3-3.6, the proxy's control line 0.6-0.8), ~10 µs a token at this engine's rate:
the "all" column's 1.54-1.59x nginx at one stream is the proxy's 1.3x and that.

--lateness: the pacing edges' lateness (SIGCONT/SIGSTOP after their window edge: Supervisor.lateness_summary,
what `status` shows) of a supervised engine A paced against a busy peer B (two engines, weights 1:1, B with one
stream through its proxy), while A serves N streams through its proxy: what sharing the supervisor's
interpreter with the proxy costs the pace loop. (A proxied engine publishes DEMAND only from its proxy, and one
without DEMAND is not paced: the least load that has edges is one stream, the baseline.) 2026-12-07 12:13-12:20,
10 s windows, the code before the proxy had a process of its own (954ddac^: a thread of the supervisor) and this
code, alternating in one job (p50 / p99 / max µs at 1 and 32 streams; load 1.1-3.2): before 452 / 809 / 942 and
396 / 1,782 / 5,478, now 218 / 522 / 828 and 265 / 662 / 1,548; before 525 / 847 / 879 and 464 / 4,188 / 9,165,
now 232 / 572 / 662 and 262 / 574 / 1,323.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.pacing import llama_server_path
from gpushare_tui.core.engines.activity.tree import process_cpu_ns
from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.pacing import control
from testkit.shm import remove, shm_file
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CLI = [sys.executable, "-m", "gpushare_tui"]
CTX_PER_SLOT = 160  # the prompt (a few tokens) and --n-predict fit in each slot's share of -c
PATHS = ("direct", "ours", "nginx")
CONTROL = "direct2"  # --mix --control: the direct path again
KEY = f"bench-proxy-{os.getpid()}"  # its registry segment, removed at the end
PROXY_THREAD = "gpushare-proxy"  # front_proxy.THREAD_NAME (the code before it named no thread: 0)
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


@dataclass
class Run:
    tokens: int = 0  # token events received inside the window
    ttft_ms: list[float] = field(default_factory=list)
    errors: int = 0  # replies not 200 (nginx's 502 where the engine closed a kept upstream connection)


def request_bytes(n_predict: int, keep_alive: bool) -> bytes:
    body = {
        "prompt": "the a of",
        "n_predict": n_predict,
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": False,
        "logit_bias": [[t, False] for t in NON_TEXT_TOKEN_IDS],
    }
    raw = json.dumps(body).encode()
    head = b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    head += b"\r\n" if keep_alive else b"Connection: close\r\n\r\n"
    return head % len(raw) + raw


class StreamScan:
    """A reply, read by read: its token events, and whether it ended (a chunked body's last chunk, `0 CRLF CRLF`,
    or a Content-Length body's last byte: an error's, as nginx's 502). The head is read first: a head may end in
    `0 CRLF CRLF` too (llama-server's to a kept-alive request ends in `Keep-Alive: timeout=5, max=100`)."""

    def __init__(self) -> None:
        self.buf = b"\r\n"  # (the body's start counts as a chunk's end)
        self.status = 0  # the reply's, once its head came
        self.length: int | None = None  # a Content-Length body's bytes still to come
        self.done = False

    def feed(self, data: bytes) -> int:
        """The token events in `data`."""
        buf = self.buf + data
        if not self.status:
            end = buf.find(b"\r\n\r\n", 2)
            if end < 0:
                self.buf = buf
                return 0
            head, buf = buf[2:end].lower(), b"\r\n" + buf[end + 4 :]
            self.status = int(head.split(b" ", 2)[1])
            if b"transfer-encoding: chunked" not in head:
                at = head.find(b"content-length:")
                self.length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if self.length is not None:  # not a stream: its bytes counted, no token in them
            self.length -= len(buf) - 2
            self.buf, self.done = b"\r\n", self.length <= 0
            return 0
        n = buf.count(b'"content"')
        self.done = b"\r\n0\r\n\r\n" in buf
        self.buf = buf[buf.rfind(b'"content"') + 1 :] if n else buf[-16:]
        return n


@dataclass
class Reply:
    """One request's reply as a client saw it (`exchange`)."""

    scan: StreamScan
    ttft_ms: float | None = None  # request sent -> first token event
    tokens_in: int = 0  # token events in the window
    tokens_all: int = 0
    answered: bool = False  # any byte came (else the connection ended first)


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, t0: float, t1: float
) -> Reply:
    """`request` sent, its reply read to its end (`reply.scan.done`) or the connection's."""
    sent = time.monotonic()
    writer.write(request)
    reply = Reply(StreamScan())
    while not reply.scan.done:
        data = await reader.read(65536)
        if not data:
            break
        reply.answered = True
        now = time.monotonic()
        n = reply.scan.feed(data)
        if n:
            if reply.ttft_ms is None:
                reply.ttft_ms = (now - sent) * 1000
            reply.tokens_all += n
            if t0 <= now < t1:
                reply.tokens_in += n
    return reply


async def stream_loop(port: int, request: bytes, t0: float, t1: float, run: Run, keep_alive: bool) -> None:
    """Back-to-back streamed completions until t1; counts token events in [t0, t1)."""
    reader = writer = None
    while time.monotonic() < t1:
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert reader is not None
        reply = await exchange(reader, writer, request, t0, t1)
        if reply.ttft_ms is not None:
            run.ttft_ms.append(reply.ttft_ms)
        run.tokens += reply.tokens_in
        run.errors += reply.scan.done and reply.scan.status != 200
        if not reply.scan.done or not keep_alive:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


@dataclass
class PathRun:
    """One path's requests in a --mix measurement: token events in the window, the seconds its requests spent in
    the window (request sent or connection opened -> last chunk), token events over the whole measurement."""

    tokens: int = 0
    busy_s: float = 0.0
    tokens_all: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    request_ms: list[float] = field(default_factory=list)  # each whole request's, connect to last chunk
    errors: int = 0  # replies not 200


async def mixed_stream(
    ports: list[int],
    first: int,
    request: bytes,
    t0: float,
    t1: float,
    runs: list[PathRun],
    keep_alive: bool,
    together: asyncio.Barrier | None = None,
    turns: dict[int, dict[int, tuple[float, float]]] | None = None,
) -> None:
    """Back-to-back streamed completions until t1, each to the next of `ports` in turn (starting at `first`): the
    paths see the engine in the same state, request by request. `together`: the barrier this stream's group meets
    before each request (its members send at once, one a path); `turns`: each request's (TTFT ms, tokens/s from its
    connect to its last chunk) in the window, by turn and path index (a turn: one request of each member; alone,
    one of each path, in an order drawn for each such turn: in a fixed order a direct request that followed the
    other direct path's was 2-7 ms slower than that one, round after round)."""
    conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    k = first
    turn = 0
    shuffled = list(range(len(ports)))
    try:
        while time.monotonic() < t1:
            if together is not None:
                try:
                    await together.wait()
                except asyncio.BrokenBarrierError:  # a member saw the window's end
                    break
            if together is None and turns is not None:  # alone: each round of the paths in an order of its own
                if k % len(ports) == 0:
                    shuffled = random.sample(range(len(ports)), len(ports))
                i = shuffled[k % len(ports)]
            else:
                i = k % len(ports)
            k += 1
            run = runs[i]
            start = time.monotonic()
            while True:
                kept = i in conns
                if not kept:
                    conns[i] = await asyncio.open_connection("127.0.0.1", ports[i])
                reply = await exchange(*conns[i], request, t0, t1)
                if kept and not reply.answered:  # a kept connection the server closed since (llama-server closes
                    conns.pop(i)[1].close()  # each stream's): the same request again, on a new one, timed from there
                    start = time.monotonic()
                    continue
                break
            end = time.monotonic()
            if reply.ttft_ms is not None:
                run.ttft_ms.append(reply.ttft_ms)
                if turns is not None and t0 <= start < t1 and reply.scan.done and end > start:
                    key = turn if together is not None else turn // len(ports)
                    turns.setdefault(key, {})[i] = (reply.ttft_ms, reply.tokens_all / (end - start))
            turn += 1
            if reply.scan.done:
                run.request_ms.append((end - start) * 1000)
                run.errors += reply.scan.status != 200
            run.tokens += reply.tokens_in
            run.tokens_all += reply.tokens_all
            run.busy_s += max(0.0, min(end, t1) - max(start, t0))
            if not reply.scan.done or not keep_alive:
                conns.pop(i)[1].close()
    finally:
        if together is not None:
            await together.abort()  # the others end at their next meeting
        for _reader, writer in conns.values():
            writer.close()


async def measure_mixed(
    ports: list[int], level: int, request: bytes, warmup_s: float, window_s: float, keep_alive: bool
) -> tuple[list[PathRun], list[dict[int, tuple[float, float]]]]:
    """`level` streams in groups of one a path (the last group smaller), a group's members sending together, each
    member taking the paths in turn request by request (member j starting at path j); and each group turn's requests
    by path index (`mixed_stream`'s `turns`; a group of one: each of its rounds of the paths)."""
    runs = [PathRun() for _ in ports]
    t0 = time.monotonic() + warmup_s
    t1 = t0 + window_s
    sizes = [len(ports)] * (level // len(ports)) + ([level % len(ports)] if level % len(ports) else [])
    groups: list[tuple[asyncio.Barrier | None, dict[int, dict[int, tuple[float, float]]]]] = [
        (asyncio.Barrier(size) if size > 1 else None, {}) for size in sizes
    ]
    await asyncio.gather(
        *(
            # a group of one beside others would pair requests seconds apart: only a stream alone is paired so
            mixed_stream(
                ports, j, request, t0, t1, runs, keep_alive, together, turns if size > 1 or level == 1 else None
            )
            for size, (together, turns) in zip(sizes, groups, strict=True)
            for j in range(size)
        )
    )
    return runs, [t for _, turns in groups for t in turns.values()]


def paired(turns: list[dict[int, tuple[float, float]]], path: int, base: int) -> tuple[list[float], list[float]]:
    """In each turn that has both: the TTFT of `path` less `base`'s (ms), and its request's tokens/s over `base`'s."""
    both = [(t[path], t[base]) for t in turns if path in t and base in t]
    return [p[0] - b[0] for p, b in both], [p[1] / b[1] for p, b in both if b[1] > 0]


async def measure(port: int, level: int, request: bytes, warmup_s: float, window_s: float, keep_alive: bool) -> Run:
    run = Run()
    t0 = time.monotonic() + warmup_s
    t1 = t0 + window_s
    await asyncio.gather(*(stream_loop(port, request, t0, t1, run, keep_alive) for _ in range(level)))
    return run


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def thread_cpu_s(pid: int, name: str) -> float:
    """CPU seconds of the threads of `pid` named `name` (/proc/PID/task/TID/comm)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_s(pids: list[int]) -> float:
    """The processes' CPU seconds, to the ns (their CPU-time clocks: /proc's user and system times come in 10 ms
    ticks, ±10 % of a proxy's CPU over a 5 s window at one stream)."""
    return sum(process_cpu_ns(pid) or 0 for pid in pids) / 1e9


@dataclass
class Supervised:
    """A llama-server under `gpushare-tui launch` (its supervisor runs our proxy on `port`)."""

    supervisor_pid: int
    engine_pid: int
    port: int
    engine_port: int

    @classmethod
    def start(cls, argv: list[str], key: str, name: str) -> Supervised:
        port = free_port()
        out = subprocess.run(
            [*CLI, "launch", "--json", "--gpu-key", key, "--name", name, "--", *argv, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise RuntimeError(f"launch failed: {out.stderr.strip()}")
        info = json.loads(out.stdout)
        engine_pid = info["engine_pid"]
        cmdline = psutil.Process(engine_pid).cmdline()
        return cls(info["supervisor_pid"], engine_pid, port, int(cmdline[cmdline.index("--port") + 1]))

    def proxy_pids(self) -> list[int]:
        """The front proxy's process (core/engines/proxy_process.py), when it has one."""
        kids = psutil.Process(self.supervisor_pid).children()
        return [k.pid for k in kids if any("proxy_process" in part for part in k.cmdline())]

    def proxy_cpu_s(self, proxy_pids: list[int]) -> float:
        """The proxy's CPU seconds: its process, or (the code before that) its thread, when named."""
        return cpu_s(proxy_pids) if proxy_pids else thread_cpu_s(self.supervisor_pid, PROXY_THREAD)

    def lateness(self) -> dict:
        st = control.StatusReply.from_json(control.request(self.engine_pid, "status", 5.0))
        return dict(vars(st.signal_lateness)) if st.signal_lateness is not None else {}

    def stop(self) -> None:
        subprocess.run([*CLI, "stop", str(self.engine_pid)], capture_output=True, timeout=60)


class Nginx:
    """nginx in front of `upstream`, in a directory of its own, listening on `port`."""

    def __init__(self, binary: str, upstream: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-nginx-")
        self.port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(dir=self.dir, upstream=upstream, port=self.port))
        self.proc = subprocess.Popen(
            [binary, "-p", self.dir, "-e", os.path.join(self.dir, "error.log"), "-c", conf],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_healthy(self.port)

    def pids(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.proc.pid).children()]  # the worker

    def stop(self) -> None:
        """Master and worker ended (a master killed leaves its worker running: ended by its pid)."""
        workers = self.pids()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def engine_paths(
    server: str, model: str, nginx: str | None, level: int
) -> Iterator[tuple[Supervised, Nginx | None, dict[str, int]]]:
    """A level's llama-server (`-np` the level) under `launch`, nginx in front of it where installed, and each
    path's port (no nginx: no "nginx" key); both ended on the way out."""
    argv = [server, "-m", model, "-t", "1", "-np", str(level), "-c", str(level * CTX_PER_SLOT)]
    sup = Supervised.start(argv, KEY, f"proxy-bench-{level}")
    front = None
    try:
        front = Nginx(nginx, sup.engine_port) if nginx else None
        yield sup, front, {"direct": sup.engine_port, "ours": sup.port} | ({"nginx": front.port} if front else {})
    finally:
        if front is not None:
            front.stop()
        sup.stop()


def throughput(a: argparse.Namespace, server: str, model: str, nginx: str | None) -> list[dict]:
    request = request_bytes(a.n_predict, a.keep_alive)
    rows: list[dict] = []
    print(f"load average at start: {os.getloadavg()}")
    print("level round path     tok/s   vs direct  TTFT p50/p99 ms   CPU µs/token (ours: all / proxy / + extra)   load")
    for level in (int(x) for x in a.levels.split(",")):
        with engine_paths(server, model, nginx, level) as (sup, front, ports):
            proxy_pids = sup.proxy_pids()
            cpu_of = {"ours": [sup.supervisor_pid, *proxy_pids], "nginx": front.pids() if front else []}
            paths = [p for p in PATHS if p in ports]
            slice_s = a.window_s / a.slices
            # CPU is read over each slice's warm-up and window alike; tokens are counted in the windows
            counted = a.window_s / (a.window_s + a.slices * a.warmup_s)
            for rnd in range(a.rounds):
                order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
                runs = {path: Run() for path in order}
                used_s = {path: [0.0, 0.0, 0.0] for path in order}  # its CPU, the proxy's, the supervisor's
                for k in range(a.slices):
                    for path in order if k % 2 == 0 else order[::-1]:
                        pids = cpu_of.get(path, [])
                        before, thread_before = cpu_s(pids), sup.proxy_cpu_s(proxy_pids)
                        sup_before = cpu_s([sup.supervisor_pid])
                        r = asyncio.run(measure(ports[path], level, request, a.warmup_s, slice_s, a.keep_alive))
                        used_s[path][0] += cpu_s(pids) - before
                        used_s[path][1] += sup.proxy_cpu_s(proxy_pids) - thread_before
                        used_s[path][2] += cpu_s([sup.supervisor_pid]) - sup_before
                        runs[path].tokens += r.tokens
                        runs[path].ttft_ms += r.ttft_ms
                got: dict[str, dict] = {}
                for path in order:
                    pids = cpu_of.get(path, [])
                    r, (used, thread_used, sup_used) = runs[path], used_s[path]
                    got[path] = {
                        "level": level,
                        "round": rnd + 1,
                        "path": path,
                        "order": order.index(path) + 1,
                        "slices": a.slices,
                        "tok_s": r.tokens / a.window_s,
                        "ttft_ms": [pct(r.ttft_ms, 0.5), pct(r.ttft_ms, 0.99)],
                        # the windows and their warm-ups: CPU per token received over the whole measurement
                        "cpu_us_per_token": used / r.tokens * 1e6 * counted if pids and r.tokens else None,
                        # ours: the proxy's thread alone (the supervisor's pace loop and monitor left out)
                        "proxy_thread_us_per_token": thread_used / r.tokens * 1e6 * counted
                        if path == "ours" and r.tokens
                        else None,
                        # the supervisor process alone (its pace loop and monitor), in every path's window
                        "supervisor_cpu_s": sup_used,
                        "tokens": r.tokens,
                        "errors": r.errors,
                        "load_avg_1m": os.getloadavg()[0],
                    }
                ours = got.get("ours")
                if ours is not None and ours["tokens"] and ours["proxy_thread_us_per_token"] is not None:
                    # what the proxy costs: its process, and what the supervisor spent over its spend while the
                    # same engine was reached direct (its pace loop and monitor run either way)
                    extra_s = max(0.0, ours["supervisor_cpu_s"] - got["direct"]["supervisor_cpu_s"])
                    ours["proxy_and_extra_us_per_token"] = (
                        ours["proxy_thread_us_per_token"] + extra_s / ours["tokens"] * 1e6 * counted
                    )
                report_round(got, paths, rows)
    summarise(rows)
    return rows


def throughput_mixed(a: argparse.Namespace, server: str, model: str, nginx: str | None) -> list[dict]:
    """--mix: each stream takes the paths in turn, request by request, so every path meets the engine in the same
    state (its own rate drifts by tens of % over seconds here); a path's tok/s is a stream's while on it (its
    tokens over the seconds its requests took, connect to last chunk), its CPU per token over the whole run (ours:
    its proxy process's over its tokens, the supervisor's over every path's)."""
    request = request_bytes(a.n_predict, a.keep_alive)
    rows: list[dict] = []
    print(f"load average at start: {os.getloadavg()}")
    print(
        "level round path     tok/s a stream  vs direct (paired)  TTFT p50/p99 ms  paired −direct ms (median/mean)"
        "  request p50 ms   CPU µs/token (ours: all / proxy)   load"
    )
    for level in (int(x) for x in a.levels.split(",")):
        with engine_paths(server, model, nginx, level) as (sup, front, ports):
            proxy_pids = sup.proxy_pids()
            # the supervisor (pace loop, monitor) runs for every path alike: its CPU is counted over all the
            # paths' tokens, the proxy's over its own
            cpu_of = {"ours": proxy_pids, "nginx": front.pids() if front else []}
            paths = [p for p in PATHS if p in ports]
            if a.control:  # a second direct path: what the comparison reads between two paths alike
                ports, paths = ports | {CONTROL: ports["direct"]}, [*paths, CONTROL]
            for rnd in range(a.rounds):
                order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
                before = {path: cpu_s(cpu_of.get(path, [])) for path in order}
                sup_before = cpu_s([sup.supervisor_pid])
                runs, turns = asyncio.run(
                    measure_mixed([ports[p] for p in order], level, request, a.warmup_s, a.window_s, a.keep_alive)
                )
                used = {path: cpu_s(cpu_of.get(path, [])) - before[path] for path in order}
                sup_us_per_token = (cpu_s([sup.supervisor_pid]) - sup_before) / max(1, sum(r.tokens_all for r in runs))
                sup_us_per_token *= 1e6
                got: dict[str, dict] = {}
                for path, r in zip(order, runs, strict=True):
                    pids = cpu_of.get(path, [])
                    own = used[path] / r.tokens_all * 1e6 if pids and r.tokens_all else None
                    ttft_less, rate_over = paired(turns, order.index(path), order.index("direct"))
                    got[path] = {
                        "level": level,
                        "round": rnd + 1,
                        "path": path,
                        "mix": True,
                        "tok_s": r.tokens / r.busy_s if r.busy_s else 0.0,
                        "ttft_ms": [pct(r.ttft_ms, 0.5), pct(r.ttft_ms, 0.99)],
                        # this path's TTFT less direct's, request for request (sent together, or one after the
                        # other by one stream alone): the median and mean of the pairs, and how many
                        "ttft_paired_ms": [statistics.median(ttft_less), statistics.mean(ttft_less)]
                        if ttft_less and path != "direct"
                        else None,
                        "pairs": len(ttft_less),
                        # its request's tokens/s over direct's, request for request: the median
                        "vs_direct_paired": statistics.median(rate_over) if rate_over else None,
                        # ours: its proxy process's and the supervisor's share (see above)
                        "cpu_us_per_token": own + sup_us_per_token if own is not None and path == "ours" else own,
                        "proxy_thread_us_per_token": own if path == "ours" else None,
                        "supervisor_us_per_token": sup_us_per_token,
                        "tokens": r.tokens,
                        "busy_s": r.busy_s,
                        "requests": len(r.ttft_ms),
                        "request_ms_p50": pct(r.request_ms, 0.5),
                        "errors": r.errors,
                        "load_avg_1m": os.getloadavg()[0],
                    }
                report_round(got, paths, rows)
    summarise(rows)
    return rows


def report_round(got: dict[str, dict], paths: list[str], rows: list[dict]) -> None:
    """A round's rows (`got`, by path): each path's tok/s against direct's, kept in `rows` and printed (--mix rows:
    a stream's tok/s, and the request's p50)."""
    direct = got["direct"]["tok_s"]
    for path in paths:
        row = got[path]
        row["vs_direct"] = row["tok_s"] / direct if direct else float("nan")
        rows.append(row)
        cpu, thread = row["cpu_us_per_token"], row["proxy_thread_us_per_token"]
        marginal = row.get("proxy_and_extra_us_per_token")
        shown = "-" if cpu is None else f"{cpu:6.1f}" + ("" if thread is None else f" / {thread:5.1f}")
        shown += "" if marginal is None else f" / {marginal:5.1f}"
        ttft_p50, ttft_p99 = row["ttft_ms"]
        if row.get("mix"):
            rate = row.get("vs_direct_paired")
            measured = f"{row['tok_s']:14.1f} {row['vs_direct'] * 100:8.1f}%"
            measured += f" ({rate * 100:5.1f}%)" if rate is not None and row["path"] != "direct" else " " * 9
            measured += f"  {ttft_p50:6.2f}/{ttft_p99:<7.1f}"
            paired = row.get("ttft_paired_ms")
            measured += f"  {paired[0]:+7.3f} / {paired[1]:+7.3f} ({row['pairs']:4})" if paired else " " * 28
            measured += f"  {row['request_ms_p50']:10.2f}   "
        else:
            measured = f"{row['tok_s']:7.0f} {row['vs_direct'] * 100:8.1f}%  {ttft_p50:6.1f}/{ttft_p99:<7.1f}"
        print(
            f"{row['level']:5} {row['round']:5} {path:7} {measured}  {shown:>15}   {row['load_avg_1m']:.2f}"
            + (f"   {row['errors']} replies not 200" if row["errors"] else ""),
            flush=True,
        )


def summarise(rows: list[dict]) -> None:
    """Per level, the medians over rounds: ours÷nginx CPU a token, tok/s vs direct, TTFT p50 ours − direct."""
    print("\nper level (median of rounds): ours÷nginx CPU/token, tok/s vs direct, TTFT p50 ours − direct")
    for level in sorted({r["level"] for r in rows}):
        ours_cpu, nginx_cpu = _med(rows, level, "ours", "cpu"), _med(rows, level, "nginx", "cpu")
        thread = _med(rows, level, "ours", "thread")
        marginal = _med(rows, level, "ours", "marginal")
        extra = ""  # (--mix: none; the supervisor's spend there is every path's)
        if not math.isnan(marginal):
            extra = f" + the supervisor's over direct {marginal:6.1f} µs ({marginal / nginx_cpu:4.2f}×),"
        ttft = _med(rows, level, "ours", "ttft") - _med(rows, level, "direct", "ttft")
        paired = "".join(
            f"; paired {path}: TTFT − direct {_med(rows, level, path, 'paired'):+.3f} ms,"
            f" tok/s {_med(rows, level, path, 'paired_ratio') * 100:5.1f}%"
            for path in (*PATHS[1:], CONTROL)
            if not math.isnan(_med(rows, level, path, "paired"))
        )
        print(
            f"level {level:3}: CPU ours {ours_cpu:6.1f} µs ({ours_cpu / nginx_cpu:4.2f}× nginx), its proxy"
            f" {thread:6.1f} µs ({thread / nginx_cpu:4.2f}×),{extra} nginx {nginx_cpu:6.1f} µs;"
            f" tok/s ours {_med(rows, level, 'ours', 'ratio') * 100:5.1f}%,"
            f" nginx {_med(rows, level, 'nginx', 'ratio') * 100:5.1f}%; TTFT p50 ours − direct {ttft:+.2f} ms" + paired
        )


def _med(rows: list[dict], level: int, path: str, what: str) -> float:
    """The median over rounds of one path's `what` (cpu: µs/token, ratio: tok/s vs direct, ttft: p50 ms, paired: the
    median of its TTFT less direct's, request for request; paired_ratio: of its request's tok/s over direct's)."""
    get = {
        "cpu": lambda r: r["cpu_us_per_token"],
        "thread": lambda r: r.get("proxy_thread_us_per_token"),
        "marginal": lambda r: r.get("proxy_and_extra_us_per_token"),
        "ratio": lambda r: r["vs_direct"],
        "ttft": lambda r: r["ttft_ms"][0],
        "paired": lambda r: r["ttft_paired_ms"][0] if r.get("ttft_paired_ms") else None,
        "paired_ratio": lambda r: r.get("vs_direct_paired"),
    }
    xs = [get[what](r) for r in rows if r["level"] == level and r["path"] == path]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def lateness(a: argparse.Namespace, server: str, model: str) -> list[dict]:
    """Edge lateness of engine A paced 1:1 against a busy B, with N streams through A's proxy."""
    key = KEY
    rows = []
    request = request_bytes(a.n_predict, True)
    print(f"load average at start: {os.getloadavg()}")
    print("streams  edges  lateness p50/p99/max µs   A tok/s   load")
    peer = Supervised.start([server, "-m", model, "-t", "1", "-np", "1", "-c", "512"], key, "late-b")
    try:
        for n in (int(x) for x in a.lateness_streams.split(",")):
            slots = max(n, 1)  # 0 streams: the engine idle beside its busy peer
            argv = [server, "-m", model, "-t", "1", "-np", str(slots), "-c", str(slots * CTX_PER_SLOT)]
            sup = Supervised.start(argv, key, f"late-a-{n}")
            try:
                _b, mine = asyncio.run(_both(a, request, peer.port, sup.port, n))
                late = sup.lateness()
            finally:
                sup.stop()
            row = {"streams": n, **late, "tok_s": mine.tokens / a.window_s, "load_avg_1m": os.getloadavg()[0]}
            rows.append(row)
            print(
                f"{n:7} {late.get('n', 0):6}  {late.get('p50_us')}/{late.get('p99_us')}/{late.get('max_us')}"
                f"   {row['tok_s']:8.0f}   {row['load_avg_1m']:.2f}",
                flush=True,
            )
    finally:
        peer.stop()
    return rows


async def _both(a: argparse.Namespace, request: bytes, peer_port: int, port: int, level: int) -> list[Run]:
    """The peer busy with one stream throughout, and `level` streams to `port`."""
    b = measure(peer_port, 1, request, 0, a.warmup_s + a.window_s, True)
    mine = measure(port, level, request, a.warmup_s, a.window_s, True)
    return list(await asyncio.gather(b, mine))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=6.0)
    ap.add_argument("--slices", type=int, default=3, help="each path's window in this many slices, taken in turn")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--keep-alive", action="store_true", help="one connection per client (default: one per request)")
    ap.add_argument(
        "--mix", action="store_true", help="each stream takes the paths in turn, request by request (see the docstring)"
    )
    ap.add_argument("--control", action="store_true", help="--mix: the direct path twice (the comparison's own spread)")
    ap.add_argument("--lateness", action="store_true", help="the pacing edges' lateness instead (see the docstring)")
    ap.add_argument("--lateness-streams", default="1,32")
    a = ap.parse_args()
    if a.slices < 1 or a.window_s <= 0 or a.rounds < 1 or a.warmup_s < 0:
        ap.error("--slices and --rounds must be at least 1, --window-s above 0, --warmup-s not below 0")
    if a.control and not a.mix:
        ap.error("--control is a --mix option")
    server = llama_server_path()
    RESULTS.mkdir(exist_ok=True)
    model = write_tiny_llama(str(RESULTS / "proxy-bench.gguf"))
    try:
        if a.lateness:
            rows = lateness(a, server, model)
            (RESULTS / "proxy-lateness.json").write_text(json.dumps(rows, indent=1))
            return
        nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
        if nginx is None:
            print("nginx is not installed: its path is skipped (apt-get install nginx)")
        rows = (throughput_mixed if a.mix else throughput)(a, server, model, nginx)
        (RESULTS / ("proxy-mix.json" if a.mix else "proxy.json")).write_text(json.dumps(rows, indent=1))
    finally:
        remove(shm_file(KEY))


def _wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing healthy on port {port}")


if __name__ == "__main__":
    main()
