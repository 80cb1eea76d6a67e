"""Segment trust (spec §1a), played for real: the attacker's steps run as uid 65534 ("nobody").

Our side runs as root: in this process, or in a subprocess wherever the code
before §1a could die of SIGBUS or block forever (so such a failure is a failed
test, never a dead or hung test run).
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment, SegmentError
from testkit.cli import cli_argv
from testkit.other_user import OTHER_GID, OTHER_UID, SYSTEM_PYTHON
from testkit.procs import Procs
from testkit.shm import shm_file
from testkit.wait import read_json_file, wait_for

# Stdlib helpers for the attacker's scripts (its interpreter has no access to this package).
LIB = r"""
import os, struct, sys, time
HEADER = struct.pack("<8sIIII40x", b"OCGPU\0\0\0", 1, 16, 128, 64)
FIELDS = struct.Struct("<qfIqI48s")  # boot_us .. name: offsets 8..84 of a slot

def slot(pid, boot_us, weight, active, hb, busy, name, seq=2):
    return struct.pack("<II", pid, seq) + FIELDS.pack(boot_us, weight, active, hb, busy, name.encode()) + bytes(44)

def segment(peers):
    body = bytearray(HEADER + bytes(4096 - 64))
    for i, rec in peers:
        body[64 + i * 128 : 64 + (i + 1) * 128] = slot(*rec)
    return bytes(body)

def now_us():
    return time.time_ns() // 1000

def create(path, data, mode):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)  # past our umask
    os.write(fd, data)
    os.close(fd)
"""

BAIT_PID = 4_000_321


def _attacker_segment(other_user, path: str, mode: int = 0o644, pid: int = BAIT_PID, name: str = "bait") -> None:
    """The attacker creates a valid segment with one peer in slot 3."""
    other_user(
        LIB + "create(sys.argv[1], segment([(3, (int(sys.argv[3]), 7, 1.0, 1, now_us(), 0, sys.argv[4]))]), "
        "int(sys.argv[2], 8))",
        path,
        f"{mode:o}",
        str(pid),
        name,
    )


def _start_as_other_user(procs: Procs, code: str, *args: str) -> subprocess.Popen:
    """A long-running attacker process (uid 65534), killed at teardown like every other."""
    return procs.start(
        [SYSTEM_PYTHON, "-I", "-c", code, *args], user=OTHER_UID, group=OTHER_GID, extra_groups=[], cwd="/"
    )


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _communicate(p: subprocess.Popen, timeout: float, what: str) -> tuple[str, str]:
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        Procs.kill(p)
        pytest.fail(f"{what} still running after {timeout} s (hung?)")


def _once_json(procs, *args: str, timeout: float = 30) -> dict:
    p = procs.start(cli_argv("--once", "--json", *args))
    out, err = _communicate(p, timeout, "gpushare-tui --once --json")
    assert "Traceback" not in err, err
    doc = json.loads(out)
    assert p.returncode == (0 if doc["gpus"] else 1), f"rc {p.returncode}: {err}"  # 1: only error rows
    return doc


def _errors(doc: dict) -> dict[str, str]:
    return {e["segment"]: e["error"] for e in doc["errors"]}


# -- a segment shrunk under its readers ------------------------------------------

VICTIM = r"""
import json, sys
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.registry.segment import Segment, SegmentError
from gpushare_tui.core.observe.snapshot import SegmentReader

