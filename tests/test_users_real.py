"""Extension 2 with real users (spec §8): root and uid 65534 in one share group, synthetic engines
paced in-process. User A (root) runs 3 engines at 1, 1, 1 and user B (65534) one: B gets half, A's a
sixth each, by accounted busy time (busy_total_us); A re-weights to 2, 1, 1: 25 / 12.5 / 12.5 / 50; a
v1 writer joins: everyone is on the per-engine split until it leaves. All beside a CPU hog.
Hostile: a slot's user is the kernel's, whatever the process names itself, however many groups it
has, in whatever pid namespace it hides."""

from __future__ import annotations

import grp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

from gpushare_tui.core.host.budgets import PROC_STATUS_MAX_BYTES
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe import users
from gpushare_tui.core.observe.snapshot import GpuSnapshot, SegmentReader, build_gpu_snapshot
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv, run_cli
from testkit.other_user import OTHER_GID, OTHER_UID, why_not_other_user
from testkit.procs import Procs
from testkit.shm import shm_file
from testkit.wait import wait_for

GROUP = "nogroup"  # gid 65534: uid 65534's group, the share group of both users
AS_OTHER = ["setpriv", "--reuid", str(OTHER_UID), "--regid", str(OTHER_GID), "--clear-groups"]
STEP_MS = "2"
MEASURE_S = 4.0  # each of ROUNDS spans
ROUNDS = 3
# Accounted busy vs the configured split, in points: the medians of three 4 s spans. The issue asks 2. Measured
# on 2 shared cores at load 6-16 (seven test suites, and the hog): B 44.9-56.8 against 50, A's 19.8-25 against
# 25 and within 3.3 of 12.5 / 16.7 (a late wake-up costs a small window more of itself than a large one).
# bench.users, no hog: 24.0-24.5 / 12.4-13.6 / 12.7-13.6 / 49.5-50.2 against 25 / 12.5 / 12.5 / 50.
# Each user's sum must be within TOLERANCE_PTS, each engine within ENGINE_TOLERANCE_PTS, and the split nearer
# to the one in force than to the other. The windows themselves are checked exactly (window_pct).
TOLERANCE_PTS = 8.0
ENGINE_TOLERANCE_PTS = 8.0

pytestmark = pytest.mark.slow


def _need_users() -> None:
    why = why_not_other_user()
    if why:
        pytest.skip(why)
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv not found")
    try:
        if grp.getgrnam(GROUP).gr_gid != OTHER_GID:
            pytest.skip(f"group {GROUP} is not gid {OTHER_GID}")
    except KeyError:
        pytest.skip(f"no group {GROUP}")
    if not users.reader_can_verify():
        pytest.skip("not in the initial user and pid namespaces: no user is verifiable here")


ENGINE_NICE = "-10"  # the engines run above the hog (as a supervisor's pace loop does: _raise_priority): on 2
#                     shared cores at load 10 a nice-0 engine woke 10-20 ms late into its 40 ms window


def _synth(procs: Procs, key: str, weight: float, name: str, other: bool = False) -> subprocess.Popen:
    nice = ["nice", "-n", ENGINE_NICE]  # root lowers it, then setpriv drops to uid 65534 (the nice value stays)
    argv = cli_argv("synth", "--weight", str(weight), "--name", name, "--gpu-key", key)
    argv += ["--share-group", GROUP, "--step-ms", STEP_MS, "-q"]
    if other:  # its own directories: ours (the run's, 0700) are not its to use
        env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME")}
        return procs.start([*nice, *AS_OTHER, *argv], env={**env, "HOME": "/tmp"}, cwd="/")
    return procs.start([*nice, *argv])  # our directories, as the CLI's `weight` below uses


def _snap(key: str) -> GpuSnapshot | None:
    reader = SegmentReader(key)
    try:
        gpus = reader.read_all(wall_us()).gpus
        return gpus[0] if gpus else None
    finally:
        reader.close()


def _busy(key: str) -> dict[int, int]:
    with Segment.attach_readonly(shm_file(key)) as seg:
        return {r.pid: r.busy_total_us for r in seg.read_slots() if r.pid}


def _accounted_pct(key: str, pids: list[int], seconds: float, rounds: int = ROUNDS) -> list[float]:
    """Each engine's accounted busy time (busy_total_us deltas) in % of theirs together: the median per
    engine of `rounds` spans of `seconds` (a loaded host's one bad second does not decide)."""
    spans = []
    for _ in range(rounds):
        before = _busy(key)
        time.sleep(seconds)
        after = _busy(key)
        delta = [after[p] - before[p] for p in pids]
        spans.append([100.0 * d / sum(delta) for d in delta])
    return [statistics.median(s[i] for s in spans) for i in range(len(pids))]


