"""ABI v1 layout (spec §2–3): constants, pack/unpack, validation, and agreement with a C compiler."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.shm import shm_file

# -- constants and pure pack/unpack -----------------------------------------


def test_layout_constants() -> None:
    assert abi.MAGIC == b"OCGPU\0\0\0"
    assert (abi.VERSION, abi.SLOT_COUNT, abi.SLOT_SIZE, abi.HEADER_SIZE, abi.SEGMENT_SIZE) == (1, 16, 128, 64, 4096)
    assert abi.HEADER_STRUCT.size == 64
    assert abi.SLOT_STRUCT.size == 128
    assert abi.HEADER_SIZE + abi.SLOT_COUNT * abi.SLOT_SIZE <= abi.SEGMENT_SIZE
    assert abi.SLOT_OFFSETS == {
        "pid": 0,
        "seq": 4,
        "boot_us": 8,
        "weight": 16,
        "active": 20,
        "heartbeat_us": 24,
        "busy_ppm": 32,
        "name": 36,
        "flags": 84,  # Extension 1 (§7)
        "busy_total_us": 88,
    }
    assert abi.OFF_RESERVED == 96 == abi.SLOT_OFFSETS["busy_total_us"] + 8
    assert abi.OWNER_FIELDS_STRUCT.size == abi.OFF_RESERVED - abi.OFF_BOOT_US
    assert abi.HEADER_OFFSETS == {"magic": 0, "version": 8, "slot_count": 12, "slot_size": 16, "header_size": 20}


def test_pack_header_bytes() -> None:
    h = abi.pack_header()
    assert len(h) == 64
    assert h[:8] == b"OCGPU\0\0\0"
    assert struct.unpack_from("<IIII", h, 8) == (1, 16, 128, 64)
    assert h[24:] == b"\0" * 40
    parsed = abi.unpack_header(h)
    assert abi.header_problem(parsed, 4096) is None


def test_slot_round_trip_little_endian_at_spec_offsets() -> None:
    rec = abi.SlotRecord(
        index=3,
        pid=0x01020304,
        seq=6,
        boot_us=-2,
        weight=abi.to_f32(0.3),
        active=1,
        heartbeat_us=1_764_000_000_123_456,
        busy_ppm=999_999,
        name_raw=abi.encode_name("llama-7b"),
    )
    buf = abi.pack_slot(rec)
    assert len(buf) == 128
    assert buf[0:4] == b"\x04\x03\x02\x01"  # little-endian
    assert struct.unpack_from("<I", buf, 4)[0] == 6
    assert struct.unpack_from("<q", buf, 8)[0] == -2
    assert struct.unpack_from("<f", buf, 16)[0] == abi.to_f32(0.3)
    assert struct.unpack_from("<I", buf, 20)[0] == 1
    assert struct.unpack_from("<q", buf, 24)[0] == 1_764_000_000_123_456
    assert struct.unpack_from("<I", buf, 32)[0] == 999_999
    assert buf[36:44] == b"llama-7b" and buf[44:84] == b"\0" * 40
    assert buf[84:] == b"\0" * 44  # a record without Extension 1 fields packs them as a v1 owner writes them
    assert abi.unpack_slot(3, buf) == rec
    assert rec.name == "llama-7b"


def test_extension1_fields_at_spec_offsets() -> None:
    flags = abi.FLAG_EXT1 | abi.FLAG_DEMAND
    rec = abi.SlotRecord(1, 7, 2, 3, 1.0, 1, 4, 5, abi.encode_name("x"), flags=flags, busy_total_us=2**40 + 3)
    buf = abi.pack_slot(rec)
    assert struct.unpack_from("<I", buf, 84)[0] == 0b101
    assert struct.unpack_from("<Q", buf, 88)[0] == 2**40 + 3
    assert buf[96:] == b"\0" * 32
    back = abi.unpack_slot(1, buf)
    assert back == rec and back.ext1
    assert not abi.unpack_slot(1, abi.pack_slot(abi.SlotRecord(1, 7, 2, 3, 1.0, 1, 4, 5, b"\0" * 48))).ext1


@pytest.mark.parametrize(
    ("h", "why"),
    [
        (abi.Header(b"OCGPX\0\0\0", 1, 16, 128, 64), "bad magic"),
        (abi.Header(abi.MAGIC, 2, 16, 128, 64), "unsupported version 2"),
        (abi.Header(abi.MAGIC, 1, 0, 128, 64), "bad layout"),
        (abi.Header(abi.MAGIC, 1, 16, 64, 64), "bad layout"),
        (abi.Header(abi.MAGIC, 1, 16, 128, 32), "bad layout"),
        (abi.Header(abi.MAGIC, 1, 32, 128, 64), "exceeds segment size"),
    ],
)
def test_header_problems(h: abi.Header, why: str) -> None:
    assert why in (abi.header_problem(h, 4096) or "")


def test_header_from_a_later_version_layout_is_accepted_if_it_fits() -> None:
    # readers use header_size/slot_size/slot_count from the header
    assert abi.header_problem(abi.Header(abi.MAGIC, 1, 16, 192, 128), 4096) is None
    assert abi.header_problem(abi.Header(abi.MAGIC, 1, 16, 256, 64), 4096) is not None  # 64 + 4096 > 4096


def test_encode_name_truncates_on_character_boundary() -> None:
    assert abi.encode_name("") == b"\0" * 48
    assert abi.encode_name("a" * 60) == b"a" * 48
    # 47 ASCII + a 2-byte char: the char would straddle byte 48, so it is dropped
    raw = abi.encode_name("a" * 47 + "é")
    assert raw == b"a" * 47 + b"\0"
    raw = abi.encode_name("€" * 20)  # 3 bytes each: 16 fit exactly
    assert raw == ("€" * 16).encode()
    raw = abi.encode_name("x" + "€" * 20)  # 1 + 15*3 = 46, the 16th would end at 49
    assert raw == ("x" + "€" * 15).encode() + b"\0\0"
    assert len(raw) == 48


def test_invalid_utf8_name_is_tolerated() -> None:
    rec = abi.SlotRecord(0, 1, 0, 0, 1.0, 0, 0, 0, b"ok\xff\xfe\xc3".ljust(48, b"\0"))
    assert rec.name == "ok\ufffd\ufffd\ufffd"
    rec = abi.SlotRecord(0, 1, 0, 0, 1.0, 0, 0, 0, b"x" * 48)  # no NUL at all
    assert rec.name == "x" * 48


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e39, 3.5e38, 1e-50, -1e39, "abc", None, "1e40", ""]
    + ["0", "-2", "nan", "inf", "-inf", "1e39", "x", "  "],  # as typed in the dashboard's weight field
)
def test_parse_weight_rejects(bad: object) -> None:
    why = f"^invalid weight {re.escape(repr(bad))}: {re.escape(abi.WEIGHT_RULE)}$"  # the one line the CLI prints
    assert abi.WEIGHT_RULE == "must be a number > 0, at most 3.4e38 (an f32)"  # 1e308 is finite: say the range
    with pytest.raises(abi.BadWeightError, match=why):
        abi.parse_weight(bad)
    assert issubclass(abi.BadWeightError, ValueError)


def test_parse_weight_rounds_to_f32() -> None:
    assert abi.parse_weight(0.1) == abi.to_f32(0.1) != 0.1
    assert abi.parse_weight("2.5") == 2.5
    assert abi.parse_weight(3.4e38) == abi.to_f32(3.4e38)  # below FLT_MAX: fits
    assert abi.parse_weight(3.4028234e38) == abi.to_f32(3.4028234e38)
    assert abi.parse_weight(1e-30) > 0
    assert abi.parse_weight(" 2 ") == 2.0 and abi.parse_weight(3) == 3.0  # a user's text, a JSON int
    with pytest.raises(abi.BadWeightError):
        abi.parse_weight(True)
    assert abi.weight_is_valid(1.0) and not abi.weight_is_valid(math.nan) and not abi.weight_is_valid(0.0)


@pytest.mark.parametrize("key", ["a", "GPU-8f3c0e2a-1234", "metal-0", "x" * 64, "a.b_c-D9", "..a", "-"])
def test_valid_keys(key: str) -> None:
    assert abi.validate_gpu_key(key) == key
    assert abi.segment_name(key) == "/opencoti-gpu-" + key


@pytest.mark.parametrize("key", ["", ".", "..", "../x", "a/b", "x" * 65, "sp ace", "é", "a\0b", "a\nb"])
def test_invalid_keys(key: str) -> None:
    with pytest.raises(abi.BadKeyError, match="invalid gpu key"):
        abi.validate_gpu_key(key)


def test_derive_gpu_key_replaces_bad_characters() -> None:
    assert abi.derive_gpu_key("MIG-GPU/0:1 x") == "MIG-GPU-0-1-x"
    assert abi.derive_gpu_key("GPU-" + "a" * 80) == ("GPU-" + "a" * 80)[:64]


# -- agreement with a C compiler ---------------------------------------------

C_SOURCE = r"""
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct ocgpu_header {
    char magic[8];
    uint32_t version;
    uint32_t slot_count;
    uint32_t slot_size;
    uint32_t header_size;
    char reserved[40];
};

