/* The front proxy's per-token relay, off the interpreter.

   A streamed reply (a chunked body relayed raw to an HTTP/1.1 client) costs the proxy one read and one write
   per token. On the event loop each of them is a wake-up of Python (~20-35 µs of CPU with the caches cold,
   measured against nginx's ~14 µs for the whole token). A Relayer is one thread of plain C with its own epoll:
   the loop hands it a stream at a chunk boundary (dups of both sockets) and it relays the engine's reads to the
   client, checking the chunked framing as it goes, until the stream's last chunk or anything it does not know,
   then hands the stream back (what it has not relayed, and where in the framing it stopped) and says so on an
   eventfd the loop watches. It never takes the interpreter's lock while it relays.

   What it relays, byte for byte as it came: whole chunk-size lines of lowercase hex digits without a leading
   zero (`SIZE CRLF`, what llama-server and every common server writes), the chunk's data, its CRLF, and the
   last chunk where it is `0 CRLF CRLF` (the reply ends there: DONE; gathered across reads, so a stream whose end
   comes in two reads ends with one report). It stops before: a size line of any other form (upper case, zeros,
   an extension, over 15 digits), a missing CRLF after a chunk's data; a last chunk with trailers (given back
   unwritten: LAST, the trailers are the loop's to filter); at the engine's EOF or a read error; when the
   client's socket fails a write; when the loop cancels it. Its memory per stream is bounded: a size line begun
   (at most 16 bytes), what the client has not taken (reading the engine pauses above `out_max` bytes), the read
   times not yet collected (at most TIMES_MAX; the rest are counted as dropped), and the reads held (below).

   Read times: where the stream is timed, each read whose event (after a size line that begins the read) does
   not begin with one of the `not_tokens` prefixes, and that is not of the last chunk, is a token's arrival
   (CLOCK_MONOTONIC, time.monotonic's clock); the loop collects them (`collect`), told on the eventfd when a
   stream has kept any for `flush_s` (or TIMES_NOTIFY of them).

   Held reads: a stream handed over before the loop has seen its first token (at its response head, so the first
   token is relayed here too) starts with `hold_max` >= 0: each read is relayed and also kept whole with its time
   and where its event begins (H_FIRST), for the loop to look at as it looks at its own reads (what is a token is
   its rule, not this file's), up to the first read that may be a token (its event not one of `not_tokens`; any
   read of a stream not timed). The reads after it are timed as above and kept aside (H_AFTER) until the loop
   says (`seen`): found, they are dropped (their times are the tokens); not found, they are given to the loop
   (their times forgotten) and holding begins again. So a stream whose first read is its first token costs the
   loop that read's bytes, whenever it collects; the loop is told of held reads as of read times (within
   `flush_s`), or at once above half of `hold_max` bytes; reading the engine pauses above `hold_max`. A stream
   that ended or was cancelled with reads kept aside stays until the loop's `seen` (its collect says so).

   Requests (`request`): a request whose whole bytes the loop has, on a new engine connection it has begun to
   connect, is the thread's from the connect on: it waits for the connect (at most `connect_s`: else
   CONNECT_FAILED with ETIMEDOUT, as a refused one), writes the request, reads the response head (at most
   `head_max` bytes) and parses it (picohttpparser). A plain head - HTTP/1.1, a final status with a body, one
   `Transfer-Encoding: chunked` and no Content-Length, no Connection header, printable ASCII, CRLF line ends - is
   written to the client as the loop writes one (`HTTP/1.1 STATUS REASON`, its headers less `hop_headers` and
   the transfer coding, then `Transfer-Encoding: chunked`, and `Connection: close` where the client's connection
   ends after it), and its body is relayed as above, held for the first token where the reply is 2xx and the
   request timed, its reads timed where its Content-Type is one of `stream_types`. Any other head, a head over
   `head_max`, one that does not parse: HEAD, with all that was read (nothing written to the client), for the
   loop to parse and answer as it does its own. The report says what came: (status, first byte's time, head's
   time, streamed, written) once a head was parsed. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "picohttpparser.h"

#define READ_BYTES 65536
#define CARRY_MAX 16 /* a size line's part that ends a read: at most 15 hex digits and its CR */
#define TIMES_MAX 65536
#define TIMES_NOTIFY 256 /* a stream holding this many read times is collected without waiting flush_s */
#define EVENTS_MAX 64
#define PREFIX_MAX 8
#define HEADERS_MAX 100 /* a plain head has at most this many headers (more: the loop's to parse) */
#define HEAD_FIRST_BYTES 4096 /* a response head's first buffer (a real one fits), grown to head_max + 1 */
#define HEAD_OUT_BYTES 8192 /* a plain head as written to the client is at most this long (longer: the loop's) */

/* S_LAST: a size line began with 0 (the last chunk): its bytes gathered in `carry` while they are `0 CRLF CRLF` */
enum { S_SIZE = 0, S_DATA = 1, S_CRLF = 2, S_LAST = 3 };
enum { H_FIRST = 1, H_AFTER = 2 };
enum { R_LIVE = 0, R_LAST = 1, R_ODD = 2, R_EOF = 3, R_READ_ERROR = 4, R_CLIENT_GONE = 5, R_CANCELLED = 6, R_DONE = 7,
       R_HEAD = 8, R_CONNECT_FAILED = 9 };
/* a request's phase (P_BODY: the body, as a stream `start` hands over) */
enum { P_BODY = 0, P_CONNECT = 1, P_SEND = 2, P_HEAD = 3 };

typedef struct {
    int used;
    uint32_t gen;
    int up_fd, client_fd; /* our dups, closed when the stream ends here */
    int timed;
    int reason;    /* R_LIVE while relaying */
    int err;       /* errno of a read or write that failed */
    int state;     /* S_SIZE, S_DATA, S_CRLF, S_LAST */
    uint64_t left; /* S_DATA: bytes of the chunk's data to come; S_CRLF: bytes of its CRLF to come (1 or 2) */
    /* S_SIZE: the size line so far (digits, their value, whether its CR came); `carry`: its bytes that came in
       an earlier read (not yet relayed: a line is relayed whole) */
    int digits, cr;
    uint64_t size;
    char carry[CARRY_MAX];
    int carry_len;
    char *rest;    /* what was read and not relayed, for the loop (at the stream's end) */
    Py_ssize_t rest_len;
    char *out;     /* what the client has not taken */
    size_t out_len, out_cap;
    int want_out;  /* client_fd is in the epoll set for EPOLLOUT */
    int paused;    /* up_fd is out of the epoll set: out over out_max */
    double *times; /* times_cap of them, grown as they come (up to TIMES_MAX) */
    Py_ssize_t n_times, times_cap, dropped;
    double pending_since; /* the oldest uncollected read time or held read, 0 when none */
    int holding;          /* H_FIRST, H_AFTER (see the module's comment), 0 */
    size_t hold_max;
    char *held;           /* records: HeldHead, then its bytes; H_AFTER: the first `first_len` bytes are H_FIRST's */
    size_t held_len, held_cap, first_len;
    int reported;         /* ended, its report collected: kept for the loop's `seen` */
    unsigned long long relayed; /* bytes written to the client */
    /* a request's (see `request`) */
    int phase;
    char *req;            /* P_CONNECT, P_SEND: the request, req_off of it written */
    size_t req_len, req_off;
    char *head;           /* P_HEAD: what came of the reply so far (head_cap: grown as it comes, to head_max + 1) */
    size_t head_len, head_cap;
    double deadline;      /* P_CONNECT: connected by then */
    int close_client, want_timed, shut_up;
    Py_ssize_t want_hold;
    int status, streamed, head_written, head_parsed;
    double first_byte_t, head_t;
} Stream;