def _until(key: str, ok, what: str, timeout: float = 30.0) -> GpuSnapshot:
    got: list[GpuSnapshot] = []

    def check() -> bool:
        s = _snap(key)
        if s is not None and ok(s):
            got.append(s)
            return True
        return False

    wait_for(check, timeout, what=what)
    return got[-1]


def _hog(procs: Procs) -> subprocess.Popen:
    return procs.start([sys.executable, "-c", "while True: pass"])


def _close(actual: list[float], want: list[float], other: list[float]) -> bool:
    """Nearer to `want` than to `other` (summed over the engines), each user's sum (A: the first three, B: the
    last) within TOLERANCE_PTS of `want`'s, each engine within ENGINE_TOLERANCE_PTS."""
    err = sum(abs(a - w) for a, w in zip(actual, want, strict=True))
    err_other = sum(abs(a - w) for a, w in zip(actual, other, strict=True))
    per_user = abs(sum(actual[:3]) - sum(want[:3])) <= TOLERANCE_PTS and abs(actual[3] - want[3]) <= TOLERANCE_PTS
    per_engine = all(abs(a - w) <= ENGINE_TOLERANCE_PTS for a, w in zip(actual, want, strict=True))
    return err < err_other and per_user and per_engine


def _windows(key: str, pids: list[int]) -> list[float]:
    s = _snap(key)
    assert s is not None
    by_pid = {p.pid: p for p in s.peers}
    return [round(by_pid[p].window_pct or 0.0, 1) for p in pids]


def test_two_users_share_by_user_then_by_weight_and_a_v1_writer_forces_the_flat_split(
    procs: Procs, new_gpu_key
) -> None:
    _need_users()
    key = new_gpu_key("usr")
    _hog(procs)
    a = [_synth(procs, key, 1, "a1")]
    wait_for(lambda: os.path.exists(shm_file(key)) or a[0].poll() is not None, 30, what="A's first engine joined")
    a += [_synth(procs, key, 1, "a2"), _synth(procs, key, 1, "a3")]
    b = _synth(procs, key, 1, "b1", other=True)
    pids = [p.pid for p in a] + [b.pid]

    def applied_with_all(s: GpuSnapshot) -> bool:
        return s.users_applied and {p.pid for p in s.peers if p.share_pct > 0} == set(pids)

    snap = _until(key, applied_with_all, "Extension 2 over A's 3 engines and B's 1")
    for p in procs.started:
        assert p.poll() is None, p.stderr.read() if p.stderr else ""
    by_pid = {p.pid: p for p in snap.peers}
    assert [by_pid[p].uid for p in pids] == [0, 0, 0, OTHER_UID]
    assert [by_pid[p].user for p in pids] == ["root", "root", "root", "nobody"]
    assert [round(by_pid[p].user_share_pct or 0, 1) for p in pids] == [16.7, 16.7, 16.7, 50.0]
    assert {u.uid: u.engines for u in snap.users} == {0: 3, OTHER_UID: 1}

    assert _windows(key, pids) == [16.7, 16.7, 16.7, 50.0]
    got = _accounted_pct(key, pids, MEASURE_S)
    assert _close(got, [100 / 6] * 3 + [50.0], [25.0] * 4), got

    r = run_cli("weight", str(a[0].pid), "2")
    assert r.returncode == 0, r.stderr
    _until(key, lambda s: s.users_applied and {p.pid: p.weight for p in s.peers}.get(a[0].pid) == 2.0, "re-weighted")
    assert _windows(key, pids) == [25.0, 12.5, 12.5, 50.0]
    time.sleep(1.0)
    got = _accounted_pct(key, pids, MEASURE_S)
    assert _close(got, [25.0, 12.5, 12.5, 50.0], [40.0, 20.0, 20.0, 20.0]), got

    # a v1 writer (flags 0, active) joins: every peer falls back to §5, the per-engine split
    with Membership(key, 1.0, "v1-writer", share_group=GROUP) as v1:
        working = threading.Event()

        def keep_active() -> None:  # a v1 engine decoding: active within its 2 s activity window
            while not working.wait(0.3):
                v1.mark_active()

        v1.mark_active()
        keeper = threading.Thread(target=keep_active, daemon=True)
        keeper.start()
        try:
            snap = _until(key, lambda s: not s.users_applied and s.schedule_mode == "v1", "the v1 writer forces §5")
            assert snap.users_fallback == f"slot {v1.slot} is a v1 peer"
            time.sleep(1.0)
            got = _accounted_pct(key, pids, MEASURE_S)
            assert _snap(key).schedule_mode == "v1"  # type: ignore[union-attr]
        finally:
            working.set()
            keeper.join()
        # weights 2, 1, 1, 1 among the engines that run (the v1 writer's window goes unused)
        assert _close(got, [40.0, 20.0, 20.0, 20.0], [25.0, 12.5, 12.5, 50.0]), got
    _until(key, applied_with_all, "Extension 2 again once the v1 writer left")
    time.sleep(1.0)
    got = _accounted_pct(key, pids, MEASURE_S)
    assert _close(got, [25.0, 12.5, 12.5, 50.0], [40.0, 20.0, 20.0, 20.0]), got
    for p in procs.started:
        assert p.poll() is None


