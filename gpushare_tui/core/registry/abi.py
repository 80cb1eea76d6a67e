"""Registry ABI v1 (spec registry-abi.md §1–3) and its Extension 1 fields (§7): layout constants, pure pack/unpack.

No I/O here. Offsets are byte-exact; C peers read and write the same segment.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from ..host.errors import UsageError

MAGIC = b"OCGPU\0\0\0"
VERSION = 1
SLOT_COUNT = 16
SLOT_SIZE = 128
HEADER_SIZE = 64
SEGMENT_SIZE = 4096
SEGMENT_PREFIX = "opencoti-gpu-"
NAME_BYTES = 48

ALIVE_US = 3_000_000  # heartbeat age (either way: a future one is corrupt or stepped) beyond which a slot is dead
ACTIVITY_WINDOW_US = 2_000_000

# The layout, spelled once: (field, struct code) in order. Little-endian, natural C alignment
# with no padding inside (checked below; the tests compare the offsets with a C compiler's).
HEADER_FIELDS = (("magic", "8s"), ("version", "I"), ("slot_count", "I"), ("slot_size", "I"), ("header_size", "I"))
SLOT_FIELDS = (
    ("pid", "I"),  # claimed with a 32-bit CAS
    ("seq", "I"),  # seqlock
    ("boot_us", "q"),
    ("weight", "f"),
    ("active", "I"),
    ("heartbeat_us", "q"),
    ("busy_ppm", "I"),
    ("name", f"{NAME_BYTES}s"),
    ("flags", "I"),  # Extension 1 (§7); a v1 owner writes 0
    ("busy_total_us", "Q"),  # Extension 1 (§7)
)

# Extension 1 `flags` bits (spec §7).
FLAG_EXT1 = 1 << 0  # the owner implements Extension 1
FLAG_INTERACTIVE = 1 << 1  # latency class interactive (0: batch)
FLAG_DEMAND = 1 << 2  # work in flight now
FLAG_PRIORITY = 1 << 3  # an interactive owner's claim to run first (within its budget)
FLAG_USERS = 1 << 4  # Extension 2 (§8): the owner implements it and verified every other alive slot's user
FLAGS_KNOWN = FLAG_EXT1 | FLAG_INTERACTIVE | FLAG_DEMAND | FLAG_PRIORITY | FLAG_USERS


def _offsets(fields: tuple[tuple[str, str], ...]) -> dict[str, int]:
    out, off = {}, 0
    for name, code in fields:
        size = struct.calcsize("<" + code)
        align = 1 if code.endswith("s") else size
        assert off % align == 0, f"{name} at {off} is not naturally aligned: the layout would need padding"
        out[name], off = off, off + size
    return out


def _struct(fields: tuple[tuple[str, str], ...], total: int) -> struct.Struct:
    codes = "".join(code for _, code in fields)
    return struct.Struct(f"<{codes}{total - struct.calcsize('<' + codes)}x")


HEADER_OFFSETS = _offsets(HEADER_FIELDS)
SLOT_OFFSETS = _offsets(SLOT_FIELDS)
HEADER_STRUCT = _struct(HEADER_FIELDS, HEADER_SIZE)  # reserved bytes to the end are zero
SLOT_STRUCT = _struct(SLOT_FIELDS, SLOT_SIZE)
# The owner's fields after `seq` (one seqlock write), and the words written atomically on their own.
OWNER_FIELDS_STRUCT = struct.Struct("<" + "".join(code for name, code in SLOT_FIELDS if name not in ("pid", "seq")))
OFF_PID = SLOT_OFFSETS["pid"]
OFF_SEQ = SLOT_OFFSETS["seq"]
OFF_BOOT_US = SLOT_OFFSETS["boot_us"]
OFF_HEARTBEAT_US = SLOT_OFFSETS["heartbeat_us"]
OFF_FLAGS = SLOT_OFFSETS["flags"]
OFF_BUSY_TOTAL_US = SLOT_OFFSETS["busy_total_us"]
OFF_RESERVED = OFF_BUSY_TOTAL_US + 8

_KEY_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")


LATENCY_CLASSES = ("interactive", "batch")  # spec §7: INTERACTIVE set / clear; batch is the default


class BadClassError(UsageError, ValueError):
    """A latency class that is not one of LATENCY_CLASSES."""


def validate_class(value: object, *, label: str = "class") -> str:
    """`value` as a latency class (spec §7), else BadClassError naming `label`."""
    if value not in LATENCY_CLASSES:
        raise BadClassError(f"invalid {label} {value!r}: must be one of {', '.join(LATENCY_CLASSES)}")
    return str(value)


class BadKeyError(UsageError, ValueError):
    """A gpu_key that does not match `[A-Za-z0-9._-]{1,64}`."""


class BadWeightError(UsageError, ValueError):
    """A weight that is not a finite f32 > 0."""


def validate_gpu_key(key: str) -> str:
    """Return `key` unchanged if valid, else raise BadKeyError."""
    if not _KEY_RE.fullmatch(key or "") or key in (".", ".."):
        raise BadKeyError(f"invalid gpu key {key!r}: use 1..64 characters of [A-Za-z0-9._-]")
    return key


def derive_gpu_key(raw: str) -> str:
    """Turn a derived identifier (e.g. an NVML UUID) into a valid key."""
    return validate_gpu_key(_KEY_BAD_CHAR.sub("-", raw)[:64])


def segment_name(key: str) -> str:
    """POSIX shm name (with leading slash) for a gpu key."""
    return "/" + SEGMENT_PREFIX + key


def to_f32(x: float) -> float:
    """Round a float to the f32 the slot stores."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# The one text of the weight rule (parse_weight's errors, `up` files, the dashboard's forms, --help):