typedef struct {
    double t;
    uint32_t at, len;
} HeldHead;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_t thread;
    int thread_started, mu_ready;
    int ep, notify_fd, quit_fd, kick_fd; /* kick_fd: a request's connect deadline is new (the wait is cut short) */
    int notified; /* the eventfd was written since the last collect */
    int closing;
    size_t out_max;
    double flush_s;
    char *in;     /* READ_BYTES: the read being relayed (the thread's) */
    Stream *streams;
    int n_streams;
    uint32_t next_gen;
    char prefixes[PREFIX_MAX][32];
    int prefix_len[PREFIX_MAX];
    int n_prefixes;
    char stream_types[PREFIX_MAX][32]; /* Content-Types (lower case, prefixes) whose chunks are tokens */
    int stream_type_len[PREFIX_MAX];
    int n_stream_types;
    char hop_headers[PREFIX_MAX][32]; /* header names (lower case) that stay on their hop: the loop's HOP_HEADERS */
    int hop_header_len[PREFIX_MAX];
    int n_hop_headers;
    size_t head_max;
} Relayer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* a stream's token for the loop, and its epoll data: index (16 bits), generation (31 bits); bit 63: the
   client's socket */
#define GEN_MASK 0x7fffffffu
static long long token_of(int index, uint32_t gen) { return ((long long)gen << 16) | index; }
static uint64_t ev_data(int index, uint32_t gen, int client) {
    return (uint64_t)token_of(index, gen) | ((uint64_t)client << 63);
}

static void stream_release_fds(Relayer *self, Stream *s) {
    if (s->up_fd >= 0) {
        epoll_ctl(self->ep, EPOLL_CTL_DEL, s->up_fd, NULL);
        close(s->up_fd);
        s->up_fd = -1;
    }
    if (s->client_fd >= 0) {
        epoll_ctl(self->ep, EPOLL_CTL_DEL, s->client_fd, NULL);
        close(s->client_fd);
        s->client_fd = -1;
    }
}

static void stream_free(Stream *s) {
    free(s->req);
    free(s->head);
    free(s->rest);
    free(s->out);
    free(s->times);
    free(s->held);
    memset(s, 0, sizeof(*s));
    s->up_fd = s->client_fd = -1;
}

/* The stream ends here: its sockets are ours no more; the loop collects it. `keep`: bytes of the read not
   relayed, after any size line begun in an earlier read (`carry`). */
static void stream_end(Relayer *self, Stream *s, int reason, int err, const char *keep, size_t keep_len) {
    stream_release_fds(self, s);
    s->reason = reason;
    s->err = err;
    if (reason == R_CLIENT_GONE || reason == R_CANCELLED) {
        s->out_len = 0;
        return;
    }
    size_t n = (size_t)s->carry_len + keep_len;
    if (n) {
        s->rest = malloc(n);
        if (s->rest == NULL) { /* the exchange fails rather than relay a body with a hole */
            s->reason = R_CLIENT_GONE;
            s->err = ENOMEM;
            s->out_len = 0;
            return;
        }
        memcpy(s->rest, s->carry, (size_t)s->carry_len);
        if (keep_len)
            memcpy(s->rest + s->carry_len, keep, keep_len);
        s->rest_len = (Py_ssize_t)n;
    }
    s->carry_len = s->digits = s->cr = 0;
    s->size = 0;
}

/* Write to the client, or keep what it does not take now; -1 when it is gone (the stream ended). */
static int client_write(Relayer *self, Stream *s, const char *p, size_t n) {
    if (!n || s->reason != R_LIVE)
        return s->reason == R_LIVE ? 0 : -1;
    if (!s->out_len) {
        ssize_t w = send(s->client_fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                stream_end(self, s, R_CLIENT_GONE, errno, NULL, 0);
                return -1;
            }
            w = 0;
        }
        p += w;
        n -= (size_t)w;
        s->relayed += (unsigned long long)w;
        if (!n)
            return 0;
    }
    if (s->out_len + n > s->out_cap) {
        size_t cap = s->out_cap ? s->out_cap : 4096;
        while (cap < s->out_len + n)
            cap *= 2;
        char *grown = realloc(s->out, cap);
        if (grown == NULL) {
            stream_end(self, s, R_CLIENT_GONE, ENOMEM, NULL, 0);
            return -1;
        }
        s->out = grown;
        s->out_cap = cap;
    }
    memcpy(s->out + s->out_len, p, n);
    s->out_len += n;
    return 0;
}

/* The client's socket in the epoll set for EPOLLOUT while output waits; the engine's for EPOLLIN while the
   output waiting is at most out_max. */
static void watch(Relayer *self, Stream *s, int index) {
    int want_out = s->out_len > 0;
    if (want_out != s->want_out) {
        struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = ev_data(index, s->gen, 1)};
        epoll_ctl(self->ep, want_out ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->client_fd, &ev);
        s->want_out = want_out;
    }
    int pause = s->out_len > self->out_max || (s->holding && s->held_len > s->hold_max);
    if (pause != s->paused) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(index, s->gen, 0)};
        epoll_ctl(self->ep, pause ? EPOLL_CTL_DEL : EPOLL_CTL_ADD, s->up_fd, &ev);
        s->paused = pause;
    }
}

/* whether a read's event (at `at`) begins with one of `not_tokens` (a ping, the stream's end: no token) */
static int not_token(Relayer *self, const char *p, size_t n, size_t at) {
    for (int k = 0; k < self->n_prefixes; k++) {
        size_t len = (size_t)self->prefix_len[k];
        if (n >= at + len && memcmp(p + at, self->prefixes[k], len) == 0)
            return 1;
    }
    return 0;
}