# -- hostile: the processes a slot names -------------------------------------------------------------------------


def _other(procs: Procs, code: str, groups: str | None = None) -> subprocess.Popen:
    """A process of uid 65534 running `code` (it prints "ready" once set up, then sleeps); `groups`: its
    supplementary groups (none by default)."""
    who = AS_OTHER if groups is None else [*AS_OTHER[:-1], "--groups", groups]
    p = procs.start([*who, "/usr/bin/python3", "-I", "-c", code], cwd="/")
    assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    return p


FORGED_NAME = (
    "import ctypes, time\n"
    "ctypes.CDLL(None).prctl(15, b'x\\nUid:\\t0\\t0\\t0\\t0\\nNSpid:\\t1', 0, 0, 0)  # PR_SET_NAME\n"
    "print('ready', flush=True); time.sleep(60)\n"
)
SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"


def test_a_process_cannot_name_itself_into_another_users_slot(procs: Procs) -> None:
    _need_users()
    p = _other(procs, FORGED_NAME)
    head = users.read_status_head(p.pid)
    assert head is not None and head.startswith(b"Name:\tx\\nUid:")  # the kernel escapes the name's newline
    assert users.real_uid_of(p.pid) == OTHER_UID


def test_a_status_longer_than_the_budget_is_unverifiable_and_read_no_further(procs: Procs) -> None:
    _need_users()
    groups = ",".join(str(g) for g in range(100_000, 103_000))  # ~21 KiB of Groups: before NSpid
    p = _other(procs, SLEEPER, groups)
    head = users.read_status_head(p.pid)
    assert head is not None and len(head) == PROC_STATUS_MAX_BYTES
    assert users.parse_status(head)[1] is None  # NSpid is past the budget
    assert users.real_uid_of(p.pid) is None


def test_a_pid_in_a_child_pid_namespace_is_unverifiable_and_forces_the_fallback(
    procs: Procs, gpu_key: str, request: pytest.FixtureRequest
) -> None:
    _need_users()
    if shutil.which("unshare") is None:
        pytest.skip("unshare not found")
    # a process group of its own, ended whole: procs ends `unshare` by pid, and its child (the sleeper, pid 1 of
    # the namespace) outlived the test by its 60 s (unshare's --kill-child is a parent-death signal, which the
    # kernel clears when setpriv changes the uid)
    p = procs.start(["unshare", "--pid", "--fork", *AS_OTHER, "/usr/bin/python3", "-I", "-c", SLEEPER], process_group=0)
    request.addfinalizer(lambda: os.killpg(p.pid, signal.SIGKILL))
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    child = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
    assert users.parse_status(users.read_status_head(child) or b"")[1] == 2  # NSpid: host pid, namespace pid
    assert users.real_uid_of(child) is None
    # a slot naming it (with USERS and DEMAND) beside one of ours: Extension 2 cannot apply
    from gpushare_tui.core.registry import abi
    from gpushare_tui.core.registry.abi import SlotRecord

    flags = abi.FLAG_EXT1 | abi.FLAG_DEMAND | abi.FLAG_USERS
    now = wall_us()
    slots = [
        SlotRecord(0, os.getpid(), 0, 1, 1.0, 1, now, 0, b"\0" * 48, flags=flags),
        SlotRecord(1, child, 0, 1, 1.0, 1, now, 0, b"\0" * 48, flags=flags),
    ]
    uids = users.UserReader().uids(slots, now)
    assert uids == {0: os.getuid(), 1: None}
    snap = build_gpu_snapshot(gpu_key, "/x", slots, now, uids=uids)
    assert not snap.users_applied and snap.users_fallback == "slot 1's user is unverifiable here"
