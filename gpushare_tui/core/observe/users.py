"""Whose process each slot names: the real uid from /proc/<pid>/status (spec registry-abi.md §8.1),
read within budgets (core/host/budgets.py), None when this reader cannot verify it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import lru_cache

from ..host.budgets import PROC_STATUS_MAX_BYTES, USER_RECHECK_S
from ..host.clock import ClockUs, mono_us
from ..registry.abi import SlotRecord
from ..registry.segment import user_name

PROC = "/proc"
# the initial namespaces' fixed inode numbers (linux/proc_ns.h PROC_USER_INIT_INO, PROC_PID_INIT_INO)
INITIAL_NAMESPACES = {"user": "user:[4026531837]", "pid": "pid:[4026531836]"}


def read_status_head(pid: int, proc: str = PROC) -> bytes | None:
    """The first PROC_STATUS_MAX_BYTES of /proc/<pid>/status (None when it cannot be read)."""
    if pid <= 0:
        return None
    try:
        fd = os.open(f"{proc}/{pid}/status", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        left = PROC_STATUS_MAX_BYTES
        while left > 0:
            b = os.read(fd, left)
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_status(head: bytes) -> tuple[int | None, int | None]:
    """(real uid, number of NSpid entries) from a status head; None for a line absent, cut or malformed."""
    uid: int | None = None
    nspid: int | None = None
    lines = head.split(b"\n")
    if not head.endswith(b"\n"):
        lines = lines[:-1]  # the last line was cut by the budget
    for line in lines:
        key, _, value = line.partition(b":")
        fields = value.split()
        if key == b"Uid" and len(fields) == 4 and all(f.isdigit() for f in fields):
            uid = int(fields[0])
        elif key == b"NSpid" and fields and all(f.isdigit() for f in fields):
            nspid = len(fields)
    return uid, nspid


def real_uid_of(pid: int, proc: str = PROC) -> int | None:
    """The real uid of `pid` when it is verifiable here (§8.1): readable, in our (initial) pid namespace."""
    head = read_status_head(pid, proc)
    if head is None:
        return None
    uid, nspid = parse_status(head)
    return uid if nspid == 1 else None


def reader_can_verify(proc: str = PROC) -> bool:
    """This process is in the initial user and pid namespaces and its /proc is theirs (§8.1): the uids
    it reads are the kernel's, and the pids it reads name the processes their owners wrote."""
    try:
        if any(os.readlink(f"{proc}/self/ns/{ns}") != link for ns, link in INITIAL_NAMESPACES.items()):
            return False
    except OSError:
        return False
    head = read_status_head(os.getpid(), proc)
    return head is not None and parse_status(head)[1] == 1


class UserReader:
    """slot -> the real uid of its pid, for the alive slots, re-read at most every USER_RECHECK_S per
    (pid, boot_us) (a changed identity is read at once). Dead and free slots are None."""

    def __init__(
        self,
        *,
        read_uid: Callable[[int], int | None] = real_uid_of,
        can_verify: bool | None = None,
        clock_us: ClockUs = mono_us,
        recheck_us: int = int(USER_RECHECK_S * 1e6),
    ) -> None:
        self._read = read_uid
        self._can_verify = reader_can_verify() if can_verify is None else can_verify
        self._clock = clock_us
        self._recheck_us = recheck_us
        self._cache: dict[tuple[int, int], tuple[int | None, int]] = {}

    @property
    def can_verify(self) -> bool:
        return self._can_verify

    def uids(self, slots: Iterable[SlotRecord], now_us: int) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        mono = self._clock()
        keep: dict[tuple[int, int], tuple[int | None, int]] = {}
        for s in slots:
            if not s.is_alive(now_us):
                continue
            ident = (s.pid, s.boot_us)
            hit = self._cache.get(ident)
            if hit is None or mono - hit[1] >= self._recheck_us:
                hit = (self._read(s.pid) if self._can_verify else None, mono)
            keep[ident] = hit
            out[s.index] = hit[0]
        self._cache = keep
        return out


@lru_cache(maxsize=256)
def user_label(uid: int) -> str:
    """The user name of `uid` for the views (the uid as text when it has none); cached: names rarely change."""
    return user_name(uid)