static void note_time(Stream *s, double t) {
    if (s->n_times >= s->times_cap) {
        Py_ssize_t cap = s->times_cap ? s->times_cap * 2 : TIMES_NOTIFY;
        double *grown = cap <= TIMES_MAX ? realloc(s->times, (size_t)cap * sizeof(double)) : NULL;
        if (grown == NULL) {
            s->dropped++;
            return;
        }
        s->times = grown;
        s->times_cap = cap;
    }
    s->times[s->n_times++] = t;
    if (s->pending_since == 0)
        s->pending_since = t;
}

/* Keep a read for the loop (see the module's comment); one that cannot be kept is counted as dropped. */
static void hold(Stream *s, const char *p, size_t n, size_t at, double t) {
    size_t need = s->held_len + sizeof(HeldHead) + n;
    if (need > s->held_cap) {
        size_t cap = s->held_cap ? s->held_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *grown = realloc(s->held, cap);
        if (grown == NULL) {
            s->dropped++;
            return;
        }
        s->held = grown;
        s->held_cap = cap;
    }
    HeldHead h = {.t = t, .at = (uint32_t)at, .len = (uint32_t)n};
    memcpy(s->held + s->held_len, &h, sizeof h);
    memcpy(s->held + s->held_len + sizeof h, p, n);
    s->held_len = need;
    if (s->pending_since == 0)
        s->pending_since = h.t;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Relay one read `p[0:n]`: the bytes the framing allows go to the client as a run; a size line is relayed once
   whole (a part of it that ends a read waits in `carry`); anything else ends the stream here. */
static void relay_bytes(Relayer *self, Stream *s, const char *p, size_t n) {
    static const char last_chunk[] = "0\r\n\r\n";
    size_t i = 0, run = 0;   /* p[run:i]: checked, not yet written */
    size_t line_start = 0;   /* S_SIZE: where the line began in p (0 when it began in an earlier read) */
    if (s->state == S_LAST)
        run = n; /* nothing of the last chunk is written here */
    while (i < n) {
        if (s->state == S_LAST) {
            /* the last chunk: gathered whole (`0 CRLF CRLF`, written: the stream ends with this read, not one
               later) or, at the first byte that differs (trailers, a size with zeros), given back unwritten */
            if (p[i] != last_chunk[s->carry_len]) {
                stream_end(self, s, R_LAST, 0, p + i, n - i);
                return;
            }
            s->carry[s->carry_len++] = p[i++];
            if (s->carry_len == (int)sizeof last_chunk - 1) { /* no trailers: the reply ends here */
                if (client_write(self, s, s->carry, (size_t)s->carry_len) < 0)
                    return;
                s->carry_len = 0;
                stream_end(self, s, R_DONE, 0, p + i, n - i);
                return;
            }
            continue;
        }
        if (s->state == S_DATA) {
            size_t take = n - i < s->left ? n - i : (size_t)s->left;
            i += take;
            s->left -= take;
            if (!s->left) {
                s->state = S_CRLF;
                s->left = 2;
            }
            continue;
        }
        if (s->state == S_CRLF) {
            if (p[i] != (s->left == 2 ? '\r' : '\n')) {
                if (client_write(self, s, p + run, i - run) == 0)
                    stream_end(self, s, R_ODD, 0, p + i, n - i);
                return;
            }
            i++;
            if (!--s->left) {
                s->state = S_SIZE;
                line_start = i;
            }
            continue;
        }
        /* S_SIZE */
        if (s->digits == 0 && !s->cr && s->carry_len == 0)
            line_start = i;
        char c = p[i];
        int v = hex_value(c);
        int stop = 0; /* R_LAST or R_ODD: the line is not ours */
        if (s->cr) {
            if (c != '\n')
                stop = R_ODD;
            else {
                i++;
                if (s->carry_len) { /* the line's start, from the read before, goes first */
                    if (client_write(self, s, s->carry, (size_t)s->carry_len) < 0)
                        return;
                    s->carry_len = 0;
                }
                s->state = S_DATA;
                s->left = s->size;
                s->digits = s->cr = 0;
                s->size = 0;
                continue;
            }
        } else if (c == '\r') {
            if (!s->digits)
                stop = R_ODD;
            s->cr = 1;
        }
        else if (v < 0 || s->digits >= 15)
            stop = R_ODD;
        else if (s->digits == 0 && v == 0) {
            if (client_write(self, s, p + run, i - run) < 0)
                return;
            run = n;
            s->state = S_LAST;
            continue;
        } else {
            s->size = s->size * 16 + (uint64_t)v;
            s->digits++;
        }
        if (stop) {
            if (client_write(self, s, p + run, line_start - run) == 0)
                stream_end(self, s, stop, 0, p + line_start, n - line_start);
            return;
        }
        i++;
    }
    if (s->state == S_SIZE && (s->digits || s->cr)) { /* a size line goes on in the next read */
        if (client_write(self, s, p + run, line_start - run) < 0)
            return;
        size_t part = n - line_start;
        memcpy(s->carry + s->carry_len, p + line_start, part); /* digits <= 15, then CR: fits CARRY_MAX */
        s->carry_len += (int)part;
        return;
    }
    client_write(self, s, p + run, n - run);
}

/* A read of the body `p[0:n]` (at `t`): timed or held (see the module's comment), then relayed. */
static void relay_got(Relayer *self, Stream *s, int index, const char *p, size_t n, double t) {
    if ((s->timed || s->holding) && s->state != S_LAST) { /* the last chunk's reads are no token */
        size_t at = 0;
        if (s->state == S_SIZE && !s->digits && !s->cr && !s->carry_len) {
            /* a read that begins a chunk: its event after the size line (as the loop's recorder looks); the last
               chunk is no token */
            if (n >= 3 && memcmp(p, "0\r\n", 3) == 0)
                at = n + 1;
            for (size_t k = 1; at == 0 && k + 1 < n && k <= 20; k++)
                if (p[k] == '\r' && p[k + 1] == '\n') {
                    at = k + 2;
                    break;
                }
        }
        if (at <= n) { /* else no event */
            int token = !not_token(self, p, n, at);
            if (s->holding == H_FIRST) {
                hold(s, p, n, at, t);
                s->first_len = s->held_len;
                if (token || !s->timed)
                    s->holding = H_AFTER;
            } else {
                if (s->holding == H_AFTER && s->timed)
                    hold(s, p, n, at, t);
                if (token && s->timed)
                    note_time(s, t);
            }
        }
    }
    relay_bytes(self, s, p, n);
    if (s->reason == R_LIVE)
        watch(self, s, index);
}

/* A read of the engine's socket into `buf`: its length, or 0 where nothing came (the stream ended at the engine's
   EOF or a read error, or the read would block). */
static size_t engine_read(Relayer *self, Stream *s, char *buf, size_t cap) {
    ssize_t n = recv(s->up_fd, buf, cap, MSG_DONTWAIT);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            stream_end(self, s, R_READ_ERROR, errno, NULL, 0);
        return 0;
    }
    if (n == 0)
        stream_end(self, s, R_EOF, 0, NULL, 0);
    return (size_t)n;
}