# an f32 > 0 (FLT_MAX is 3.4028235e38; a value too small for an f32 rounds to 0, also refused).
WEIGHT_RULE = "must be a number > 0, at most 3.4e38 (an f32)"


def weight_is_valid(w: float) -> bool:
    return math.isfinite(w) and w > 0


def parse_weight(value: object) -> float:
    """The f32 weight of a user's text (" 2", "0.5") or a number: finite and > 0, also once
    rounded to f32. Anything else (empty, not a number, NaN, inf, <= 0, beyond f32 or too
    small for it, a bool, None) is a BadWeightError with the one-line reason."""
    try:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise TypeError
        w = float(value)
        w32 = to_f32(w) if weight_is_valid(w) else math.nan
    except (TypeError, ValueError, OverflowError):  # OverflowError: beyond FLT_MAX
        w32 = math.nan
    if not weight_is_valid(w32):
        raise BadWeightError(f"invalid weight {value!r}: {WEIGHT_RULE}")
    return w32


@dataclass(frozen=True)
class Header:
    magic: bytes
    version: int
    slot_count: int
    slot_size: int
    header_size: int


@dataclass(frozen=True)
class SlotRecord:
    """One slot as read (already seqlock-consistent)."""

    index: int
    pid: int
    seq: int
    boot_us: int
    weight: float
    active: int
    heartbeat_us: int
    busy_ppm: int
    name_raw: bytes
    flags: int = 0  # Extension 1 (§7): FLAG_* bits; 0 from a v1 owner
    busy_total_us: int = 0  # Extension 1 (§7)

    @property
    def ext1(self) -> bool:
        """The owner implements Extension 1 (a v1 owner leaves the bit 0)."""
        return bool(self.flags & FLAG_EXT1)

    @property
    def name(self) -> str:
        return self.name_raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")

    def is_alive(self, now_us: int) -> bool:
        """pid set and heartbeat within 3 s of now, either way (spec §4): a heartbeat far in
        the future is corrupt or from a stepped clock, and must not hold a slot forever."""
        return self.pid != 0 and -ALIVE_US <= now_us - self.heartbeat_us <= ALIVE_US

    def is_member(self, now_us: int) -> bool:
        return self.is_alive(now_us) and self.active == 1 and weight_is_valid(self.weight)


def alive_span_us(slots: Iterable[SlotRecord], now_us: int) -> tuple[int, int]:
    """[lo, hi): the wall-clock span around `now_us` in which no slot of `slots` becomes alive or dead (§4: a
    claimed slot is alive while -ALIVE_US <= now - heartbeat_us <= ALIVE_US). Every rule reads the time only
    through that, so what it says at `now_us` holds anywhere in the span while the slots stay as they are."""
    lo, hi = -(2**63), 2**63
    for s in slots:
        if not s.pid:
            continue
        born, dies = s.heartbeat_us - ALIVE_US, s.heartbeat_us + ALIVE_US + 1
        if now_us < born:
            hi = min(hi, born)
        elif now_us < dies:
            lo, hi = max(lo, born), min(hi, dies)
        else:
            lo = max(lo, dies)
    return lo, hi


def pack_header() -> bytes:
    return HEADER_STRUCT.pack(MAGIC, VERSION, SLOT_COUNT, SLOT_SIZE, HEADER_SIZE)


def unpack_header(buf: bytes) -> Header:
    magic, version, slot_count, slot_size, header_size = HEADER_STRUCT.unpack_from(buf, 0)
    return Header(magic, version, slot_count, slot_size, header_size)


def header_problem(h: Header, segment_size: int) -> str | None:
    """Why a header cannot be used, or None if it is valid for ABI v1 readers."""
    if h.magic != MAGIC:
        return f"bad magic {h.magic!r}"
    if h.version != VERSION:
        return f"unsupported version {h.version}"
    if h.slot_size < SLOT_SIZE or h.header_size < HEADER_SIZE or h.slot_count == 0:
        return f"bad layout (header {h.header_size}, slot {h.slot_size} x {h.slot_count})"
    if h.header_size + h.slot_count * h.slot_size > segment_size:
        return f"layout exceeds segment size {segment_size}"
    return None


def encode_name(name: str) -> bytes:
    """UTF-8, truncated to 48 bytes on a character boundary, NUL-padded."""
    raw = name.encode("utf-8")[:NAME_BYTES]
    while raw:
        try:
            raw.decode("utf-8")
            break
        except UnicodeDecodeError:
            raw = raw[:-1]
    return raw.ljust(NAME_BYTES, b"\0")


def unpack_slot(index: int, buf: bytes) -> SlotRecord:
    pid, seq, boot_us, weight, active, hb, busy, name, flags, busy_total = SLOT_STRUCT.unpack_from(buf, 0)
    return SlotRecord(index, pid, seq, boot_us, weight, active, hb, busy, name, flags, busy_total)


def pack_slot(rec: SlotRecord) -> bytes:
    return SLOT_STRUCT.pack(
        rec.pid,
        rec.seq,
        rec.boot_us,
        rec.weight,
        rec.active,
        rec.heartbeat_us,
        rec.busy_ppm,
        rec.name_raw,
        rec.flags,
        rec.busy_total_us,
    )