key, path = sys.argv[1], sys.argv[2]
reader = SegmentReader(key)
ro = Segment.attach_readonly(path)
for line in sys.stdin:  # one read per line: the test truncates/restores in between
    gpus, errors = reader.read(wall_us())
    try:
        ro_pids = [r.pid for r in ro.read_slots() if r.pid]
    except SegmentError as e:
        ro_pids = "error: " + str(e)
    out = {"pids": [[p.pid for p in g.peers] for g in gpus], "errors": [e.error for e in errors], "ro": ro_pids}
    print(json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_truncated_under_readers_is_an_error_row_never_sigbus(other_user, procs, gpu_key: str) -> None:
    path = shm_file(gpu_key)
    _attacker_segment(other_user, path)
    good = _bytes(path)
    victim = procs.start([sys.executable, "-c", VICTIM, gpu_key, path], stdin=subprocess.PIPE)

    def step() -> dict:
        victim.stdin.write("read\n")
        victim.stdin.flush()
        line = victim.stdout.readline()
        if not line:
            victim.wait(timeout=10)
            pytest.fail(f"the root reader died (rc {victim.returncode}; -7 is SIGBUS): {victim.stderr.read()}")
        return json.loads(line)

    restore = "import sys; open(sys.argv[1], 'r+b').write(bytes.fromhex(sys.argv[2]))"
    assert step() == {"pids": [[BAIT_PID]], "errors": [], "ro": [BAIT_PID]}  # both have it open now
    for size in (0, 100):
        other_user("import os, sys; os.truncate(sys.argv[1], int(sys.argv[2]))", path, str(size))
        seen = step()
        assert seen["pids"] == [] and len(seen["errors"]) == 1, seen
        assert f"wrong size {size}" in seen["errors"][0], seen  # the reader opens it afresh each refresh
        assert seen["ro"].startswith("error: ") and "shrunk" in seen["ro"], seen
        doc = _once_json(procs, "--gpu-key", gpu_key)  # a fresh reader: an error row, exit 0
        assert doc["gpus"] == [] and f"wrong size {size}" in _errors(doc)[f"/opencoti-gpu-{gpu_key}"]
        # the attacker restores it (same file): the readers show it again
        other_user(restore, path, good.hex())
        assert step() == {"pids": [[BAIT_PID]], "errors": [], "ro": [BAIT_PID]}
        doc = _once_json(procs, "--gpu-key", gpu_key)
        assert [[p["pid"] for p in g["peers"]] for g in doc["gpus"]] == [[BAIT_PID]] and doc["errors"] == []
    victim.stdin.close()
    assert victim.wait(timeout=10) == 0, victim.stderr.read()

    # --once while the attacker flips the size under it: always exit 0 and JSON, a gpu or an error row
    flipper = _start_as_other_user(
        procs,
        "import os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR); data = bytes.fromhex(sys.argv[2]); end = time.monotonic() + 30\n"
        "while time.monotonic() < end:\n"
        "    os.ftruncate(fd, 100); os.ftruncate(fd, 4096); os.pwrite(fd, data, 0)\n",
        path,
        good.hex(),
    )
    for _ in range(4):
        doc = _once_json(procs, "--gpu-key", gpu_key)
        # the gpu, or an error row for the segment; a read that caught a slot mid-rewrite shows the gpu and says
        # that slot was torn (a row of its own, the segment named)
        assert len(doc["gpus"]) <= 1 and (doc["gpus"] or doc["errors"]), doc
        assert {e["segment"] for e in doc["errors"]} <= {f"/opencoti-gpu-{gpu_key}"}, doc
        if doc["gpus"]:
            assert all("torn" in e["error"] for e in doc["errors"]), doc
    assert flipper.poll() is None, flipper.stderr.read()
    Procs.kill(flipper)


# -- a FIFO where a segment should be ----------------------------------------------


@pytest.mark.slow
def test_fifo_segment_never_hangs_once(other_user, procs, gpu_key: str, shm_files, runtime_dir: str) -> None:
    fifo_key = f"{gpu_key}-fifo"
    fifo = shm_files(abi.SEGMENT_PREFIX + fifo_key)
    other_user("import os, sys; os.mkfifo(sys.argv[1], 0o666)", fifo)
    with Segment.create_or_attach(gpu_key) as seg:  # a good segment beside it
        assert seg.cas_pid(0, 0, BAIT_PID)
        seg.write_slot_fields(0, boot_us=1, weight=1.0, active=0, heartbeat_us=wall_us(), busy_ppm=0,
                              name_raw=abi.encode_name("good"))  # fmt: skip
    doc = _once_json(procs, timeout=20)  # every segment on the host
    assert "FIFO" in _errors(doc)[f"/opencoti-gpu-{fifo_key}"]
    (g,) = [g for g in doc["gpus"] if g["gpu_key"] == gpu_key]
    assert [p["pid"] for p in g["peers"]] == [BAIT_PID]
    # a joiner refuses it too, at once
    p = procs.start(cli_argv("synth", "--weight", "1", "--gpu-key", fifo_key, "--duration", "1", "-q"))
    _, err = _communicate(p, 20, "synth on a FIFO")
    assert p.returncode == 1
    assert "FIFO" in _one_line(err) and f"/opencoti-gpu-{fifo_key}" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# -- joiners refuse segments others may write --------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", [0o666, 0o644])
def test_joiner_refuses_the_attackers_segment(other_user, procs, gpu_key: str, runtime_dir: str, mode: int) -> None:
    path = shm_file(gpu_key)
    # a fake member that would take the whole GPU: huge weight, heartbeat far in the future, active
    hog = "segment([(0, (4242, 1, 1e30, 1, now_us() + 10**15, 0, 'hog'))])"
    other_user(LIB + f"create(sys.argv[1], {hog}, int(sys.argv[2], 8))", path, f"{mode:o}")
    before = _bytes(path)
    p = procs.start(cli_argv("synth", "--weight", "1", "--gpu-key", gpu_key, "--duration", "2", "-q"))
    _, err = _communicate(p, 30, "synth")
    assert p.returncode == 1, err
    line = _one_line(err)
    assert f"/opencoti-gpu-{gpu_key}" in line
    assert "owned by nobody (uid 65534)" in line and f"mode {mode:04o}" in line and "refusing to join" in line
    assert _bytes(path) == before
    with pytest.raises(SegmentError, match="owned by nobody"):  # and in-process, through Membership
        Membership(gpu_key, 1.0, "me", heartbeat_s=3600).join()
    assert _bytes(path) == before


@pytest.mark.slow
def test_joiner_never_follows_a_symlink(other_user, procs, gpu_key: str, tmp_path, runtime_dir: str) -> None:
    # root's file looks like a free registry (so code that followed the link would join and write into it)
    secret = bytearray(abi.pack_header() + bytes(4096 - 64))
    for i in range(abi.SLOT_COUNT):
        off = abi.HEADER_SIZE + i * abi.SLOT_SIZE + abi.OFF_RESERVED
        secret[off : off + 44] = b"ROOT-ONLY-SECRET-".ljust(44, b"#")
    target = tmp_path / "root-secret"
    target.write_bytes(bytes(secret))
    os.chmod(target, 0o600)
    link = shm_file(gpu_key)
    other_user("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), link)
    p = procs.start(cli_argv("synth", "--weight", "1", "--gpu-key", gpu_key, "--duration", "2", "-q"))
    _, err = _communicate(p, 30, "synth")
    assert p.returncode == 1, err
    line = _one_line(err)
    assert f"/opencoti-gpu-{gpu_key}" in line and "symlink" in line
    assert target.read_bytes() == bytes(secret)
    assert os.path.islink(link)
    with pytest.raises(SegmentError, match="symlink"):
        Segment.attach_readonly(link)
    assert target.read_bytes() == bytes(secret)


@pytest.mark.slow
def test_reader_never_follows_a_symlink_nor_leaks_the_target_size(other_user, procs, gpu_key: str, tmp_path) -> None:
    target = tmp_path / "root-private"
    target.write_bytes(b"\x5a" * 12345)
    os.chmod(target, 0o600)
    other_user("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), shm_file(gpu_key))
    p = procs.start(cli_argv("--once", "--json", "--gpu-key", gpu_key))
    out, err = _communicate(p, 30, "--once --json")
    assert p.returncode == 1, err  # only an error row
    assert "12345" not in out and "12345" not in err
    doc = json.loads(out)
    assert doc["gpus"] == [] and "symlink" in _errors(doc)[f"/opencoti-gpu-{gpu_key}"]
    p = procs.start(cli_argv("--once", "--gpu-key", gpu_key))
    out, _ = _communicate(p, 30, "--once")
    assert p.returncode == 1 and "12345" not in out and "symlink" in out


# -- the sharing group opt-in ------------------------------------------------------

GROUP = "nogroup"  # gid 65534: uid 65534's group


def _need_group() -> None:
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        pytest.skip(f"no group {GROUP} here")
    if gid != OTHER_GID:
        pytest.skip(f"group {GROUP} is gid {gid}, not {OTHER_GID}")


def _joined(key: str) -> bool:
    reader = SegmentReader(key)
    try:
        gpus, _ = reader.read(wall_us())
        return bool(gpus) and any(p.alive for p in gpus[0].peers)
    finally:
        reader.close()


def _root_segment_of_group(key: str, mode: int) -> str:
    path = shm_file(key)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchown(fd, -1, OTHER_GID)
        os.fchmod(fd, mode)
        os.write(fd, abi.pack_header() + bytes(4096 - 64))
    finally:
        os.close(fd)
    return path


def test_share_group_joins_the_groups_segment_never_a_world_writable_one(other_user, new_gpu_key) -> None:
    _need_group()
    # root's 0660 segment of the group: joined with the opt-in, refused without it
    key = new_gpu_key("grp")
    _root_segment_of_group(key, 0o660)
    with pytest.raises(SegmentError, match=r"owned by root \(uid 0\), mode 0660: refusing"):
        Segment.create_or_attach(key)
    with Segment.create_or_attach(key, share_group=GROUP) as seg:
        assert seg.writable and seg.cas_pid(0, 0, BAIT_PID)
    # another member of the group created it: joined (owner may be any), its 0666 twin is not
    key = new_gpu_key("grp")
    _attacker_segment(other_user, shm_file(key), mode=0o660)
    with Membership(key, 1.0, "grouped", heartbeat_s=3600, share_group=GROUP) as m:
        assert m.slot == 0
    key = new_gpu_key("grp")
    _attacker_segment(other_user, shm_file(key), mode=0o666)
    before = _bytes(shm_file(key))
    with pytest.raises(SegmentError, match="mode 0666: refusing to join") as ei:
        Segment.create_or_attach(key, share_group=GROUP)
    assert "owned by nobody (uid 65534)" in str(ei.value)
    assert _bytes(shm_file(key)) == before
    # a segment of another group is not ours to join either
    key = new_gpu_key("grp")
    _root_segment_of_group(key, 0o660)
    with pytest.raises(SegmentError, match="refusing to join"):
        Segment.create_or_attach(key, share_group=0)


@pytest.mark.slow
def test_share_group_creates_0660_for_the_group(procs, new_gpu_key, runtime_dir: str, monkeypatch) -> None:
    _need_group()
    monkeypatch.delenv("GPUSHARE_GROUP", raising=False)
    # in-process
    key = new_gpu_key("grp")
    with Membership(key, 1.0, "me", heartbeat_s=3600, share_group=GROUP):
        st = os.lstat(shm_file(key))
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == OTHER_GID and st.st_uid == os.geteuid()
    # synth --share-group, and synth with GPUSHARE_GROUP in its environment
    for how in ("option", "env"):
        key = new_gpu_key("grp")
        argv = cli_argv("synth", "--weight", "1", "--gpu-key", key, "--duration", "30", "-q")
        if how == "option":
            p = procs.start([*argv, "--share-group", GROUP])
        else:
            p = procs.start(argv, env={**os.environ, "GPUSHARE_GROUP": GROUP})
        wait_for(lambda k=key, p=p: _joined(k) or p.poll() is not None, 30, what=f"synth joined ({how})")
        assert p.poll() is None, p.stderr.read()
        st = os.lstat(shm_file(key))
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == OTHER_GID, how
        Procs.kill(p)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["synth", "run", "launch"])
def test_unknown_share_group_is_a_usage_error(cli, gpu_key: str, cmd: str) -> None:
    group = f"no-such-group-{os.getpid()}"
    args = [cmd, "--weight", "1", "--gpu-key", gpu_key, "--share-group", group]
    r = cli(*args, *(["--", "llama-server"] if cmd != "synth" else []))
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert group in line and "group" in line
    assert not os.path.exists(shm_file(gpu_key))


@pytest.mark.slow
def test_launch_passes_the_share_group_on_to_run(monkeypatch, tmp_path) -> None:
    from gpushare_tui.cli import main
    from gpushare_tui.core.engines import launcher

    spawned: list[list[str]] = []

    class FakePopen:
        returncode = 1
        pid = 4_000_321

        def __init__(self, argv: list[str], **kw: object) -> None:
            spawned.append(argv)

        def poll(self) -> int:
            return 1

        def wait(self, timeout: float | None = None) -> int:
            return 1

    monkeypatch.setattr(launcher.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUSHARE_GROUP", raising=False)
    (model := tmp_path / "x.gguf").write_bytes(b"GGUF")  # launch checks the declaration before it spawns
    args = ["launch", "--weight", "1", "--gpu-key", "k", "--", "true", "-m", str(model)]
    main([*args[:5], "--share-group", GROUP, *args[5:]])
    monkeypatch.setenv("GPUSHARE_GROUP", GROUP)
    main(args)
    monkeypatch.setenv("GPUSHARE_GROUP", "")
    main(args)
    assert len(spawned) == 3
    for argv in spawned[:2]:
        i = argv.index("run")
        assert argv[argv.index("--share-group", i) + 1] == GROUP and argv.index("--share-group") < argv.index("--")
    assert "--share-group" not in spawned[2]


# -- a segment replaced under a long-lived reader -----------------------------------


def test_reader_follows_a_replaced_segment(other_user, gpu_key: str) -> None:
    path = shm_file(gpu_key)
    _attacker_segment(other_user, path, pid=BAIT_PID, name="old")
    reader = SegmentReader(gpu_key)
    try:
        (g,) = reader.read(wall_us())[0]
        assert [(p.pid, p.name) for p in g.peers] == [(BAIT_PID, "old")]
        other_user("import os, sys; os.unlink(sys.argv[1])", path)
        _attacker_segment(other_user, path, pid=BAIT_PID + 1, name="new")
        gpus, errors = reader.read(wall_us())
        assert errors == []
        (g,) = gpus
        assert [(p.pid, p.name) for p in g.peers] == [(BAIT_PID + 1, "new")]
    finally:
        reader.close()


# -- a storm: truncate / recreate / rewrite while a reader loops ---------------------

STORM = r"""
import json, mmap, os, random, struct, sys, time
path, duration = sys.argv[1], float(sys.argv[2])
HEADER = struct.pack("<8sIIII40x", b"OCGPU\0\0\0", 1, 16, 128, 64)
FIELDS = struct.Struct("<qfIqI48s")
SLOTS = (0, 5, 10, 15)
seq = [0] * 16  # per slot, monotonic across truncations and recreations: an old seq never comes back
n = 0
ops = {"rewrite": 0, "truncate": 0, "recreate": 0}

def fields(n):
    return FIELDS.pack(n, float(n % 1000 + 1), n & 1, 7 * n, n % 1_000_001, f"s{n}".encode())

def begin(mm, i):  # seq odd ("being written"), above every value it ever had
    seq[i] += 1 if seq[i] % 2 == 0 else 2
    mm[64 + i * 128 + 4 : 64 + i * 128 + 8] = struct.pack("<I", seq[i])

def finish(mm, i):
    seq[i] += 1
    mm[64 + i * 128 + 4 : 64 + i * 128 + 8] = struct.pack("<I", seq[i])

def write(mm, i, n):  # the seqlock protocol: odd, fields, even
    off = 64 + i * 128
    begin(mm, i)
    mm[off + 8 : off + 84] = fields(n)
    mm[off : off + 4] = struct.pack("<I", 1000 + n % 100_000)
    finish(mm, i)

def clear(mm, i):
    off = 64 + i * 128
    begin(mm, i)
    mm[off : off + 4] = bytes(4)
    mm[off + 8 : off + 84] = bytes(76)
    finish(mm, i)

def fill(mm):
    global n
    mm[8:64] = HEADER[8:]
    mm[0:8] = HEADER[:8]
    for i in range(16):
        if i in SLOTS:
            n += 1
            write(mm, i, n)
        else:
            clear(mm, i)

def create():
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, 4096)
    mm = mmap.mmap(fd, 4096)
    fill(mm)
    return fd, mm

fd, mm = create()
print("ready", flush=True)
t_end = time.monotonic() + duration
while time.monotonic() < t_end:
    r = random.random()
    if r < 0.8:
        ops["rewrite"] += 1
        for i in SLOTS:
            n += 1
            write(mm, i, n)
    elif r < 0.9:
        ops["truncate"] += 1
        for i in range(16):  # every slot "being written" and free: a slot cut in two is never taken as whole
            begin(mm, i)
            mm[64 + i * 128 : 64 + i * 128 + 4] = bytes(4)
        os.ftruncate(fd, 0 if random.random() < 0.5 else random.randrange(1, 4096))  # 0: the page is gone
        time.sleep(random.random() * 0.0005)
        os.ftruncate(fd, 4096)
        fill(mm)
    else:
        ops["recreate"] += 1
        mm.close()
        os.close(fd)
        os.unlink(path)
        fd, mm = create()
print(json.dumps(ops), flush=True)
"""

STORM_READER = r"""
import json, sys, time
from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader

key, duration = sys.argv[1], float(sys.argv[2])
reader = SegmentReader(key)
reads = errors = shown = peers = 0
torn, why = [], {}
max_n = max_n_early = 0  # the attacker's counter: a reader stuck on a replaced file stops seeing it advance
start = time.monotonic()
end = start + duration
while time.monotonic() < end:
    early = time.monotonic() < start + 0.75 * duration
    now = wall_us()
    gpus, errs = reader.read(now)
    reads += 1
    for e in errs:
        errors += 1
        k = "".join(c for c in e.error if not c.isdigit()).split("(")[0].strip()
        why[k] = why.get(k, 0) + 1
    for g in gpus:
        shown += 1
        for p in g.peers:
            peers += 1
            n = p.boot_us
            max_n = max(max_n, n)
            if early:
                max_n_early = max(max_n_early, n)
            ok = (p.pid == 1000 + n % 100_000 and p.weight == float(n % 1000 + 1) and p.active == bool(n & 1)
                  and p.busy_pct == (n % 1_000_001) / 10_000 and p.name == f"s{n}"
                  and p.heartbeat_age_ms == max(0, now - 7 * n) / 1000)
            if not ok and len(torn) < 10:
                torn.append(repr(p))
reader.close()
out = {"reads": reads, "errors": errors, "shown": shown, "peers": peers, "torn": torn, "why": why}
print(json.dumps({**out, "max_n_early": max_n_early, "max_n": max_n}))
"""


@pytest.mark.slow
def test_storm_of_truncations_and_recreations(procs, gpu_key: str, other_user) -> None:
    path = shm_file(gpu_key)
    storm_s = 10.0
    attacker = _start_as_other_user(procs, STORM, path, str(storm_s))
    assert attacker.stdout.readline().strip() == "ready", attacker.stderr.read()
    reader = procs.start([sys.executable, "-c", STORM_READER, gpu_key, str(storm_s)])
    out, err = _communicate(reader, storm_s + 60, "the storm's reader")
    assert reader.returncode == 0, f"the reader died (rc {reader.returncode}; -7 is SIGBUS): {err}"
    stats = json.loads(out)
    a_out, a_err = _communicate(attacker, 60, "the storm")
    assert attacker.returncode == 0, a_err
    ops = json.loads(a_out.splitlines()[-1])
    print(f"storm: attacker {ops}; reader {stats}")
    assert ops["truncate"] > 10 and ops["recreate"] > 10, ops
    assert stats["torn"] == [], stats
    assert stats["reads"] > 200, stats
    assert stats["errors"] > 0 and stats["shown"] > 0 and stats["peers"] > 0, stats
    assert stats["max_n"] > stats["max_n_early"], f"the reader stopped following the segment: {stats}"


# -- owner and mode on the dashboard and in --once ----------------------------------


@pytest.mark.slow
def test_once_and_dashboard_show_owner_and_flag_writable_segments(other_user, procs, new_gpu_key) -> None:
    from gpushare_tui.dashboard.model import GpuView
    from gpushare_tui.widgets.gpu_panel import GpuPanel, subtitle

    theirs, ours = new_gpu_key("own"), new_gpu_key("own")
    _attacker_segment(other_user, shm_file(theirs), mode=0o666)
    with Segment.create_or_attach(ours):
        pass
    doc = _once_json(procs)
    g = {g["gpu_key"]: g for g in doc["gpus"]}
    assert (g[theirs]["owner"], g[theirs]["owner_uid"], g[theirs]["mode"]) == ("nobody", OTHER_UID, "0666")
    assert g[theirs]["writable_by_others"] is True
    assert (g[ours]["owner"], g[ours]["owner_uid"], g[ours]["mode"]) == ("root", 0, "0600")
    assert g[ours]["writable_by_others"] is False

    p = procs.start(cli_argv("--once", "--all"))  # ours has no live peer: hidden without --all
    out, err = _communicate(p, 30, "--once")
    assert p.returncode == 0, err
    head = {line.split()[0]: line for line in out.splitlines() if line.startswith("/opencoti-gpu-")}
    assert "owner nobody  mode 0666" in head[f"/opencoti-gpu-{theirs}"]
    assert head[f"/opencoti-gpu-{theirs}"].endswith("WARNING: group/world-writable")
    assert "owner root  mode 0600" in head[f"/opencoti-gpu-{ours}"] and "WARNING" not in head[f"/opencoti-gpu-{ours}"]

    reader = SegmentReader()
    try:
        snaps = {s.gpu_key: s for s in reader.read(wall_us())[0]}
    finally:
        reader.close()
    t = subtitle(snaps[theirs]).plain
    assert f"/opencoti-gpu-{theirs}" in t and "owner nobody" in t and "⚠ world-writable" in t
    t = subtitle(snaps[ours]).plain
    assert "owner root" in t and "⚠" not in t
    assert "owner nobody" in GpuPanel(GpuView(snaps[theirs])).border_subtitle  # what the panel shows
    # group-writable is flagged as such
    assert "⚠ group-writable" in subtitle(dataclasses.replace(snaps[ours], mode=0o660)).plain


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_joiner_refuses_our_own_segment_when_others_may_write_it(gpu_key: str, mode: int) -> None:
    path = shm_file(gpu_key)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, mode)
        os.write(fd, abi.pack_header() + bytes(4096 - 64))
    finally:
        os.close(fd)
    before = _bytes(path)
    why = rf"\(uid {os.geteuid()}\), mode {mode:04o}: refusing to join \(must be ours"
    with pytest.raises(SegmentError, match=why):
        Segment.create_or_attach(gpu_key)
    assert _bytes(path) == before
    with Segment.attach_readonly(path) as ro:  # a reader may still watch it
        assert len(ro.read_slots()) == abi.SLOT_COUNT


# -- a group segment shrunk by its owner after we joined (issue 17) ---------------------


def _steps(status: str) -> int:
    return (read_json_file(status) or {}).get("steps_total", 0)


@pytest.mark.slow
@pytest.mark.parametrize("size", [0, 64])
def test_a_joined_engine_carries_on_when_a_group_member_truncates(
    other_user, procs, gpu_key: str, runtime_dir: str, size: int, tmp_path
) -> None:
    """Never a SIGBUS, never the end of our engine (it was exit 1 before issue 27): it re-extends the
    segment, re-claims its slot, says so in one line and keeps pacing."""
    _need_group()
    path = shm_file(gpu_key)
    _attacker_segment(other_user, path, mode=0o660)
    status = str(tmp_path / "synth.json")
    p = procs.start(
        cli_argv(
            "synth",
            "--weight",
            "1",
            "--gpu-key",
            gpu_key,
            "--share-group",
            GROUP,
            "--duration",
            "60",
            "-q",
            "--status-file",
            status,
        )
    )
    sock = os.path.join(runtime_dir, "gpushare-tui", f"{p.pid}.sock")
    wait_for(lambda: os.path.exists(sock) or p.poll() is not None, 30, what="synth joined")
    assert p.poll() is None, p.stderr.read()
    other_user("import os, sys; os.truncate(sys.argv[1], int(sys.argv[2]))", path, str(size))
    wait_for(lambda: os.path.getsize(path) == abi.SEGMENT_SIZE, 10, what="the segment re-extended")
    before = _steps(status)
    wait_for(lambda: _steps(status) > before + 20, 20, what="synth stepping after the truncation")
    assert p.poll() is None, f"rc {p.returncode} (-7 is SIGBUS): {p.stderr.read()}"
    with Segment.attach_readonly(path) as ro:  # a valid segment again, our slot live in it
        assert any(r.pid == p.pid and r.is_alive(wall_us()) for r in ro.read_slots())
    assert os.path.exists(sock)
    p.terminate()
    _, err = _communicate(p, 20, "synth after SIGTERM")
    lines = [line for line in err.strip().splitlines() if "joined /" not in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "re-extended it and re-claimed slot" in lines[0] and abi.segment_name(gpu_key) in lines[0], lines[0]


@pytest.mark.slow
def test_a_group_member_truncating_again_and_again_leaves_our_engine_unpaced(
    other_user, procs, gpu_key: str, runtime_dir: str, tmp_path
) -> None:
    """More than SEGMENT_REPAIRS_PER_MIN_MAX truncations in a minute: our engine stops repairing, says so
    in one line and runs on unpaced (still never ended by a group member)."""
    from gpushare_tui.core.host.budgets import SEGMENT_REPAIRS_PER_MIN_MAX

    _need_group()
    path = shm_file(gpu_key)
    _attacker_segment(other_user, path, mode=0o660)
    status = str(tmp_path / "synth.json")
    p = procs.start(
        cli_argv(
            "synth",
            "--weight",
            "1",
            "--gpu-key",
            gpu_key,
            "--share-group",
            GROUP,
            "--duration",
            "60",
            "-q",
            "--status-file",
            status,
        )
    )
    wait_for(lambda: _steps(status) > 0 or p.poll() is not None, 30, what="synth stepping")
    for _ in range(SEGMENT_REPAIRS_PER_MIN_MAX):
        other_user("import os, sys; os.truncate(sys.argv[1], 0)", path)
        wait_for(lambda: os.path.getsize(path) == abi.SEGMENT_SIZE or p.poll() is not None, 10, what="re-extended")
        time.sleep(0.2)
    other_user("import os, sys; os.truncate(sys.argv[1], 0)", path)
    time.sleep(1.5)
    assert os.path.getsize(path) == 0  # no more repairs
    before = _steps(status)
    wait_for(lambda: _steps(status) > before + 20, 20, what="synth stepping, unpaced")
    assert p.poll() is None, p.stderr.read()
    p.terminate()
    _, err = _communicate(p, 20, "synth after SIGTERM")
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if "joined /" not in line]
    assert sum("re-extended it" in line for line in lines) == SEGMENT_REPAIRS_PER_MIN_MAX, err
    assert sum("running unpaced" in line for line in lines) == 1, err


# -- a spoofed "managed" row (issue 17) ---------------------------------------------

SPOOFER = (
    LIB
    + r"""
path, pid = sys.argv[1], int(sys.argv[2])
create(path, segment([(3, (pid, 7, 1.0, 1, now_us(), 0, "spoof"))]), 0o644)
fd = os.open(path, os.O_RDWR)
print("ready", flush=True)
while True:  # keep the spoofed slot alive
    time.sleep(0.3)
    os.pwrite(fd, segment([(3, (pid, 7, 1.0, 1, now_us(), 0, "spoof"))]), 0)
"""
)


@pytest.mark.slow
def test_a_slot_naming_our_engine_in_a_foreign_segment_is_not_managed(
    other_user, procs, new_gpu_key, runtime_dir: str
) -> None:
    """The row is read-only: no engine status shown, and w / + / - / s never reach the real engine."""
    import asyncio

    from gpushare_tui.app import DashboardApp
    from gpushare_tui.dashboard.source import LiveSource
    from gpushare_tui.widgets.confirm_stop import ConfirmStop
    from gpushare_tui.widgets.peers_table import PeersTable
    from gpushare_tui.widgets.weight_modal import WeightModal

    ours, theirs = new_gpu_key("own"), new_gpu_key("spoof")
    synth = procs.start(cli_argv("synth", "--weight", "2", "--gpu-key", ours, "--duration", "60", "-q"))
    wait_for(lambda: _joined(ours) or synth.poll() is not None, 30, what="synth joined")
    assert synth.poll() is None
    spoofer = _start_as_other_user(procs, SPOOFER, shm_file(theirs), str(synth.pid))
    assert spoofer.stdout is not None and spoofer.stdout.readline().strip() == "ready"

    def row_of(key: str):
        src = LiveSource(gpu_key=key, stats=lambda _: None)
        try:
            views = src.collect().gpus
            return next(r for v in views for r in v.rows if r.peer.pid == synth.pid)
        finally:
            src.close()

    real = wait_for(lambda: (r := row_of(ours)).engine is not None and r, 10, what="the real row with its status")
    assert real.managed
    spoofed = row_of(theirs)
    assert spoofed.peer.alive and not spoofed.managed and spoofed.engine is None
    doc = _once_json(procs, "--gpu-key", theirs)
    (peer,) = [p for g in doc["gpus"] for p in g["peers"] if p["pid"] == synth.pid]
    assert peer["managed"] is False and peer.get("engine") is None

    async def main() -> None:
        app = DashboardApp(gpu_key=theirs, interval_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            table = app.query_one(PeersTable)
            deadline = time.monotonic() + 10
            while table.selected_row is None and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert table.selected_row is not None and table.selected_row.peer.pid == synth.pid
            assert not table.selected_row.managed
            for key in ("w", "plus", "minus", "s"):
                await pilot.press(key)
                await pilot.pause(0.2)
                assert not isinstance(app.screen, (WeightModal, ConfirmStop)), key

    asyncio.run(main())
    time.sleep(0.5)
    assert synth.poll() is None
    with Segment.attach_readonly(shm_file(ours)) as seg:
        assert [r.weight for r in seg.read_slots() if r.pid == synth.pid] == [2.0]
