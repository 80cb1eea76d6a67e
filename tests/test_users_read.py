"""Spec §8.1: a slot's user, read from /proc/<pid>/status within PROC_STATUS_MAX_BYTES; None when unverifiable."""

from __future__ import annotations

import os

from gpushare_tui.core.host.budgets import PROC_STATUS_MAX_BYTES
from gpushare_tui.core.observe import users
from gpushare_tui.core.observe.users import UserReader, parse_status
from gpushare_tui.core.registry.abi import SlotRecord

STATUS = b"Name:\tx\nUmask:\t0022\nState:\tS\nUid:\t65534\t0\t0\t0\nGid:\t0\t0\t0\t0\nNSpid:\t%s\n"


def test_parse_takes_the_real_uid_and_counts_nspid() -> None:
    assert parse_status(STATUS % b"12") == (65534, 1)
    assert parse_status(STATUS % b"12\t3") == (65534, 2)
    assert parse_status(b"Name:\tUid:\t0\t0\t0\t0\nUid:\t7\t0\t0\t0\nNSpid:\t1\n") == (
        7,
        1,
    )  # a Name line is no Uid line
    assert parse_status(b"Uid:\t7\t0\t0\t0\nNSpid:\t12") == (7, None)  # the NSpid line was cut by the budget
    assert parse_status(b"Uid:\t7\t0\t0\nNSpid:\t1\n") == (None, 1)  # malformed
    assert parse_status(b"Uid:\t-1\t0\t0\t0\nNSpid:\tx\n") == (None, None)


def test_our_own_user_is_our_real_uid() -> None:
    assert users.real_uid_of(os.getpid()) == os.getuid()
    assert users.real_uid_of(0) is None and users.real_uid_of(2**31 - 1) is None
    assert users.read_status_head(os.getpid()) is not None
    assert len(users.read_status_head(os.getpid()) or b"") <= PROC_STATUS_MAX_BYTES


def _slot(i: int, pid: int, boot: int, hb: int) -> SlotRecord:
    return SlotRecord(i, pid, 0, boot, 1.0, 1, hb, 0, b"\0" * 48)


def test_reader_caches_per_identity_and_rechecks() -> None:
    reads: list[int] = []
    t = [0]

    def read(pid: int) -> int | None:
        reads.append(pid)
        return None if pid == 13 else pid * 10

    r = UserReader(read_uid=read, can_verify=True, clock_us=lambda: t[0], recheck_us=1_000_000)
    now = 10_000_000
    slots = [_slot(0, 11, 1, now), _slot(1, 13, 1, now), _slot(2, 12, 1, now - 4_000_000)]  # slot 2 dead
    assert r.uids(slots, now) == {0: 110, 1: None}
    assert r.uids(slots, now) == {0: 110, 1: None} and reads == [11, 13]  # cached
    slots[0] = _slot(0, 11, 2, now)  # a new identity is read at once
    r.uids(slots, now)
    assert reads == [11, 13, 11]
    t[0] = 1_000_000  # and every one again after the recheck interval
    r.uids(slots, now)
    assert reads == [11, 13, 11, 11, 13]
    blind = UserReader(read_uid=read, can_verify=False)  # a reader in another namespace verifies nobody
    assert blind.uids(slots, now) == {0: None, 1: None}
