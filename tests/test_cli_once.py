"""`gpushare-tui --once [--json]`: the headless snapshot, end to end in subprocesses."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.dashboard.columns import COLUMNS, LATENCY_KEYS, legend
from testkit.cli import cli_argv
from testkit.shm import shm_file
from testkit.wait import wait_for

TOP_KEYS = [
    *("schema_version", "hostname", "timestamp", "gpus", "errors"),
    *("foreign_segments_not_shown", "foreign_segments_shown_max"),
]
GPU_TYPES = {
    "gpu_key": str,
    "segment": str,
    "period_ms": (int, type(None)),
    "self": type(None),
    "peers": list,
    "owner": str,
    "owner_uid": int,
    "mode": str,
    "writable_by_others": bool,
    "schedule_mode": str,  # Extension 1 (issue 20): "v1" | "ext1" | "priority"
    "v1_peer": (int, type(None)),
    "users_applied": bool,  # Extension 2 (issue 29)
    "users_fallback": (str, type(None)),
    "users": list,
}
PEER_TYPES = {
    "slot": int,
    "pid": int,
    "name": str,
    "weight": (float, type(None)),
    "share_pct": float,
    "window_us": (list, type(None)),
    "busy_pct": float,
    "active": bool,
    "alive": bool,
    "heartbeat_age_ms": (float, type(None)),
    "boot_us": int,
    "achieved_pct": (float, type(None)),
    "window_pct": (float, type(None)),
    "class": (str, type(None)),  # Extension 1 (issue 20); null for a v1 peer
    "demand": (bool, type(None)),
    "priority": (bool, type(None)),
    "uid": (int, type(None)),  # Extension 2 (issue 29): the real uid of its pid, null when not verifiable
    "user": (str, type(None)),
    "user_share_pct": (float, type(None)),
    "busy_total_s": (float, type(None)),  # accounting (issue 21)
    "busy_source": (str, type(None)),
    "energy_j": (float, type(None)),
    "managed": bool,
    "engine": (dict, type(None)),
}
ENGINE_KEYS = [
    "state", "tok_s", "solo_tok_s", "speed_pct", "model", "port", "kind", "activity", "log", "error", "latency", "slo"
]  # fmt: skip
BAD_PID = 4_000_123


def _members(key: str, n: int) -> bool:
    reader = SegmentReader(key)
    try:
        gpus, _ = reader.read(wall_us())
        return bool(gpus) and sum(p.alive and p.active for p in gpus[0].peers) == n
    finally:
        reader.close()


def _start_pair(procs, key: str) -> tuple:
    a = procs.start(cli_argv("synth", "--weight", "2", "--name", "peer-a", "--gpu-key", key, "--step-ms", "2", "-q"))
    wait_for(lambda: _members(key, 1), 15, what="peer-a active")  # a gets slot 0, b slot 1
    b = procs.start(cli_argv("synth", "--weight", "1", "--name", "peer-b", "--gpu-key", key, "--step-ms", "2", "-q"))
    wait_for(lambda: _members(key, 2), 15, what="both peers active")
    return a, b


def _check_types(obj: dict, types: dict) -> None:
    assert set(obj) == set(types), set(obj) ^ set(types)
    for k, t in types.items():
        assert isinstance(obj[k], t), (k, obj[k])
        if t is int or t is float:
            assert not isinstance(obj[k], bool), k


def _corrupt(shm_files, key: str) -> dict[str, tuple[bytes, str]]:
    """Corrupt segments beside the good one: name -> (bytes, expected error fragment)."""
    good = abi.pack_header() + bytes(4096 - 64)
    random = os.urandom(4096)
    cases = {
        f"{key}-badmagic": (b"BADMAGIC" + good[8:], "bad magic"),
        f"{key}-badversion": (abi.HEADER_STRUCT.pack(abi.MAGIC, 7, 16, 128, 64) + bytes(4032), "unsupported version 7"),
        f"{key}-wrongsize": (good[:1000], "wrong size 1000"),
        f"{key}-random": (random if random[:8] != abi.MAGIC else b"X" + random[1:], "bad magic"),
    }
    for k, (data, _) in cases.items():
        with open(shm_files(abi.SEGMENT_PREFIX + k), "xb") as f:
            f.write(data)
    return cases


@pytest.mark.slow
def test_once_json_golden_shape(procs, gpu_key: str, shm_files, cli, runtime_dir: str) -> None:
    a, b = _start_pair(procs, gpu_key)
    corrupt = _corrupt(shm_files, gpu_key)
    # a third owner, written directly: idle, with a name that is not valid UTF-8
    with Segment.create_or_attach(gpu_key) as seg:
        assert seg.cas_pid(2, 0, BAD_PID)
        seg.write_slot_fields(2, boot_us=7, weight=0.5, active=0, heartbeat_us=wall_us(), busy_ppm=0,
                              name_raw=b"bad\xff\xfename".ljust(48, b"\0"))  # fmt: skip
        t0 = time.time()
        r = cli("--once", "--json")  # no filter: every segment on the host
        t1 = time.time()
        snapshot_of_corrupt = {k: open(shm_file(k), "rb").read() for k in corrupt}

    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    doc = json.loads(r.stdout)
    assert list(doc) == TOP_KEYS
    assert doc["schema_version"] == 1
    assert doc["hostname"] == socket.gethostname()
    assert isinstance(doc["timestamp"], float) and t0 - 1 <= doc["timestamp"] <= t1 + 1
    assert isinstance(doc["gpus"], list) and isinstance(doc["errors"], list)

    # one error per corrupt segment, naming it; the segments are left as they were
    ours = {e["segment"]: e["error"] for e in doc["errors"] if e["segment"].startswith(f"/opencoti-gpu-{gpu_key}-")}
    assert set(ours) == {f"/opencoti-gpu-{k}" for k in corrupt}
    for k, (data, why) in corrupt.items():
        assert why in ours[f"/opencoti-gpu-{k}"]
        assert snapshot_of_corrupt[k] == data
    for e in doc["errors"]:
        assert set(e) == {"segment", "error"} and isinstance(e["error"], str) and e["error"]
    assert not any(g["gpu_key"].startswith(f"{gpu_key}-") for g in doc["gpus"])

    # the good segment still shows, field by field
    (g,) = [g for g in doc["gpus"] if g["gpu_key"] == gpu_key]
    _check_types(g, GPU_TYPES)
    assert g["segment"] == f"/opencoti-gpu-{gpu_key}"
    assert g["period_ms"] == 120
    peers = g["peers"]
    assert [p["slot"] for p in peers] == [0, 1, 2]
    for p in peers:
        _check_types(p, PEER_TYPES)
    pa, pb, pc = peers
    assert (pa["pid"], pa["name"], pa["weight"]) == (a.pid, "peer-a", 2.0)
    assert (pb["pid"], pb["name"], pb["weight"]) == (b.pid, "peer-b", 1.0)
    assert pa["share_pct"] == pytest.approx(200 / 3) and pb["share_pct"] == pytest.approx(100 / 3)
    assert pa["window_pct"] == pytest.approx(200 / 3) and pb["window_pct"] == pytest.approx(100 / 3)  # no floor at 2:1
    assert pa["window_us"] == [0, 80_000] and pb["window_us"] == [80_000, 120_000]
    for p in (pa, pb):
        assert p["active"] is True and p["alive"] is True
        assert 0 <= p["heartbeat_age_ms"] < 3000
        assert 0.0 <= p["busy_pct"] <= 100.0
        assert abs(p["boot_us"] - t0 * 1e6) < 120e6
        assert p["managed"] is True  # synth engines answer on their control sockets
        assert p["busy_source"] == "counter" and p["busy_total_s"] > 0  # since it joined (the slot's counter)
        assert p["energy_j"] is None  # no energy source here, and one --once sees no interval
        e = p["engine"]  # what the engine's control socket said
        assert list(e) == ENGINE_KEYS
        assert (e["state"], e["kind"], e["model"], e["port"], e["log"], e["error"]) == (
            "running", "synth", "synthetic", None, None, None
        )  # fmt: skip
        assert (e["latency"], e["slo"]) == (None, None)  # a synthetic engine has no front proxy, no target
        assert e["tok_s"] is None or e["tok_s"] >= 0.0
        assert e["solo_tok_s"] is None or e["solo_tok_s"] > 0.0
        if e["tok_s"] is not None and e["solo_tok_s"] is not None:
            assert e["speed_pct"] == pytest.approx(100 * e["tok_s"] / e["solo_tok_s"])
        else:
            assert e["speed_pct"] is None
    assert pc == {
        "slot": 2,
        "pid": BAD_PID,
        "name": "bad\ufffd\ufffdname",
        "weight": 0.5,
        "share_pct": 0.0,
        "window_us": None,
        "busy_pct": 0.0,
        "active": False,
        "alive": True,
        "heartbeat_age_ms": pc["heartbeat_age_ms"],
        "boot_us": 7,
        "achieved_pct": None,
        "window_pct": None,  # idle: no window
        "class": None,  # written as a v1 peer: no Extension 1 fields
        "demand": None,
        "priority": None,
        "uid": None,  # its pid names no process: no user (Extension 2, §8.1)
        "user": None,
        "user_share_pct": None,
        "busy_total_s": 0.0,  # written as a v1 peer (idle): a counter at 0 until it shows busy_ppm > 0
        "busy_source": "counter",
        "energy_j": None,
        "managed": False,
        "engine": None,
    }  # fmt: skip  (a foreign peer: no engine object)


def _busy(key: str) -> bool:
    reader = SegmentReader(key)
    try:
        gpus, _ = reader.read(wall_us())
        return bool(gpus) and all(p.busy_pct > 0 for p in gpus[0].peers)
    finally:
        reader.close()


@pytest.mark.slow
def test_once_json_filtered_by_key(procs, gpu_key: str, cli) -> None:
    a, b = _start_pair(procs, gpu_key)
    wait_for(lambda: _busy(gpu_key), 15, what="both peers report busy time")
    r = cli("--once", "--json", "--gpu-key", gpu_key)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [g["gpu_key"] for g in doc["gpus"]] == [gpu_key]
    assert doc["errors"] == []
    assert {p["pid"] for p in doc["gpus"][0]["peers"]} == {a.pid, b.pid}
    pa, pb = doc["gpus"][0]["peers"]
    busy = pa["busy_pct"] + pb["busy_pct"]  # the achieved share is busy time among the members
    assert pa["achieved_pct"] == pytest.approx(100 * pa["busy_pct"] / busy)
    assert pb["achieved_pct"] == pytest.approx(100 * pb["busy_pct"] / busy)

    # the human table shows the same peers
    r = cli("--once", "--gpu-key", gpu_key)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"/opencoti-gpu-{gpu_key}") and "period 120 ms" in lines[0] and "peers 2" in lines[0]
    shown = [c for c in COLUMNS if c.key not in LATENCY_KEYS]  # no engine reports latency: as the dashboard
    assert lines[1].split() == [c.label for c in shown]  # the dashboard's columns, every one
    assert "\n".join(lines[4:]) == legend({c.key for c in shown}) and "BSY%    busy fraction it reports" in r.stdout
    rows = {int(line.split()[1]): line.split() for line in lines[2:4]}
    assert set(rows) == {a.pid, b.pid}
    col = {c.key: i for i, c in enumerate(shown)}
    assert rows[a.pid][col["name"]] == "peer-a" and rows[a.pid][col["share"]] == "66.7"
    assert rows[b.pid][col["name"]] == "peer-b" and rows[b.pid][col["share"]] == "33.3"
    assert all(0 <= float(row[col["ach"]]) <= 100 for row in rows.values())  # ACH%: both busy, both members
    assert all(row[col["engine"]] == "running" and row[col["gpu"]] == gpu_key for row in rows.values())


@pytest.mark.slow
def test_once_without_segments(cli, gpu_key: str) -> None:
    """A --gpu-key that matches nothing is a runtime error (a typo must not look like success)."""
    for extra in (["--json"], []):
        r = cli("--once", *extra, "--gpu-key", gpu_key)  # nothing with this key exists
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == f"gpushare-tui: no segment /opencoti-gpu-{gpu_key} on this host\n"
    assert not os.path.exists(shm_file(gpu_key))  # observing creates nothing


def test_once_table_lists_errors(shm_files, gpu_key: str, cli) -> None:
    name = f"{gpu_key}-broken"
    with open(shm_files(abi.SEGMENT_PREFIX + name), "xb") as f:
        f.write(b"nope")
    r = cli("--once", "--gpu-key", name)
    assert r.returncode == 1  # only an error row: nothing asked for could be read (ONCE_EXIT_RULE)
    assert r.stdout.strip() == f"error: /opencoti-gpu-{name}: wrong size 4 (expected 4096)"


@pytest.mark.parametrize("key", ["../x", "a/b", "", "x" * 65, "sp ace"])
def test_bad_gpu_key_is_a_usage_error(cli, key: str) -> None:
    r = cli("--once", "--json", "--gpu-key", key)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpushare-tui: invalid gpu key")


@pytest.mark.slow
def test_json_without_once_is_a_usage_error(cli) -> None:
    r = cli("--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "--json needs --once" in line


@pytest.mark.slow
def test_segment_file_name_not_utf8_is_tolerated(shm_files, gpu_key: str, cli) -> None:
    # anyone can drop such a file into /dev/shm: neither output may crash on it
    raw = os.fsencode(f"{abi.SEGMENT_PREFIX}{gpu_key}-") + b"\xff\xfe"
    with open(shm_files(os.fsdecode(raw)), "xb") as f:
        f.write(b"junk")
    Segment.create_or_attach(gpu_key).close()  # one segment that reads: exit 0 (only error rows exit 1)
    shown = f"/opencoti-gpu-{gpu_key}-\ufffd\ufffd"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # strict, as under en_US.UTF-8
    r = cli("--once", "--json", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    errs = {e["segment"]: e["error"] for e in json.loads(r.stdout)["errors"]}
    assert errs[shown] == "wrong size 4 (expected 4096)"
    r = cli("--once", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"error: {shown}: wrong size 4 (expected 4096)" in r.stdout.splitlines()


@pytest.mark.slow
def test_table_hides_segments_without_live_peers(gpu_key: str, cli) -> None:
    """Left-over segments (no live peer) are hidden from the table unless --all or --gpu-key names them;
    the JSON lists them all; nothing is unlinked."""
    Segment.create_or_attach(gpu_key).close()  # no peer at all
    ours = f"/opencoti-gpu-{gpu_key}  "
    r = cli("--once")
    assert r.returncode == 0, r.stderr
    assert not any(line.startswith(ours) for line in r.stdout.splitlines())
    assert "with no live peers hidden (--all shows them)" in r.stdout.splitlines()[-1]
    r = cli("--once", "--all")
    assert r.returncode == 0 and any(line.startswith(ours) for line in r.stdout.splitlines()), r.stderr
    r = cli("--once", "--gpu-key", gpu_key)
    assert r.returncode == 0 and r.stdout.startswith(ours), r.stderr
    r = cli("--once", "--json")
    assert gpu_key in [g["gpu_key"] for g in json.loads(r.stdout)["gpus"]]
    assert os.path.exists(shm_file(gpu_key))


@pytest.mark.slow
def test_once_exit_codes_follow_one_rule(shm_files, new_gpu_key, cli) -> None:
    """ONCE_EXIT_RULE, in real processes: 0 when a segment was read (error rows beside it or not), 1 when
    nothing asked for could be (only error rows; no segment for the key), 2 for a usage error."""
    from gpushare_tui.cli.once import ONCE_EXIT_RULE

    good, missing = new_gpu_key("good"), new_gpu_key("missing")
    broken = f"{good}-broken"
    with open(shm_files(abi.SEGMENT_PREFIX + broken), "xb") as f:
        f.write(b"nope")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    unreachable = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
    try:
        with Segment.create_or_attach(good):
            cases = [
                (0, ["--gpu-key", good]),
                (0, ["--gpu-key", good, "--remote", unreachable]),  # one read, one error row
                (1, ["--gpu-key", broken]),  # only an error row
                (1, ["--no-local", "--remote", unreachable]),
                (1, ["--gpu-key", missing]),
                (2, ["--gpu-key", "../x"]),
            ]
            for code, args in cases:
                for fmt in ([], ["--json"]):
                    r = cli("--once", *fmt, *args, timeout=60)
                    assert r.returncode == code, (args, fmt, r.stdout, r.stderr)
                    if code == 1 and args[-1] != missing:  # the document is printed all the same
                        assert ("errors" in json.loads(r.stdout)) if fmt else r.stdout.startswith("error: ")
    finally:
        closed.close()
    r = cli("--help")
    assert " ".join(ONCE_EXIT_RULE.split()[:6]) in " ".join(r.stdout.split())