static void relay_read(Relayer *self, Stream *s, int index) {
    size_t n = engine_read(self, s, self->in, READ_BYTES);
    if (n)
        relay_got(self, s, index, self->in, n, (s->timed || s->holding) ? now_s() : 0);
}

/* -- requests ---------------------------------------------------------------------------------------------- */

static int lower_eq(const char *p, size_t n, const char *lower) {
    size_t k = 0;
    for (; k < n && lower[k]; k++)
        if ((p[k] >= 'A' && p[k] <= 'Z' ? p[k] + 32 : p[k]) != lower[k])
            return 0;
    return k == n && !lower[k];
}

/* The client's head for a plain head (see the module's comment), into `out` (its size `cap`); its length, or 0
   where the head is not plain. Sets the stream's status and streamed. */
static size_t plain_head(Relayer *self, Stream *s, const char *head, size_t head_len, char *out, size_t cap) {
    for (size_t k = 0; k < head_len; k++) { /* printable ASCII, tabs, CRLF line ends */
        unsigned char c = (unsigned char)head[k];
        if (c >= 0x7f || (c < 0x20 && c != '\t' && c != '\r' && c != '\n'))
            return 0;
        if (c == '\n' && (k == 0 || head[k - 1] != '\r'))
            return 0;
        if (c == '\r' && (k + 1 >= head_len || head[k + 1] != '\n'))
            return 0;
    }
    int minor = -1, status = 0;
    const char *msg;
    size_t msg_len, n_headers = HEADERS_MAX;
    struct phr_header headers[HEADERS_MAX];
    if (phr_parse_response(head, head_len, &minor, &status, &msg, &msg_len, headers, &n_headers, 0) != (int)head_len)
        return 0;
    if (minor != 1 || status < 200 || status > 599 || status == 204 || status == 304)
        return 0;
    int chunked = 0, streamed = 0, ctype = 0;
    for (size_t k = 0; k < n_headers; k++) {
        const struct phr_header *h = &headers[k];
        if (h->name == NULL)
            return 0; /* a folded line */
        if (lower_eq(h->name, h->name_len, "transfer-encoding")) {
            if (chunked++ || !lower_eq(h->value, h->value_len, "chunked"))
                return 0;
        } else if (lower_eq(h->name, h->name_len, "content-length") || lower_eq(h->name, h->name_len, "connection"))
            return 0;
        else if (!ctype && lower_eq(h->name, h->name_len, "content-type")) {
            ctype = 1;
            for (int j = 0; j < self->n_stream_types && !streamed; j++) {
                size_t len = (size_t)self->stream_type_len[j];
                streamed = h->value_len >= len && lower_eq(h->value, len, self->stream_types[j]);
            }
        }
    }
    if (!chunked)
        return 0;
    size_t n = (size_t)snprintf(out, cap, "HTTP/1.1 %d %.*s\r\n", status, (int)msg_len, msg);
    for (size_t k = 0; k < n_headers && n < cap; k++) {
        const struct phr_header *h = &headers[k];
        int skip = lower_eq(h->name, h->name_len, "transfer-encoding"); /* written last */
        for (int j = 0; j < self->n_hop_headers && !skip; j++)
            skip = lower_eq(h->name, h->name_len, self->hop_headers[j]);
        if (skip)
            continue;
        n += (size_t)snprintf(out + n, cap - n, "%.*s: %.*s\r\n", (int)h->name_len, h->name, (int)h->value_len,
                              h->value);
    }
    if (n < cap)
        n += (size_t)snprintf(out + n, cap - n, "Transfer-Encoding: chunked\r\n%s\r\n",
                              s->close_client ? "Connection: close\r\n" : "");
    if (n >= cap)
        return 0;
    s->status = status;
    s->streamed = streamed;
    return n;
}

/* P_CONNECT, P_SEND: the engine's socket is writable (or failed) */
static void request_write(Relayer *self, Stream *s, int index, uint32_t events) {
    if (s->phase == P_CONNECT) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(s->up_fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (!err && (events & (EPOLLERR | EPOLLHUP)))
            err = ECONNRESET;
        if (err) {
            stream_end(self, s, R_CONNECT_FAILED, err, NULL, 0);
            return;
        }
        s->phase = P_SEND;
    }
    while (s->req_off < s->req_len) {
        ssize_t w = send(s->up_fd, s->req + s->req_off, s->req_len - s->req_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            stream_end(self, s, R_READ_ERROR, errno, NULL, 0);
            return;
        }
        s->req_off += (size_t)w;
    }
    free(s->req);
    s->req = NULL;
    if (s->shut_up)
        shutdown(s->up_fd, SHUT_WR);
    s->phase = P_HEAD;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ev_data(index, s->gen, 0)};
    if (epoll_ctl(self->ep, EPOLL_CTL_MOD, s->up_fd, &ev) < 0)
        stream_end(self, s, R_READ_ERROR, errno, NULL, 0);
}