struct ocgpu_slot {
    uint32_t pid;
    uint32_t seq;
    int64_t boot_us;
    float weight;
    uint32_t active;
    int64_t heartbeat_us;
    uint32_t busy_ppm;
    char name[48];
    uint32_t flags;
    uint64_t busy_total_us;
    char reserved[32];
};

#define OFF(s, f) printf("\"%s.%s\": %zu,\n", #s, #f, offsetof(struct s, f))

static struct ocgpu_slot *map_slot(const char *path, int index, char **base) {
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror("open"); exit(3); }
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(3); }
    struct ocgpu_header *h = (struct ocgpu_header *)p;
    if (memcmp(h->magic, "OCGPU\0\0\0", 8) != 0 || h->version != 1) { fprintf(stderr, "bad header\n"); exit(4); }
    *base = p;
    return (struct ocgpu_slot *)(p + h->header_size + (size_t)index * h->slot_size);
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int main(int argc, char **argv) {
    if (argc == 1) {
        printf("{\n");
        OFF(ocgpu_header, magic); OFF(ocgpu_header, version); OFF(ocgpu_header, slot_count);
        OFF(ocgpu_header, slot_size); OFF(ocgpu_header, header_size);
        OFF(ocgpu_slot, pid); OFF(ocgpu_slot, seq); OFF(ocgpu_slot, boot_us); OFF(ocgpu_slot, weight);
        OFF(ocgpu_slot, active); OFF(ocgpu_slot, heartbeat_us); OFF(ocgpu_slot, busy_ppm);
        OFF(ocgpu_slot, name); OFF(ocgpu_slot, flags); OFF(ocgpu_slot, busy_total_us); OFF(ocgpu_slot, reserved);
        printf("\"sizeof_header\": %zu, \"sizeof_slot\": %zu\n}\n",
               sizeof(struct ocgpu_header), sizeof(struct ocgpu_slot));
        return 0;
    }
    char *base;
    struct ocgpu_slot *s = map_slot(argv[2], atoi(argv[3]), &base);
    if (strcmp(argv[1], "read") == 0) {
        uint32_t a, b;
        struct ocgpu_slot copy;
        for (int i = 0; i < 8; i++) {
            a = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
            memcpy(&copy, s, sizeof copy);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            b = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
            if (!(a & 1) && a == b) break;
        }
        printf("{\"pid\": %" PRIu32 ", \"seq\": %" PRIu32 ", \"boot_us\": %" PRId64 ", \"weight\": %.9g, "
               "\"active\": %" PRIu32 ", \"heartbeat_us\": %" PRId64 ", \"busy_ppm\": %" PRIu32 ", \"name_hex\": \"",
               copy.pid, copy.seq, copy.boot_us, (double)copy.weight, copy.active, copy.heartbeat_us, copy.busy_ppm);
        for (int i = 0; i < 48; i++) printf("%02x", (unsigned char)copy.name[i]);
        printf("\"}\n");
        return 0;
    }
    /* write PATH SLOT PID: claim a free slot as the spec says, then a seqlock write */
    uint32_t pid = (uint32_t)strtoul(argv[4], NULL, 10);
    uint32_t expected = 0;
    __atomic_store_n(&s->heartbeat_us, now_us(), __ATOMIC_RELEASE);
    if (!__atomic_compare_exchange_n(&s->pid, &expected, pid, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "slot taken by %" PRIu32 "\n", expected);
        return 5;
    }
    __atomic_fetch_add(&s->seq, 1, __ATOMIC_ACQ_REL);
    s->boot_us = 1234567890123LL;
    s->weight = 2.5f;
    s->active = 1;
    s->heartbeat_us = now_us();
    s->busy_ppm = 250000;
    memset(s->name, 0, sizeof s->name);
    memcpy(s->name, "c-peer \xc3\xa9\xff", 10); /* UTF-8 e-acute, then an invalid byte */
    __atomic_fetch_add(&s->seq, 1, __ATOMIC_RELEASE);
    printf("ok\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_prog(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc)")
    d = tmp_path_factory.mktemp("cabi")
    src, exe = d / "abi.c", d / "abi"
    src.write_text(C_SOURCE)
    r = subprocess.run(
        [cc, "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O1", "-Wall", "-o", str(exe), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"cc failed:\n{r.stderr}"
    return str(exe)


def test_offsets_match_c(c_prog: str) -> None:
    out = json.loads(subprocess.run([c_prog], check=True, capture_output=True, text=True).stdout)
    assert out.pop("sizeof_header") == abi.HEADER_STRUCT.size == 64
    assert out.pop("sizeof_slot") == abi.SLOT_STRUCT.size == 128
    assert out.pop("ocgpu_slot.reserved") == abi.OFF_RESERVED
    header = {k.split(".", 1)[1]: v for k, v in out.items() if k.startswith("ocgpu_header.")}
    slot = {k.split(".", 1)[1]: v for k, v in out.items() if k.startswith("ocgpu_slot.")}
    assert header == abi.HEADER_OFFSETS
    assert slot == abi.SLOT_OFFSETS


def test_c_peer_reads_python_slot_and_python_reads_c_slot(c_prog: str, gpu_key: str) -> None:
    m = Membership(gpu_key, 1.5, "py-peer ✓", heartbeat_s=3600)
    try:
        slot = m.join()
        m.mark_active()
        path = shm_file(gpu_key)

        # C reads what Python wrote
        got = json.loads(
            subprocess.run([c_prog, "read", path, str(slot)], check=True, capture_output=True, text=True).stdout
        )
        mine = m.segment.read_slot(slot)
        assert got["pid"] == m.pid == mine.pid
        assert got["seq"] == mine.seq and got["seq"] % 2 == 0 and got["seq"] > 0
        assert got["boot_us"] == m.boot_us
        assert got["weight"] == 1.5
        assert got["active"] == 1
        assert got["heartbeat_us"] == mine.heartbeat_us
        assert bytes.fromhex(got["name_hex"]) == abi.encode_name("py-peer ✓")

        # Python reads what C wrote (C claims the next free slot with its own CAS)
        c_slot = slot + 1
        fake_pid = 4_000_000
        before = time.time_ns() // 1000
        r = subprocess.run([c_prog, "write", path, str(c_slot), str(fake_pid)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rec = m.segment.read_slot(c_slot)
        assert rec.pid == fake_pid
        assert rec.seq == 2
        assert rec.boot_us == 1234567890123
        assert rec.weight == 2.5
        assert rec.active == 1
        assert before <= rec.heartbeat_us <= time.time_ns() // 1000
        assert rec.busy_ppm == 250000
        assert rec.name == "c-peer é\ufffd"
        # the C CAS refuses a taken slot
        r = subprocess.run([c_prog, "write", path, str(slot), str(fake_pid)], capture_output=True, text=True)
        assert r.returncode == 5 and f"slot taken by {m.pid}" in r.stderr

        # and the schedule sees both: 1.5 : 2.5
        with Segment.attach_readonly(path) as ro:
            now = time.time_ns() // 1000
            snap = build_gpu_snapshot(gpu_key, ro.name, ro.read_slots(), now)
        peers = {p.slot: p for p in snap.peers}
        assert peers[c_slot].name == "c-peer é\ufffd" and peers[c_slot].busy_pct == 25.0
        assert peers[slot].share_pct == pytest.approx(37.5) and peers[c_slot].share_pct == pytest.approx(62.5)
        assert snap.period_ms is not None
    finally:
        m.leave()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 4242]), st.integers(-8_000_000, 8_000_000)),  # (pid, heartbeat - now)
        max_size=6,
    ),
    st.integers(-5_000_000, 5_000_000),
)
def test_alive_span_is_where_no_slot_becomes_alive_or_dead(slots: list[tuple[int, int]], shift_us: int) -> None:
    """abi.alive_span_us: anywhere in [lo, hi) every slot is alive as it is at now, and at each finite end some
    slot is not (the span is the widest such): what lets a decision made at now be kept while the slots stay."""
    from gpushare_tui.core.registry.abi import SlotRecord, alive_span_us

    now = 1_800_000_000_000_000
    recs = [SlotRecord(i, pid, 2, 1, 1.0, 1, now + hb, 0, b"") for i, (pid, hb) in enumerate(slots)]
    lo, hi = alive_span_us(recs, now)
    assert lo <= now < hi
    alive = [r.is_alive(now) for r in recs]
    t = now + shift_us
    if lo <= t < hi:
        assert [r.is_alive(t) for r in recs] == alive
    if hi < 2**63:
        assert [r.is_alive(hi) for r in recs] != alive
    if lo > -(2**63):
        assert [r.is_alive(lo - 1) for r in recs] != alive
