"""`gpushare-tui gc`: our own segments without a live slot go, nothing else does (core/registry/gc.py). Real files:
in a directory of the test's own (`--shm-dir`: a gc of /dev/shm would take other tests' segments), one of
them created by another user (uid 65534), and in /dev/shm only `--dry-run` beside a live engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.pacing.control import socket_path
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.gc import NEW_GRACE_S, judge, remove_if_garbage
from testkit.cli import cli_argv, run_cli
from testkit.shm import shm_file
from testkit.wait import wait_for

PREFIX = abi.SEGMENT_PREFIX


def segment_bytes(slots: list[abi.SlotRecord] = ()) -> bytes:
    body = bytearray(abi.pack_header().ljust(abi.HEADER_SIZE, b"\0").ljust(abi.SEGMENT_SIZE, b"\0"))
    for r in slots:
        off = abi.HEADER_SIZE + r.index * abi.SLOT_SIZE
        body[off : off + abi.SLOT_SIZE] = abi.pack_slot(r).ljust(abi.SLOT_SIZE, b"\0")
    return bytes(body)


def peer(index: int, pid: int, heartbeat_us: int, name: str = "p") -> abi.SlotRecord:
    return abi.SlotRecord(index, pid, 2, 7, 1.0, 1, heartbeat_us, 0, abi.encode_name(name))


def write_segment(path: str, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


class Heartbeat:
    """A live slot 0 in the segment at `path`: its heartbeat rewritten every 0.3 s by a thread."""

    def __init__(self, path: str, name: str = "live") -> None:
        self.path, self.name = path, name
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.pwrite(fd, abi.pack_slot(peer(0, os.getpid(), wall_us(), self.name)), abi.HEADER_SIZE)
        finally:
            os.close(fd)

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            self._write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def shm_dir():
    """A directory like /dev/shm (mode 1777: anyone creates, only the owner removes), for this test alone."""
    d = tempfile.mkdtemp(prefix="gst-shm-", dir="/tmp")  # not under tmp_path: its parents are 0700
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def ours(shm_dir: str) -> dict[str, str]:
    """name -> path of the segments the test makes (all of ours; old enough for gc once it has waited)."""
    return {n: os.path.join(shm_dir, PREFIX + n) for n in ("empty", "dead", "corrupt", "live", "stopped", "shared")}


def make_ours(shm_dir: str) -> tuple[dict[str, str], Heartbeat]:
    p = ours(shm_dir)
    now = wall_us()
    write_segment(p["empty"], segment_bytes())
    write_segment(p["dead"], segment_bytes([peer(2, dead_pid(), now - 60_000_000, "gone")]))
    write_segment(p["corrupt"], b"OCGPU not a registry")
    write_segment(p["live"], segment_bytes())
    # our own pid, heartbeat a minute old: a stopped engine's slot (it resumes), never taken from it
    write_segment(p["stopped"], segment_bytes([peer(1, os.getpid(), now - 60_000_000, "paused")]))
    write_segment(p["shared"], segment_bytes(), mode=0o660)
    os.symlink(p["empty"], os.path.join(shm_dir, PREFIX + "link"))  # to a removable one: never followed
    return p, Heartbeat(p["live"])


def expected_kept(shm_dir: str) -> list[str]:
    return [
        f"kept /{PREFIX}link: a symlink (not following it)",
        f"kept /{PREFIX}live: slot 0 live (pid {os.getpid()}, live)",
        f"kept /{PREFIX}shared: writable by others (mode 0660): left to its group",
        f"kept /{PREFIX}stopped: slot 1 held by a running process (pid {os.getpid()}, paused; heartbeat stale)",
    ]


@pytest.mark.slow
def test_gc_removes_only_our_dead_segments(shm_dir: str) -> None:
    paths, beat = make_ours(shm_dir)
    try:
        time.sleep(NEW_GRACE_S + 0.2)
        r = run_cli("gc", "--dry-run", "--shm-dir", shm_dir)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        lines = r.stdout.splitlines()
        would = [
            f"would remove /{PREFIX}corrupt: corrupt (wrong size 20 (expected 4096))",
            f"would remove /{PREFIX}dead: no live slot (1 dead slot)",
            f"would remove /{PREFIX}empty: no live slot (no slot used)",
        ]
        assert sorted(lines) == sorted(would + expected_kept(shm_dir)), r.stdout
        assert all(os.path.exists(p) for p in paths.values())  # a dry run removes nothing

        r = run_cli("gc", "--all", "--shm-dir", shm_dir)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        removed = sorted(ln for ln in r.stdout.splitlines() if ln.startswith("removed"))
        assert removed == sorted(ln.replace("would remove", "removed") for ln in would), r.stdout
        left = sorted(os.listdir(shm_dir))
        assert left == sorted(PREFIX + n for n in ("link", "live", "shared", "stopped")), left
        assert os.path.islink(os.path.join(shm_dir, PREFIX + "link"))  # the link itself stays (dangling now)
    finally:
        beat.stop()


@pytest.mark.slow
def test_gc_never_touches_another_users_segment(shm_dir: str, other_user) -> None:
    theirs = os.path.join(shm_dir, PREFIX + "theirs")
    other_user(
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600); "
        "os.write(fd, bytes.fromhex(sys.argv[2])); os.close(fd)",
        theirs,
        segment_bytes().hex(),
    )
    write_segment(os.path.join(shm_dir, PREFIX + "mine"), segment_bytes())
    time.sleep(NEW_GRACE_S + 0.2)
    r = run_cli("gc", "--all", "--shm-dir", shm_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"removed /{PREFIX}mine: no live slot (no slot used)",
        "1 segment of other users left alone",
    ]
    assert os.path.exists(theirs) and os.stat(theirs).st_uid == 65534  # root may unlink it; gc does not


def test_a_peer_that_joins_after_the_verdict_is_not_removed(shm_dir: str) -> None:
    path = os.path.join(shm_dir, PREFIX + "joining")
    write_segment(path, segment_bytes())
    verdict = judge(path, wall_us())
    assert verdict is not None and not verdict.removable  # too new yet: its creator may be about to join it
    assert verdict.why.startswith("created ") and verdict.why.endswith(
        "s ago (its creator may be about to join it): no live slot (no slot used)"
    )
    time.sleep(NEW_GRACE_S + 0.1)
    verdict = judge(path, wall_us())
    assert verdict is not None and verdict.removable, verdict
    beat = Heartbeat(path, "joiner")  # a peer joins between the verdict and the unlink
    try:
        after = remove_if_garbage(verdict, wall_us())
    finally:
        beat.stop()
    assert not after.removable and os.path.exists(path)
    assert after.why == f"slot 0 live (pid {os.getpid()}, joiner) (changed since it was judged)"


def test_a_segment_replaced_after_the_verdict_is_not_removed(shm_dir: str) -> None:
    path = os.path.join(shm_dir, PREFIX + "replaced")
    write_segment(path, segment_bytes())
    time.sleep(NEW_GRACE_S + 0.1)
    verdict = judge(path, wall_us())
    assert verdict is not None and verdict.removable
    os.unlink(path)
    write_segment(path, segment_bytes())  # a new file by the same name (a new creator)
    after = remove_if_garbage(verdict, wall_us())
    assert not after.removable and os.path.exists(path)
    assert after.why.startswith("created ") or after.why == "replaced since it was judged", after.why


@pytest.mark.slow
def test_gc_dry_run_in_dev_shm_keeps_a_live_engine(procs, gpu_key: str, runtime_dir: str) -> None:
    p = procs.start(cli_argv("synth", "--weight", "1", "--name", "gcme", "--gpu-key", gpu_key, "-q"))
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what="synth")
    r = run_cli("gc", "--dry-run")  # never without --dry-run here: other tests' segments are ours too
    assert r.returncode == 0, r.stderr
    name = os.path.basename(shm_file(gpu_key))
    assert f"kept /{name}: slot 0 live (pid {p.pid}, gcme)" in r.stdout.splitlines(), r.stdout


SIZES = {"short": abi.HEADER_SIZE + abi.SLOT_COUNT * abi.SLOT_SIZE - 1, "4k-1": 4095, "8k": 8192, "1g": 1 << 30}


@pytest.mark.slow
def test_gc_judges_size_by_the_spec_at_least_rule(shm_dir: str) -> None:
    """§1a: a file at least its layout's size (header_size + slot_count*slot_size, 2112 bytes) is a
    segment whatever its size (4 KiB − 1, 8 KiB, 1 GiB sparse), judged by its slots: a live holder
    keeps it. A shorter one is corrupt, removable, unless what slots its bytes hold has a live one."""
    beats = []
    paths = {}
    try:
        for tag, size in SIZES.items():
            for holder in ("live", "none"):
                path = paths[tag, holder] = os.path.join(shm_dir, f"{PREFIX}{tag}-{holder}")
                write_segment(path, segment_bytes())
                os.truncate(path, size)  # 1 GiB: sparse, one page written
                if holder == "live":
                    beats.append(Heartbeat(path))  # slot 0: this (running) process, heartbeat every 0.3 s
        time.sleep(NEW_GRACE_S + 0.2)
        r = run_cli("gc", "--dry-run", "--shm-dir", shm_dir)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        short = SIZES["short"]
        live = f"slot 0 live (pid {os.getpid()}, live)"
        expected = [
            f"kept /{PREFIX}short-live: corrupt (wrong size {short} (expected 4096)), but {live}",
            f"would remove /{PREFIX}short-none: corrupt (wrong size {short} (expected 4096))",
        ]
        for tag in ("4k-1", "8k", "1g"):
            expected += [
                f"kept /{PREFIX}{tag}-live: {live}",
                f"would remove /{PREFIX}{tag}-none: no live slot (no slot used)",
            ]
        assert sorted(r.stdout.splitlines()) == sorted(expected), r.stdout

        r = run_cli("gc", "--all", "--shm-dir", shm_dir)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert sorted(os.listdir(shm_dir)) == sorted(f"{PREFIX}{tag}-live" for tag in SIZES), r.stdout
        assert os.path.getsize(paths["1g", "live"]) == 1 << 30  # kept as it was
    finally:
        for b in beats:
            b.stop()


@pytest.mark.slow
def test_gc_collects_only_the_keys_named_or_matched(shm_dir: str) -> None:
    """A user sharing a uid with another job: `gc KEY...` and `gc --match PATTERN` take only what they name;
    a live one named is still kept, a key without a segment is said."""
    now = wall_us()
    names = ("mine-a", "mine-b", "job2-x", "job2-y", "mine-live")
    for n in names:
        write_segment(os.path.join(shm_dir, PREFIX + n), segment_bytes([peer(0, dead_pid(), now - 60_000_000)]))
    beat = Heartbeat(os.path.join(shm_dir, PREFIX + "mine-live"))
    try:
        time.sleep(NEW_GRACE_S + 0.2)
        r = run_cli("gc", "mine-a", "mine-live", "nokey", "--shm-dir", shm_dir)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert r.stdout.splitlines() == [
            f"removed /{PREFIX}mine-a: no live slot (1 dead slot)",
            f"kept /{PREFIX}mine-live: slot 0 live (pid {os.getpid()}, live)",
            f"no segment /{PREFIX}nokey",
        ]
        assert sorted(os.listdir(shm_dir)) == sorted(PREFIX + n for n in names if n != "mine-a")
        r = run_cli("gc", "--match", "job2-*", "--dry-run", "--shm-dir", shm_dir)
        assert r.returncode == 0 and len(os.listdir(shm_dir)) == 4, r
        assert [ln.split(":")[0] for ln in r.stdout.splitlines()] == [f"would remove /{PREFIX}job2-{c}" for c in "xy"]
        r = run_cli("gc", "--match", "job2-*", "--shm-dir", shm_dir)
        assert r.returncode == 0 and sorted(os.listdir(shm_dir)) == sorted(PREFIX + n for n in ("mine-b", "mine-live"))
        r = run_cli("gc", "--match", "nothing-*", "--shm-dir", shm_dir)
        assert r.stdout == "no segment's key matches 'nothing-*'\n" and len(os.listdir(shm_dir)) == 2, r
    finally:
        beat.stop()


@pytest.mark.slow
def test_gc_named_never_takes_another_users_segment(shm_dir: str, other_user) -> None:
    theirs = os.path.join(shm_dir, PREFIX + "job-theirs")
    other_user(
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600); "
        "os.write(fd, bytes.fromhex(sys.argv[2])); os.close(fd)",
        theirs,
        segment_bytes().hex(),
    )
    time.sleep(NEW_GRACE_S + 0.2)
    for argv in (["job-theirs"], ["--match", "job-*"]):
        r = run_cli("gc", *argv, "--shm-dir", shm_dir)
        assert (r.returncode, r.stdout) == (0, "1 segment of other users left alone\n"), (argv, r)
        assert os.path.exists(theirs)


@pytest.mark.slow
def test_gc_of_a_key_in_dev_shm_takes_that_segment_alone(procs, new_gpu_key, runtime_dir: str) -> None:
    """Real segments in /dev/shm: an engine that has exited left its key's segment (nobody unlinks on exit);
    `gc KEY` removes it and nothing else, and a key whose engine still runs is kept."""
    done, running, other = new_gpu_key("gcdone"), new_gpu_key("gclive"), new_gpu_key("gcother")
    for key in (done, other):  # two engines that ran and exited: their segments stay
        r = run_cli("synth", "--weight", "1", "--gpu-key", key, "--duration", "0.2", "--step-ms", "1", "-q")
        assert r.returncode == 0, r.stderr
    p = procs.start(cli_argv("synth", "--weight", "1", "--name", "keepme", "--gpu-key", running, "-q"))
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what="synth")
    time.sleep(NEW_GRACE_S + 0.2)
    r = run_cli("gc", done, running)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines() == [
        f"removed /{PREFIX}{done}: no live slot (no slot used)",  # it left its slot as it exited
        f"kept /{PREFIX}{running}: slot 0 live (pid {p.pid}, keepme)",
    ]
    assert not os.path.exists(shm_file(done))
    assert os.path.exists(shm_file(running)) and os.path.exists(shm_file(other))  # not named: not looked at


def test_gc_without_a_selection_removes_nothing_and_says_how(shm_dir: str) -> None:
    path = os.path.join(shm_dir, PREFIX + "dead")
    write_segment(path, segment_bytes())
    for argv, why in (
        ([], "name the segments to collect: gc KEY..., gc --match PATTERN"),
        (["a", "--all"], "give one of KEY..., --match PATTERN and --all"),
        (["--match", "a/b"], "invalid --match 'a/b'"),
        (["bad key"], "invalid gpu key 'bad key'"),
    ):
        r = run_cli("gc", *argv, "--shm-dir", shm_dir)
        assert (r.returncode, r.stdout) == (2, ""), (argv, r)
        assert r.stderr.startswith(f"gpushare-tui: {why}") and r.stderr.count("\n") == 1, (argv, r.stderr)
    assert os.path.exists(path)