/* P_HEAD: a read of the reply; at its head's end, the head written (plain) or handed back */
static void head_read(Relayer *self, Stream *s, int index) {
    if (s->head_len == s->head_cap) { /* grown as the head comes, up to a byte past head_max */
        size_t cap = s->head_cap * 4 < self->head_max + 1 ? s->head_cap * 4 : self->head_max + 1;
        char *grown = realloc(s->head, cap);
        if (grown == NULL) {
            stream_end(self, s, R_READ_ERROR, ENOMEM, NULL, 0);
            return;
        }
        s->head = grown;
        s->head_cap = cap;
    }
    size_t n = engine_read(self, s, s->head + s->head_len, s->head_cap - s->head_len);
    if (!n)
        return;
    double t = now_s();
    if (!s->head_len)
        s->first_byte_t = t;
    /* the head ends at its blank line: LF LF or LF CR LF (a bare LF is not plain: the loop says what it is) */
    size_t from = s->head_len > 2 ? s->head_len - 2 : 0;
    s->head_len += n;
    const char *end = NULL;
    for (size_t k = from; k < s->head_len && end == NULL; k++)
        if (s->head[k] == '\n') {
            if (k + 1 < s->head_len && s->head[k + 1] == '\n')
                end = s->head + k + 2;
            else if (k + 2 < s->head_len && s->head[k + 1] == '\r' && s->head[k + 2] == '\n')
                end = s->head + k + 3;
        }
    if (end == NULL) {
        if (s->head_len <= self->head_max)
            return; /* more to come */
        stream_end(self, s, R_HEAD, 0, s->head, s->head_len);
        return;
    }
    size_t head_len = (size_t)(end - s->head);
    char out[HEAD_OUT_BYTES];
    size_t out_len = head_len <= self->head_max ? plain_head(self, s, s->head, head_len, out, sizeof out) : 0;
    if (!out_len) {
        stream_end(self, s, R_HEAD, 0, s->head, s->head_len);
        return;
    }
    s->head_parsed = 1;
    s->head_t = t;
    s->phase = P_BODY;
    int ok = s->status >= 200 && s->status < 300;
    s->timed = s->want_timed && s->streamed;
    s->holding = s->want_timed && ok && s->want_hold >= 0 ? H_FIRST : 0;
    s->hold_max = s->holding ? (size_t)s->want_hold : 0;
    if (client_write(self, s, out, out_len) < 0)
        return;
    s->head_written = 1;
    size_t body = s->head_len - head_len;
    if (body)
        relay_got(self, s, index, end, body, t);
    else
        watch(self, s, index);
    if (s->reason != R_LIVE || s->phase != P_BODY)
        return;
    free(s->head);
    s->head = NULL;
    s->head_len = 0;
}

static void relay_write(Relayer *self, Stream *s, int index) {
    ssize_t w = send(s->client_fd, s->out, s->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            stream_end(self, s, R_CLIENT_GONE, errno, NULL, 0);
        return;
    }
    memmove(s->out, s->out + w, s->out_len - (size_t)w);
    s->out_len -= (size_t)w;
    s->relayed += (unsigned long long)w;
    watch(self, s, index);
}

static void *relay_thread(void *arg) {
    Relayer *self = arg;
    struct epoll_event evs[EVENTS_MAX];
    int timeout_ms = -1;
    prctl(PR_SET_NAME, "gpushare-relay"); /* top -H, /proc/PID/task/TID/comm */
    for (;;) {
        int n = epoll_wait(self->ep, evs, EVENTS_MAX, timeout_ms);
        if (n < 0) {
            if (errno != EINTR)
                break;
            n = 0;
        }
        /* the lock is taken per event, not per batch: the loop's calls (start, cancel, collect) wait at most
           one read and write, never a batch of them */
        int closing = 0;
        for (int k = 0; k < n && !closing; k++) {
            uint64_t d = evs[k].data.u64;
            if (d == UINT64_MAX)
                continue; /* the quit eventfd */
            if (d == UINT64_MAX - 1) { /* a connect's deadline: the wait is recomputed below */
                uint64_t kicks;
                if (read(self->kick_fd, &kicks, sizeof kicks) < 0) {
                    /* EAGAIN: read by an earlier wake */
                }
                continue;
            }
            int index = (int)(d & 0xffff);
            uint32_t gen = (uint32_t)((d >> 16) & GEN_MASK);
            pthread_mutex_lock(&self->mu);
            closing = self->closing;
            Stream *s = !closing && index < self->n_streams ? &self->streams[index] : NULL;
            if (s != NULL && s->used && s->gen == gen && s->reason == R_LIVE) { /* else ended or cancelled since */
                if (d >> 63) {
                    if ((evs[k].events & (EPOLLERR | EPOLLHUP)) && !(evs[k].events & EPOLLOUT))
                        stream_end(self, s, R_CLIENT_GONE, EPIPE, NULL, 0);
                    else
                        relay_write(self, s, index);
                } else if (s->phase == P_CONNECT || s->phase == P_SEND)
                    request_write(self, s, index, evs[k].events);
                else if (s->phase == P_HEAD)
                    head_read(self, s, index);
                else
                    relay_read(self, s, index);
            }
            pthread_mutex_unlock(&self->mu);
        }
        pthread_mutex_lock(&self->mu);
        if (self->closing) {
            pthread_mutex_unlock(&self->mu);
            break;
        }
        /* the loop is told when a stream ended, or kept read times long enough (or many enough) */
        double now = now_s(), soonest = 0, deadline = 0;
        int tell = 0;
        for (int i = 0; i < self->n_streams; i++) {
            Stream *s = &self->streams[i];
            if (!s->used || s->reported)
                continue;
            if (s->reason == R_LIVE && s->phase == P_CONNECT) { /* an engine that does not answer the connect */
                if (s->deadline <= now)
                    stream_end(self, s, R_CONNECT_FAILED, ETIMEDOUT, NULL, 0);
                else if (deadline == 0 || s->deadline < deadline)
                    deadline = s->deadline;
            }
            if (s->reason != R_LIVE || s->n_times >= TIMES_NOTIFY || s->held_len > s->hold_max / 2)
                tell = 1;
            else if (s->pending_since != 0) {
                double due = s->pending_since + self->flush_s;
                if (due <= now)
                    tell = 1;
                else if (soonest == 0 || due < soonest)
                    soonest = due;
            }
        }
        if (tell && !self->notified) {
            uint64_t one = 1;
            if (write(self->notify_fd, &one, sizeof one) == (ssize_t)sizeof one)
                self->notified = 1;
        }
        timeout_ms = -1;
        if (self->notified)
            soonest = 0; /* (the loop collects what it was told of; flushes wait for that) */
        if (deadline != 0 && (soonest == 0 || deadline < soonest))
            soonest = deadline;
        if (soonest != 0)
            timeout_ms = (int)((soonest - now) * 1000) + 1;
        pthread_mutex_unlock(&self->mu);
    }
    return NULL;
}

/* ---- the Python type ---------------------------------------------------------------------------------- */

/* A sequence of at most PREFIX_MAX bytes objects of at most 31 bytes each into `out` (NUL-ended; `lower`: in
   lower case) and their lengths; -1 with the Python error set where it is not one. */
static int prefixes_of(PyObject *obj, const char *what, int lower, char out[PREFIX_MAX][32], int *lens, int *n) {
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq == NULL)
        return -1;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(seq);
    if (np > PREFIX_MAX) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: more than %d", what, PREFIX_MAX);
        return -1;
    }
    for (Py_ssize_t k = 0; k < np; k++) {
        char *b;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, k), &b, &len) < 0 || len > 31) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s: one over 31 bytes", what);
            return -1;
        }
        for (Py_ssize_t j = 0; j < len; j++)
            out[k][j] = lower && b[j] >= 'A' && b[j] <= 'Z' ? (char)(b[j] + 32) : b[j];
        out[k][len] = 0;
        lens[k] = (int)len;
    }
    *n = (int)np;
    Py_DECREF(seq);
    return 0;
}

