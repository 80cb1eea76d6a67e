"""GpuShare, the public pacer for Python engines: registry life, activity, pacing, busy,
control socket, threads, bad input; and the Pacer's schedule cache it relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.host.errors import GpushareError
from gpushare_tui.core.pacing.control import request
from gpushare_tui.core.pacing.pacer import Pacer
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.core.schedule import v1 as schedule
from testkit.paths import REPO
from testkit.shm import shm_file
from testkit.wait import wait_for


def slot_of(key: str, slot: int) -> abi.SlotRecord:
    ro = Segment.attach_readonly(shm_file(key))
    try:
        return ro.read_slot(slot)
    finally:
        ro.close()


@pytest.fixture
def peer(gpu_key: str) -> Iterator[Membership]:
    """An always-active peer of weight 1 (its own heartbeat thread keeps it alive), with work in flight
    (Extension 1's DEMAND, spec §7)."""
    m = Membership(gpu_key, 1, "peer")
    m.join()
    m.set_demand(True)
    stop = threading.Event()

    def keep_active() -> None:
        while not stop.wait(0.2):
            m.mark_active()

    m.mark_active()
    t = threading.Thread(target=keep_active, daemon=True)
    t.start()
    yield m
    stop.set()
    t.join()
    m.leave()


def test_public_import_is_lazy_and_cheap() -> None:
    code = (
        "import sys, json, gpushare_tui; before = sorted(sys.modules);"
        "from gpushare_tui import GpuShare; print(json.dumps([before, GpuShare.__module__]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    before, module = json.loads(r.stdout)
    assert module == "gpushare_tui.core.pacing.share"
    heavy = ("gpushare_tui.core", "psutil", "typer", "textual", "click")
    assert [m for m in before if m.split(".")[0] in heavy or m.startswith("gpushare_tui.core")] == []


def test_joins_and_leaves_the_registry(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    share = GpuShare(weight=2, name="trainer", gpu_key=gpu_key)
    assert share.pace() == 0  # not open yet: a no-op
    with share:
        rec = slot_of(gpu_key, share.slot)
        assert rec.pid == os.getpid() and rec.weight == 2.0 and rec.name == "trainer"
        assert rec.is_alive(wall_us()) and not rec.active
        assert os.path.exists(share.control_path)
        slot, path = share.slot, share.control_path
    assert slot_of(gpu_key, slot).pid == 0
    assert not os.path.exists(path)
    assert share.pace() == 0 and share.steps == 0  # closed: a no-op, no error


def test_open_is_idempotent_one_slot(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    with GpuShare(gpu_key=gpu_key).open() as share:
        assert share.open() is share
        assert [r.index for r in _slots(gpu_key) if r.pid == os.getpid()] == [share.slot]


@pytest.mark.slow
def test_pace_marks_active_then_idle_two_seconds_after_the_last(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    with GpuShare(gpu_key=gpu_key, control=False) as share:
        assert share.pace() == 0  # alone: never sleeps
        assert slot_of(gpu_key, share.slot).active == 1
        t_last = time.monotonic()
        wait_for(lambda: slot_of(gpu_key, share.slot).active == 0, 6, what="active to drop")
        assert time.monotonic() - t_last >= abi.ACTIVITY_WINDOW_US / 1e6 - 0.1


def _run_loop(share, seconds: float, work_s: float = 0.002) -> tuple[float, list[int]]:
    """Busy-wait `work_s` per step, pace; returns (elapsed, phases (µs in period) right after each pace)."""
    phases = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass
        share.pace()
        phases.append(wall_us())
    return time.monotonic() - t0, phases


@pytest.mark.slow
def test_pace_sleeps_outside_its_window_and_publishes_busy(gpu_key: str, peer: Membership, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    with GpuShare(weight=1, name="paced", gpu_key=gpu_key, control=False) as share:
        elapsed, returns = _run_loop(share, 2.5)
        slots = Segment.attach_readonly(shm_file(gpu_key))
        try:
            sched = schedule.build_schedule(schedule.member_weights(slots.read_slots(), wall_us()))
        finally:
            slots.close()
        assert sched is not None and share.slot in sched.slots
        in_window = sum(schedule.may_run(sched, share.slot, t) for t in returns) / len(returns)
        assert in_window > 0.8  # it returns inside its window (a loaded box delays some wake-ups)
        # equal weights: about half the time asleep (wide margins: a loaded 2-core box)
        assert 0.25 < share.slept_us / 1e6 / elapsed < 0.75
        busy = slot_of(gpu_key, share.slot).busy_ppm / 1e4
        assert 20 < busy < 80, busy


@pytest.mark.slow
def test_busy_is_near_full_alone(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    with GpuShare(gpu_key=gpu_key, control=False) as share:
        _run_loop(share, 1.5)
        assert share.slept_us == 0
        assert slot_of(gpu_key, share.slot).busy_ppm > 900_000


def test_control_socket_status_reweight_and_stop(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    stopped = []
    with GpuShare(weight=1, name="ctl", gpu_key=gpu_key, model="m.pt", on_stop=lambda: stopped.append(1)) as share:
        for _ in range(3):
            share.pace()
        st = request(os.getpid(), "status")
        assert (st["kind"], st["name"], st["model"], st["slot"], st["gpu_key"]) == (
            "python",
            "ctl",
            "m.pt",
            share.slot,
            gpu_key,
        )
        assert st["engine_pid"] == os.getpid() and st["weight"] == 1.0 and st["state"] == "running"
        assert request(os.getpid(), "set_weight", weight=3)["weight"] == 3.0
        assert slot_of(gpu_key, share.slot).weight == 3.0 and share.weight == 3.0
        with pytest.raises(GpushareError, match="invalid weight"):
            request(os.getpid(), "set_weight", weight=0)
        assert not share.stop_requested.is_set()
        assert request(os.getpid(), "stop")["state"] == "exiting"
        assert share.stop_requested.is_set() and stopped == [1]


def test_constructor_is_the_documented_one_and_stop_is_a_method(gpu_key: str) -> None:
    """No internal seam of `up` in the public constructor (the owner's hooks are applied by
    control.control_handlers); `stop()` does what the control socket's `stop` does."""
    import inspect

    from gpushare_tui import GpuShare

    params = list(inspect.signature(GpuShare).parameters)
    assert params == ["weight", "name", "gpu", "gpu_key", "share_group", "control", "kind", "model", "on_stop", "klass"]
    stopped = []
    with GpuShare(gpu_key=gpu_key, control=False, on_stop=lambda: stopped.append(1)) as share:
        assert share.stop() == "exiting"
        assert share.stop_requested.is_set() and stopped == [1] and share.status().state == "exiting"


@pytest.mark.slow
def test_pace_is_thread_safe(gpu_key: str, peer: Membership, runtime_dir: str) -> None:
    from gpushare_tui import GpuShare

    errors: list[BaseException] = []
    counts = [0] * 4
    with GpuShare(gpu_key=gpu_key, control=False) as share:

        def loop(i: int) -> None:
            try:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 1.0:
                    share.pace()
                    counts[i] += 1
                    share.set_weight(1 + i % 2)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert share.steps == sum(counts) > 0
        assert share.slept_us > 0  # the peer is active: some calls slept


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"weight": 0}, "invalid weight"),
        ({"weight": float("nan")}, "invalid weight"),
        ({"gpu_key": "../x"}, "key"),
        ({"klass": "fast"}, "invalid klass 'fast': must be one of interactive, batch"),
    ],
)
def test_bad_input_is_one_clear_error(kw: dict, msg: str, gpu_key: str) -> None:
    from gpushare_tui import GpuShare

    kw = {"gpu_key": gpu_key, **kw}
    with pytest.raises(GpushareError, match=msg):
        GpuShare(**kw)


def test_unusable_runtime_dir_fails_before_joining(gpu_key: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from gpushare_tui import GpuShare

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(blocker))
    share = GpuShare(gpu_key=gpu_key)
    with pytest.raises(GpushareError, match="runtime directory"):
        share.open()
    assert share.slot is None
    assert not os.path.exists(shm_file(gpu_key)) or all(r.pid == 0 for r in _slots(gpu_key))


def _slots(key: str) -> tuple[abi.SlotRecord, ...]:
    ro = Segment.attach_readonly(shm_file(key))
    try:
        return ro.read_slots()
    finally:
        ro.close()


def test_pacer_schedule_cache_sees_changes_only_after_reread_us(gpu_key: str) -> None:
    """reread_us > 0: a peer that turns active is obeyed once the cache expires, not before."""
    t = [wall_us() // 120_000 * 120_000 + 100_000]  # weights 2:1 -> the peer's window is [80000, 120000)
    m = Membership(gpu_key, 2.0, "me", clock_us=lambda: t[0], mono_us=lambda: t[0], heartbeat_s=3600)
    m.join()
    other = Segment.create_or_attach(gpu_key)
    sleeps: list[float] = []
    try:
        pacer = Pacer(m, clock_us=lambda: t[0], mono_us=lambda: t[0], sleep_s=sleeps.append, reread_us=10_000)
        assert pacer.step_done() == 0  # alone: no schedule, now cached
        other.cas_pid(1, 0, 3_999_501)
        other.write_slot_fields(
            1, boot_us=1, weight=1.0, active=1, heartbeat_us=t[0], busy_ppm=0, name_raw=abi.encode_name("o")
        )
        t[0] += 5_000  # in the peer's window, cache still fresh
        assert pacer.step_done() == 0 and sleeps == []
        t[0] += 5_000  # cache expired (10 ms): now the peer's window is obeyed
        pacer.step_done()
        assert len(sleeps) == 1 and sleeps[0] == pytest.approx(0.01)
    finally:
        m.leave()
        other.close()


def test_a_share_never_closed_leaves_nothing_at_exit(gpu_key: str, runtime_dir: str) -> None:
    code = (
        "import os, sys; from gpushare_tui import GpuShare;"
        "s = GpuShare(gpu_key=sys.argv[1]).open(); s.pace(); print(s.control_path, s.slot, flush=True)"
    )
    r = subprocess.run([sys.executable, "-c", code, gpu_key], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    path, slot = r.stdout.split()
    assert not os.path.exists(path)
    assert slot_of(gpu_key, int(slot)).pid == 0


# -- several GpuShare in one process: a control socket each --------------------------------


def test_two_shares_in_one_process_each_have_a_socket(new_gpu_key, runtime_dir: str) -> None:
    """Each is reachable (by the gpu key and slot its rows show), each closes alone; a pid with two
    engines asked without a target says which there are."""
    from gpushare_tui import GpuShare
    from gpushare_tui.core.pacing.control import Target, socket_paths

    key_a, key_b = new_gpu_key("a"), new_gpu_key("b")
    pid = os.getpid()
    a = GpuShare(weight=1, name="a", gpu_key=key_a).open()
    b = None
    try:
        b = GpuShare(weight=2, name="b", gpu_key=key_b).open()
        assert a.control_path != b.control_path
        assert sorted(socket_paths(pid)) == sorted([a.control_path, b.control_path])
        assert a.control_path.endswith(f"/{pid}.sock") and b.control_path.endswith(f"/{pid}.1.sock")
        both = rf"\(slot 0 of {key_a}, slot 0 of {key_b}\)"
        with pytest.raises(GpushareError, match=rf"^engine {pid} serves 2 engines {both}: name one with --slot"):
            request(pid, "status")
        with pytest.raises(GpushareError, match="name the --gpu-key too"):
            request(pid, "status", target=Target(slot=0))
        for share, key in ((a, key_a), (b, key_b)):
            st = request(pid, "status", target=Target(slot=share.slot, gpu_key=key))
            assert (st["name"], st["gpu_key"], st["slot"]) == (share.name, key, share.slot)
        assert request(pid, "set_weight", target=Target(0, key_b), weight=5)["weight"] == 5.0
        assert (a.weight, b.weight) == (1.0, 5.0)
        a.close()  # the other stays reachable; its pid has one socket again, so no target is needed
        assert socket_paths(pid) == [b.control_path] and os.path.exists(b.control_path)
        assert request(pid, "status")["name"] == "b"
        c = GpuShare(name="c", gpu_key=key_a).open()  # takes the freed name
        try:
            assert c.control_path == os.path.join(runtime_dir, "gpushare-tui", f"{pid}.sock")
            assert request(pid, "status", target=Target(c.slot, key_a))["name"] == "c"
        finally:
            c.close()
        assert request(pid, "status")["name"] == "b"
    finally:
        a.close()
        if b is not None:
            b.close()
    assert socket_paths(pid) == []


def test_shares_opened_at_once_in_threads_all_serve(new_gpu_key, runtime_dir: str) -> None:
    """Racing opens: no "Address already in use", no socket stolen; every one answers, and closes alone."""
    from gpushare_tui import GpuShare
    from gpushare_tui.core.pacing.control import Target, socket_paths

    keys = [new_gpu_key(f"r{i}") for i in range(6)]
    shares = [GpuShare(name=f"r{i}", gpu_key=k) for i, k in enumerate(keys)]
    errors: list[BaseException] = []
    go = threading.Barrier(len(shares))

    def open_one(share) -> None:
        go.wait()
        try:
            share.open()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_one, args=(s,)) for s in shares]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert len(set(socket_paths(os.getpid()))) == len(shares)
        for s, k in zip(shares, keys):
            assert request(os.getpid(), "status", target=Target(s.slot, k))["name"] == s.name
        for s in shares[::2]:
            s.close()
        for s, k in zip(shares[1::2], keys[1::2]):
            assert request(os.getpid(), "status", target=Target(s.slot, k))["name"] == s.name
    finally:
        for s in shares:
            s.close()
    assert socket_paths(os.getpid()) == []


def test_the_dashboard_shows_each_share_of_one_process(gpu_key: str, runtime_dir: str) -> None:
    """Two shares of one process on one key: two managed rows, each with its own engine's status."""
    from gpushare_tui import GpuShare
    from gpushare_tui.dashboard.source import LiveSource

    with (
        GpuShare(name="one", gpu_key=gpu_key, model="one.pt") as a,
        GpuShare(name="two", gpu_key=gpu_key, model="two.pt") as b,
    ):
        src = LiveSource(gpu_key=gpu_key)
        try:
            rows = {r.peer.slot: r for r in src.collect().rows()}
        finally:
            src.close()
        assert set(rows) == {a.slot, b.slot}
        for share in (a, b):
            row = rows[share.slot]
            assert row.managed and row.engine is not None and row.engine.error is None, row.engine
            assert row.engine.model == share.model


def test_class_is_published_in_the_slot_and_set_over_the_socket(gpu_key: str, runtime_dir: str) -> None:
    """GpuShare(klass="interactive") sets INTERACTIVE in its slot once joined (spec §7); the control
    socket's `set_class` changes it at once and `status` says `class`; a bad class changes nothing."""
    from gpushare_tui import GpuShare

    assert GpuShare(gpu_key=gpu_key, control=False).klass == "batch"  # the default
    with GpuShare(name="chat", gpu_key=gpu_key, klass="interactive") as share:
        assert slot_of(gpu_key, share.slot).flags & abi.FLAG_INTERACTIVE
        assert request(os.getpid(), "status")["class"] == "interactive"
        assert request(os.getpid(), "set_class", **{"class": "batch"}) == {"ok": True, "class": "batch"}
        assert not slot_of(gpu_key, share.slot).flags & abi.FLAG_INTERACTIVE  # written at once
        assert request(os.getpid(), "status")["class"] == "batch" and share.klass == "batch"
        for bad in ("fast", None, 1):
            with pytest.raises(GpushareError, match="invalid class"):
                request(os.getpid(), "set_class", **{"class": bad})
        assert share.set_class("interactive") == "interactive"
        assert slot_of(gpu_key, share.slot).flags & abi.FLAG_INTERACTIVE
