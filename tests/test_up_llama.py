"""`gpushare-tui up` owning real llama-servers (CPU, the tiny random GGUF): both join with the
file's weights; SIGHUP re-weights in place and stops a removed engine; kill -9 of an engine brings
a new pid within the backoff; SIGTERM stops everything (exit 0, no engine left, none stopped,
slots left within 4 s); SIGKILL of `up` leaves no engine stopped."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from llama_env import proc_state
from up_env import UpProc, alive_slots, used_slots, write

from gpushare_tui.core.pacing import control
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS
from testkit.wait import wait_for

pytestmark = pytest.mark.llama

ENGINE = """
[[engine]]
name = "{name}"
weight = {weight}
command = {command}
"""


def config(key: str, server: str, model: str, weights: dict[str, float]) -> str:
    command = json.dumps([server, "-m", model, "-t", "1", "-c", "4096", "-np", "1"])
    return f'gpu_key = "{key}"\n' + "".join(
        ENGINE.format(name=n, weight=w, command=command) for n, w in weights.items()
    )


@pytest.fixture
def llama_up(procs, gpu_key, runtime_dir, tmp_path, monkeypatch, llama_server, tiny_model):  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made: list[UpProc] = []

    def start(weights: dict[str, float]) -> UpProc:
        path = write(tmp_path / "gpushare.toml", config(gpu_key, llama_server, tiny_model, weights))
        u = UpProc(procs, path, gpu_key)
        made.append(u)
        return u

    start.rewrite = lambda u, weights: write(u.path, config(gpu_key, llama_server, tiny_model, weights))  # type: ignore[attr-defined]
    yield start
    for u in made:
        u.end()


def _load(pid: int) -> StreamLoad:
    port = control.StatusReply.from_json(control.request(pid, "status")).port
    return StreamLoad(port, 256, banned_tokens=NON_TEXT_TOKEN_IDS).start()


def test_both_join_with_the_files_weights_then_reload_reweights_and_removes(llama_up) -> None:
    up = llama_up({"chat": 3, "batch": 1})
    chat, w_chat = up.slot("chat", 60)
    batch, w_batch = up.slot("batch", 60)
    assert (w_chat, w_batch) == (3.0, 1.0)
    up.wait_line(f"chat: ready: engine pid {chat}", 60)
    assert chat != up.proc.pid and os.getpgid(chat) == chat  # the llama-server itself holds the slot
    llama_up.rewrite(up, {"chat": 5})
    up.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: alive_slots(up.key).get("chat") == (chat, 5.0), 10, what=f"chat re-weighted:\n{up.text()}")
    wait_for(lambda: proc_state(batch) is None, 20, what="the removed engine's process gone")
    wait_for(lambda: batch not in used_slots(up.key), 5, what="the removed engine's slot left")
    assert proc_state(chat) not in (None, "Z")  # not restarted


def test_kill_9_of_an_engine_brings_a_new_pid_within_the_backoff(llama_up) -> None:
    up = llama_up({"chat": 2, "batch": 1})
    chat, _ = up.slot("chat", 60)
    batch, _ = up.slot("batch", 60)
    up.wait_line("chat: ready", 60)
    os.kill(chat, signal.SIGKILL)
    new, w = up.slot("chat", 30, not_pid=chat)
    assert new != chat and w == 2.0
    up.wait_line("chat: exited (code 137)")
    up.wait_line("restart 1 in 1 s")
    assert alive_slots(up.key)["batch"][0] == batch


def _paced_pair(up: UpProc) -> tuple[int, int, list[StreamLoad]]:
    a, _ = up.slot("chat", 60)
    b, _ = up.slot("batch", 60)
    up.wait_line("chat: ready", 60)
    up.wait_line("batch: ready", 60)
    loads = [_load(a), _load(b)]
    wait_for(lambda: "T" in (proc_state(a), proc_state(b)), 20, 0.001, "an engine stopped by its pacing")
    return a, b, loads


def test_sigterm_stops_every_engine_exit_0_none_stopped_slots_gone(llama_up) -> None:
    up = llama_up({"chat": 2, "batch": 1})
    a, b, loads = _paced_pair(up)
    up.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    states: list[str | None] = []
    while time.monotonic() - t0 < 4.0 and used_slots(up.key):
        time.sleep(0.01)
        if time.monotonic() - t0 > 0.3:  # a signal in flight may land during the first few ms
            states += [proc_state(a), proc_state(b)]
    assert used_slots(up.key) == [], f"slots still held after 4 s:\n{up.text()}"
    assert up.proc.wait(15) == 0
    assert proc_state(a) is None and proc_state(b) is None
    assert "T" not in states
    for lo in loads:
        lo.stop_nowait()


def test_sigkill_of_up_leaves_no_engine_stopped(llama_up) -> None:
    up = llama_up({"chat": 2, "batch": 1})
    a, b, loads = _paced_pair(up)
    up.proc.kill()
    time.sleep(0.5)
    states = []
    for _ in range(100):
        states += [proc_state(a), proc_state(b)]
        time.sleep(0.01)
    assert "T" not in states
    wait_for(lambda: proc_state(a) is None and proc_state(b) is None, 20, what="engines ended by their supervisors")
    for lo in loads:
        lo.stop_nowait()


def _answer(port: int) -> int | str:
    """A short completion on a new connection: its status, or the name of the error that ended it."""
    bias = [[t, False] for t in NON_TEXT_TOKEN_IDS]
    body = {"prompt": "the a of", "n_predict": 4, "ignore_eos": True, "logit_bias": bias}
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=60, headers={"Connection": "close"})
    except httpx.ConnectError as e:
        return "refused" if isinstance(e.__cause__, ConnectionRefusedError) or "refused" in str(e) else repr(e)
    except httpx.HTTPError as e:
        return repr(e)
    return r.status_code


def test_kill_9_of_a_supervisor_refuses_no_request(llama_up) -> None:
    """`up` holds the engine's public listening socket and hands it to each supervisor it starts: while a killed
    one is restarted (backoff, start, the model's load) connections wait in the socket's backlog, then at the new
    proxy until the engine is ready. A client every 100 ms for 30 s, 3 kills -9, each between two requests (a
    request in flight dies with the process that holds its connection): 0 refused, every request answered 200."""
    up = llama_up({"chat": 1})
    engine, _ = up.slot("chat", 60)
    up.wait_line("chat: ready", 60)
    port = control.StatusReply.from_json(control.request(engine, "status")).port
    assert port is not None
    between = threading.Lock()  # held by the client while a request is in flight
    answers: list[int | str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            with between:
                answers.append(_answer(port))
            time.sleep(0.1)

    t = threading.Thread(target=client, daemon=True)
    t0 = time.monotonic()
    t.start()
    for k in range(3):
        time.sleep(max(0.0, t0 + 4 + 9 * k - time.monotonic()))
        with between:
            supervisor = psutil.Process(engine).ppid()
            proxy = [c.pid for c in psutil.Process(supervisor).children() if "proxy_process" in " ".join(c.cmdline())]
            os.kill(supervisor, signal.SIGKILL)
            wait_for(lambda s=supervisor: proc_state(s) in (None, "Z"), 10, 0.005, "the killed supervisor gone")
            # its proxy process dies with it (it would otherwise take connections for an engine that is gone)
            wait_for(lambda p=proxy: all(proc_state(x) in (None, "Z") for x in p), 5, 0.005, "its proxy gone")
        assert len(proxy) == 1
        engine, _ = up.slot("chat", 30, not_pid=engine)
    time.sleep(max(0.0, t0 + 30 - time.monotonic()))
    stop.set()
    t.join(70)
    up.wait_line("chat: exited (signal 9)", count=3)
    bad = [a for a in answers if a != 200]
    assert len(answers) >= 100 and bad == [], f"{len(answers)} requests, not 200: {bad}\n{up.text()}"