static int Relayer_init(Relayer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"notify_fd", "not_tokens", "out_max", "flush_s", "stream_types", "head_max", "hop_headers",
                            NULL};
    int notify_fd;
    PyObject *not_tokens, *stream_types = NULL, *hop_headers = NULL;
    Py_ssize_t out_max, head_max = 64 * 1024;
    double flush_s;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOnd|OnO", names, &notify_fd, &not_tokens, &out_max, &flush_s,
                                     &stream_types, &head_max, &hop_headers))
        return -1;
    if (self->thread_started || self->mu_ready) {
        PyErr_SetString(PyExc_RuntimeError, "a Relayer is initialised once");
        return -1;
    }
    if (prefixes_of(not_tokens, "not_tokens", 0, self->prefixes, self->prefix_len, &self->n_prefixes) < 0)
        return -1;
    if (stream_types != NULL && prefixes_of(stream_types, "stream_types", 1, self->stream_types,
                                            self->stream_type_len, &self->n_stream_types) < 0)
        return -1;
    if (hop_headers != NULL && prefixes_of(hop_headers, "hop_headers", 1, self->hop_headers, self->hop_header_len,
                                           &self->n_hop_headers) < 0)
        return -1;
    if (head_max < 1 || head_max > 16 * 1024 * 1024) {
        PyErr_SetString(PyExc_ValueError, "head_max: 1 byte to 16 MiB");
        return -1;
    }
    self->head_max = (size_t)head_max;
    self->notify_fd = notify_fd;
    self->out_max = out_max > 0 ? (size_t)out_max : 1;
    self->flush_s = flush_s;
    self->in = malloc(READ_BYTES);
    if (self->in == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->ep = epoll_create1(EPOLL_CLOEXEC);
    if (self->ep < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->quit_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->quit_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    epoll_ctl(self->ep, EPOLL_CTL_ADD, self->quit_fd, &ev);
    self->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->kick_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event kick = {.events = EPOLLIN, .data.u64 = UINT64_MAX - 1};
    epoll_ctl(self->ep, EPOLL_CTL_ADD, self->kick_fd, &kick);
    pthread_mutex_init(&self->mu, NULL);
    self->mu_ready = 1;
    int err = pthread_create(&self->thread, NULL, relay_thread, self);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->thread_started = 1;
    return 0;
}

static PyObject *Relayer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Relayer *self = (Relayer *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->ep = self->quit_fd = self->kick_fd = -1;
    return (PyObject *)self;
}

static void relayer_stop(Relayer *self) {
    if (self->thread_started) {
        pthread_mutex_lock(&self->mu);
        self->closing = 1;
        pthread_mutex_unlock(&self->mu);
        uint64_t one = 1;
        if (write(self->quit_fd, &one, sizeof one) < 0) {
            /* cannot fail on an eventfd below its maximum; the thread sees `closing` at its next wake anyway */
        }
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
        self->thread_started = 0;
    }
    for (int i = 0; i < self->n_streams; i++) {
        Stream *s = &self->streams[i];
        if (s->used) {
            stream_release_fds(self, s);
            stream_free(s);
        }
    }
}

static void Relayer_dealloc(Relayer *self) {
    relayer_stop(self);
    free(self->streams);
    free(self->in);
    if (self->ep >= 0)
        close(self->ep);
    if (self->quit_fd >= 0)
        close(self->quit_fd);
    if (self->kick_fd >= 0)
        close(self->kick_fd);
    if (self->mu_ready)
        pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Relayer_close(Relayer *self, PyObject *unused) {
    relayer_stop(self);
    Py_RETURN_NONE;
}

static int lock(Relayer *self) {
    if (!self->thread_started) {
        PyErr_SetString(PyExc_RuntimeError, "the relayer is closed");
        return -1;
    }
    if (pthread_mutex_trylock(&self->mu) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

/* start(up_fd, client_fd, timed, hold_max=-1) -> token: relay from here, at a chunk boundary; both fds are
   dup'ed (ours until the stream ends here, whatever the loop does with its own); hold_max >= 0: reads are held
   for the loop until it calls `seen` with found */
/* A free stream, with dups of both fds, marked used and given its generation (the lock held); NULL with the
   Python error set (the lock released) where none can be had. */
static Stream *claim(Relayer *self, int up_fd, int client_fd, int *index_out) {
    int index = -1;
    for (int i = 0; i < self->n_streams; i++)
        if (!self->streams[i].used) {
            index = i;
            break;
        }
    if (index < 0) {
        if (self->n_streams >= 0xffff) {
            pthread_mutex_unlock(&self->mu);
            PyErr_SetString(PyExc_RuntimeError, "too many streams");
            return NULL;
        }
        int n = self->n_streams ? self->n_streams * 2 : 16;
        if (n > 0xffff)
            n = 0xffff;
        Stream *grown = realloc(self->streams, (size_t)n * sizeof(Stream));
        if (grown == NULL) {
            pthread_mutex_unlock(&self->mu);
            PyErr_NoMemory();
            return NULL;
        }
        for (int i = self->n_streams; i < n; i++) {
            memset(&grown[i], 0, sizeof(Stream));
            grown[i].up_fd = grown[i].client_fd = -1;
        }
        index = self->n_streams;
        self->streams = grown;
        self->n_streams = n;
    }
    Stream *s = &self->streams[index];
    s->up_fd = fcntl(up_fd, F_DUPFD_CLOEXEC, 0);
    s->client_fd = s->up_fd >= 0 ? fcntl(client_fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (s->up_fd < 0 || s->client_fd < 0) {
        int err = errno;
        if (s->up_fd >= 0)
            close(s->up_fd);
        memset(s, 0, sizeof(*s));
        s->up_fd = s->client_fd = -1;
        pthread_mutex_unlock(&self->mu);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    s->used = 1;
    s->gen = self->next_gen = (self->next_gen + 1) & GEN_MASK;
    *index_out = index;
    return s;
}

/* The stream's engine socket into the epoll set (`events`); its token, or NULL (the stream dropped, the lock
   released, the Python error set). */
static PyObject *watched(Relayer *self, Stream *s, int index, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.u64 = ev_data(index, s->gen, 0)};
    if (epoll_ctl(self->ep, EPOLL_CTL_ADD, s->up_fd, &ev) < 0) {
        int err = errno;
        stream_release_fds(self, s);
        stream_free(s);
        pthread_mutex_unlock(&self->mu);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long long token = token_of(index, s->gen);
    pthread_mutex_unlock(&self->mu);
    return PyLong_FromLongLong(token);
}

static PyObject *Relayer_start(Relayer *self, PyObject *args) {
    int up_fd, client_fd, timed, index;
    Py_ssize_t hold_max = -1;
    if (!PyArg_ParseTuple(args, "iip|n", &up_fd, &client_fd, &timed, &hold_max))
        return NULL;
    if (lock(self) < 0)
        return NULL;
    Stream *s = claim(self, up_fd, client_fd, &index);
    if (s == NULL)
        return NULL;
    s->timed = timed;
    s->holding = hold_max >= 0;
    s->hold_max = hold_max >= 0 ? (size_t)hold_max : 0;
    return watched(self, s, index, EPOLLIN);
}

/* request(up_fd, client_fd, data, close_client, timed, hold_max, connect_s) -> token: `data` (the whole request)
   on the engine socket `up_fd`, whose connect has begun; its reply to `client_fd` (see the module's comment).
   timed: the request is timed (its reads are, where the reply's Content-Type is a stream's); hold_max >= 0:
   a 2xx reply's reads are held for the first token, as `start`'s. */
static PyObject *Relayer_request(Relayer *self, PyObject *args) {
    int up_fd, client_fd, close_client, timed, index;
    Py_buffer data;
    Py_ssize_t hold_max;
    double connect_s;
    if (!PyArg_ParseTuple(args, "iiy*ppnd", &up_fd, &client_fd, &data, &close_client, &timed, &hold_max,
                          &connect_s))
        return NULL;
    size_t head_cap = self->head_max + 1 < HEAD_FIRST_BYTES ? self->head_max + 1 : HEAD_FIRST_BYTES;
    char *req = malloc(data.len ? (size_t)data.len : 1), *head = malloc(head_cap);
    if (req == NULL || head == NULL) {
        free(req);
        free(head);
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    memcpy(req, data.buf, (size_t)data.len);
    size_t req_len = (size_t)data.len;
    PyBuffer_Release(&data);
    if (lock(self) < 0) {
        free(req);
        free(head);
        return NULL;
    }
    Stream *s = claim(self, up_fd, client_fd, &index);
    if (s == NULL) {
        free(req);
        free(head);
        return NULL;
    }
    s->phase = P_CONNECT;
    s->req = req;
    s->req_len = req_len;
    s->head = head;
    s->head_cap = head_cap;
    s->deadline = now_s() + connect_s;
    s->close_client = close_client;
    s->want_timed = timed;
    s->want_hold = hold_max;
    /* a connect to a local engine is often done by now: the request goes at once (no wake of the thread for the
       connect; else it waits for the socket to be writable, and says why where the connect failed) */
    ssize_t w = send(s->up_fd, req, req_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
        s->phase = P_SEND;
        s->req_off = (size_t)w;
        if (s->req_off == req_len) {
            free(s->req);
            s->req = NULL;
            s->phase = P_HEAD;
            return watched(self, s, index, EPOLLIN);
        }
    }
    uint64_t one = 1; /* the thread's wait ends by the connect's deadline */
    if (write(self->kick_fd, &one, sizeof one) < 0) {
        /* cannot fail on an eventfd below its maximum */
    }
    return watched(self, s, index, EPOLLOUT);
}

static Stream *find(Relayer *self, long long token) {
    int index = (int)(token & 0xffff);
    uint32_t gen = (uint32_t)((token >> 16) & GEN_MASK);
    if (token < 0 || index >= self->n_streams)
        return NULL;
    Stream *s = &self->streams[index];
    return s->used && s->gen == gen ? s : NULL;
}

/* The stream of the token `arg` (NULL: not known), the lock taken; -1 where `arg` is no token or the relayer is
   closed (the Python error set, the lock not taken). */
static int locked_find(Relayer *self, PyObject *arg, long long *token, Stream **s) {
    *token = PyLong_AsLongLong(arg);
    if ((*token == -1 && PyErr_Occurred()) || lock(self) < 0)
        return -1;
    *s = find(self, *token);
    return 0;
}

/* half_close(token): the client's EOF, passed on to the engine (once the request is written) */
static PyObject *Relayer_half_close(Relayer *self, PyObject *arg) {
    long long token;
    Stream *s;
    if (locked_find(self, arg, &token, &s) < 0)
        return NULL;
    if (s != NULL && s->reason == R_LIVE) {
        if (s->phase == P_CONNECT || s->phase == P_SEND)
            s->shut_up = 1;
        else
            shutdown(s->up_fd, SHUT_WR);
    }
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

/* the read times kept, as a tuple of floats (they are the loop's now) */
static PyObject *take_times(Stream *s) {
    PyObject *t = PyTuple_New(s->n_times);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < s->n_times; k++) {
        PyObject *f = PyFloat_FromDouble(s->times[k]);
        if (f == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, f);
    }
    s->n_times = 0;
    s->pending_since = 0;
    return t;
}

/* The first `len` bytes of the held reads, as a tuple of (time, at, bytes): they are the loop's now. */
static PyObject *take_held(Stream *s, size_t len) {
    Py_ssize_t n = 0;
    for (size_t at = 0; at < len; n++) {
        HeldHead h;
        memcpy(&h, s->held + at, sizeof h);
        at += sizeof h + h.len;
    }
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    size_t at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        HeldHead h;
        memcpy(&h, s->held + at, sizeof h);
        PyObject *one = Py_BuildValue("(dIy#)", h.t, h.at, s->held + at + sizeof h, (Py_ssize_t)h.len);
        if (one == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, one);
        at += sizeof h + h.len;
    }
    memmove(s->held, s->held + len, s->held_len - len);
    s->held_len -= len;
    s->first_len = s->first_len > len ? s->first_len - len : 0;
    if (!s->n_times && !s->held_len)
        s->pending_since = 0;
    return t;
}

/* (token, reason, errno, state, left, out, rest, times, dropped, relayed, held, head): reason 0 while it relays
   (then out and rest are empty). A report with held reads is followed by the loop's `seen`. head: a request's,
   from its first byte: (first byte's time, status, head's time, streamed, written), status 0 until its head was
   parsed; else None. */
static PyObject *report(long long token, Stream *s) {
    PyObject *times = take_times(s);
    if (times == NULL)
        return NULL;
    /* the reads that may hold the first token; those kept aside wait for `seen` */
    PyObject *held = take_held(s, s->holding == H_AFTER ? s->first_len : s->held_len);
    if (held == NULL) {
        Py_DECREF(times);
        return NULL;
    }
    int ended = s->reason != R_LIVE;
    PyObject *head = Py_None;
    Py_INCREF(head);
    if (s->first_byte_t != 0) {
        Py_DECREF(head);
        head = Py_BuildValue("(didii)", s->first_byte_t, s->status, s->head_t, s->streamed, s->head_written);
        if (head == NULL) {
            Py_DECREF(times);
            Py_DECREF(held);
            return NULL;
        }
    }
    PyObject *r = Py_BuildValue("(LiiiKy#y#NnKNN)", token, s->reason, s->err, s->state, (unsigned long long)s->left,
                                ended && s->out ? s->out : "", (Py_ssize_t)(ended && s->out ? s->out_len : 0),
                                ended && s->rest ? s->rest : "", (Py_ssize_t)(ended && s->rest ? s->rest_len : 0),
                                times, s->dropped, s->relayed, held, head);
    s->dropped = 0;
    return r;
}

/* An ended stream whose report was taken: forgotten, unless reads it kept aside wait for the loop's `seen`. */
static void forget(Stream *s) {
    if (s->holding == H_AFTER && s->held_len)
        s->reported = 1;
    else
        stream_free(s);
}

/* collect() -> [report]: every stream that ended here (then forgotten, see `forget`), holds read times or reads
   that may hold its first token */
static PyObject *Relayer_collect(Relayer *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    if (lock(self) < 0) {
        Py_DECREF(list);
        return NULL;
    }
    self->notified = 0;
    for (int i = 0; i < self->n_streams; i++) {
        Stream *s = &self->streams[i];
        if (!s->used || s->reported || (s->reason == R_LIVE && !s->n_times && !s->dropped && !s->first_len))
            continue;
        PyObject *r = report(token_of(i, s->gen), s);
        if (r == NULL || PyList_Append(list, r) < 0) {
            Py_XDECREF(r);
            Py_DECREF(list);
            pthread_mutex_unlock(&self->mu);
            return NULL;
        }
        Py_DECREF(r);
        if (s->reason != R_LIVE)
            forget(s);
    }
    pthread_mutex_unlock(&self->mu);
    return list;
}

/* cancel(token) -> report or None (not ours: ended and collected): the stream ends here now, whatever it was
   doing; its sockets are never touched by the thread again once this returns */
static PyObject *Relayer_cancel(Relayer *self, PyObject *arg) {
    long long token;
    Stream *s;
    if (locked_find(self, arg, &token, &s) < 0)
        return NULL;
    if (s == NULL) {
        pthread_mutex_unlock(&self->mu);
        Py_RETURN_NONE;
    }
    if (s->reason == R_LIVE)
        stream_end(self, s, R_CANCELLED, 0, NULL, 0);
    if (s->reported) { /* the loop has had its report, and is done with it */
        stream_free(s);
        pthread_mutex_unlock(&self->mu);
        Py_RETURN_NONE;
    }
    PyObject *r = report(token, s);
    if (r != NULL)
        forget(s);
    pthread_mutex_unlock(&self->mu);
    return r;
}

/* seen(token, found) -> reads: the loop looked at the held reads of a report. Found (it knows the first token):
   the reads held since that may be a token are given (as tokens: after it), those kept aside dropped (their times
   are the tokens), holding ends. Not found: every read held since is given (the times taken of them forgotten) and
   holding begins again. A stream whose last report was taken is forgotten. () where the stream is not known. */
static PyObject *Relayer_seen(Relayer *self, PyObject *args) {
    long long token;
    int found;
    if (!PyArg_ParseTuple(args, "Lp", &token, &found))
        return NULL;
    if (lock(self) < 0)
        return NULL;
    Stream *s = find(self, token);
    if (s == NULL || !s->holding) {
        pthread_mutex_unlock(&self->mu);
        return PyTuple_New(0);
    }
    PyObject *held = take_held(s, found && s->holding == H_AFTER ? s->first_len : s->held_len);
    if (held != NULL) {
        if (found) {
            s->held_len = s->first_len = 0;
            s->holding = 0;
        } else {
            if (s->holding == H_AFTER)
                s->n_times = 0;
            s->holding = H_FIRST;
        }
        if (!s->n_times)
            s->pending_since = 0;
        if (s->reported) /* its last report was taken: done with it */
            stream_free(s);
        else if (s->reason == R_LIVE)
            watch(self, s, (int)(token & 0xffff));
        /* else it ended since the report the loop looked at: its last report is still to be collected */
    }
    pthread_mutex_unlock(&self->mu);
    return held;
}

static PyMethodDef Relayer_methods[] = {
    {"start", (PyCFunction)Relayer_start, METH_VARARGS, "start(up_fd, client_fd, timed, hold_max=-1) -> token"},
    {"request", (PyCFunction)Relayer_request, METH_VARARGS,
     "request(up_fd, client_fd, data, close_client, timed, hold_max, connect_s) -> token"},
    {"half_close", (PyCFunction)Relayer_half_close, METH_O, "half_close(token)"},
    {"seen", (PyCFunction)Relayer_seen, METH_VARARGS, "seen(token, found) -> held reads"},
    {"collect", (PyCFunction)Relayer_collect, METH_NOARGS, "collect() -> [report]"},
    {"cancel", (PyCFunction)Relayer_cancel, METH_O, "cancel(token) -> report | None"},
    {"close", (PyCFunction)Relayer_close, METH_NOARGS, "close(): the thread ends; every stream is dropped"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RelayerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpushare_tui.core.engines._relay.Relayer",
    .tp_basicsize = sizeof(Relayer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A thread that relays chunked streams between sockets (see the module's source).",
    .tp_new = Relayer_new,
    .tp_init = (initproc)Relayer_init,
    .tp_dealloc = (destructor)Relayer_dealloc,
    .tp_methods = Relayer_methods,
};

static struct PyModuleDef relay_module = {PyModuleDef_HEAD_INIT, "_relay", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&RelayerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&relay_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RelayerType);
    if (PyModule_AddObject(m, "Relayer", (PyObject *)&RelayerType) < 0) {
        Py_DECREF(&RelayerType);
        Py_DECREF(m);
        return NULL;
    }
    static const struct {
        const char *name;
        int value;
    } consts[] = {{"LIVE", R_LIVE},         {"LAST", R_LAST},
                  {"ODD", R_ODD},           {"EOF", R_EOF},
                  {"READ_ERROR", R_READ_ERROR}, {"CLIENT_GONE", R_CLIENT_GONE},
                  {"CANCELLED", R_CANCELLED}, {"DONE", R_DONE},
                  {"HEAD", R_HEAD},         {"CONNECT_FAILED", R_CONNECT_FAILED},
                  {"IN_SIZE", S_SIZE},
                  {"IN_DATA", S_DATA},      {"IN_CRLF", S_CRLF},
                  {"IN_LAST", S_LAST}};
    for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++)
        if (PyModule_AddIntConstant(m, consts[k].name, consts[k].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
