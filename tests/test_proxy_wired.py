"""A supervised llama-server behind the front proxy (core/engines/front_proxy.py, wired in
core/engines/supervisor.py): the
engine listens on an internal port, the proxy on the public one, and DEMAND (spec §7) follows each request's
start and end within ms; `--no-proxy` serves the engine's port directly, DEMAND then from /metrics probes."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import pytest
from llama_env import Engines

from gpushare_tui.core.engines import llama_server as ls
from gpushare_tui.core.engines.spawn import run_argv
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.cli import run_cli
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS

DEMAND_RISE_MAX_S = 0.080  # the proxy sees the head in ~3-4 ms (bench/demand_detect.py); a loaded 2-core box: tolerant
DEMAND_FALL_MAX_S = 0.080  # after the client read the response's last byte (the proxy drops it just before)
PROBED_MAX_S = 3.0  # --no-proxy: a /metrics probe every 50 ms while idle, answered between batches


# -- the arguments (no engine) --------------------------------------------------------------------


def test_proxied_args_move_the_engine_to_an_internal_port() -> None:
    args = ls.prepare_args(["llama-server", "-m", "m.gguf", "--host", "0.0.0.0", "--port=8123", "-t", "1"])
    assert (args.host, args.port, args.port_chosen, args.model) == ("0.0.0.0", 8123, False, "m.gguf")
    assert args.upstream is not None and args.upstream[0] == ls.ENGINE_HOST and args.upstream[1] != 8123
    argv = list(args.argv)
    assert "0.0.0.0" not in argv and "--port=8123" not in argv and "-t" in argv and "1" in argv
    assert argv[argv.index("--port") + 1] == str(args.upstream[1]) and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv.count("--port") == argv.count("--host") == 1


def test_unproxied_args_are_as_before() -> None:
    args = ls.prepare_args(["llama-server", "-m", "m.gguf", "--port", "8123"], proxy=False)
    assert args.upstream is None and args.port == 8123
    added = ("--metrics", "--slots", "--host", "127.0.0.1")
    assert args.argv == ("llama-server", "-m", "m.gguf", "--port", "8123", *added)
    picked = ls.prepare_args(["llama-server"])
    assert picked.port_chosen and picked.upstream is not None and picked.port != picked.upstream[1]


def test_no_proxy_is_passed_to_the_supervisor_only_when_asked() -> None:
    assert "--no-proxy" not in run_argv(["llama-server"], gpu_key="k", weight=1.0)
    argv = run_argv(["llama-server"], gpu_key="k", weight=1.0, proxy=False)
    assert argv.index("--no-proxy") < argv.index("--")


# -- a real llama-server -------------------------------------------------------------------------


@pytest.fixture
def engines(procs, gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    e = Engines(procs, gpu_key, llama_server, tiny_model)
    yield e
    e.end()


def engine_port_of(pid: int) -> int:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return int(argv[argv.index("--port") + 1])


def demand_of(seg: Segment, pid: int) -> bool | None:
    rec = next((r for r in seg.read_slots() if r.pid == pid), None)
    return None if rec is None else bool(rec.flags & abi.FLAG_DEMAND)


def wait_demand(seg: Segment, pid: int, want: bool, timeout_s: float) -> float | None:
    """Monotonic s at which the slot's DEMAND read `want` (polled every 0.5 ms), None if not within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if demand_of(seg, pid) is want:
            return time.monotonic()
        time.sleep(0.0005)
    return None


def streamed_request(port: int, n_predict: int) -> tuple[socket.socket, bytes]:
    bias = [[t, False] for t in NON_TEXT_TOKEN_IDS]
    req = {"prompt": "the a of", "n_predict": n_predict, "ignore_eos": True, "stream": True, "cache_prompt": False}
    body = json.dumps({**req, "logit_bias": bias}).encode()
    head = (
        f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # connected first: the clock starts at the send
    return sock, head + body


def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


@pytest.mark.slow
def test_requests_through_the_public_port_raise_and_drop_demand_at_once(engines) -> None:
    sup, pid, _line = engines.run(1.0)
    st = json.loads(run_cli("status", str(pid), "--json").stdout)
    public, internal = st["port"], engine_port_of(pid)
    assert public != internal  # the engine listens inside; the port the user sees is the proxy's
    assert httpx.get(f"http://127.0.0.1:{internal}/health").status_code == 200  # health and probes go there
    rises, falls = [], []
    with Segment.attach_readonly(shm_path(engines.key)) as seg:
        assert demand_of(seg, pid) is False  # health checks and scrapes through the proxy are no work
        for _ in range(3):
            sock, request = streamed_request(public, 48)
            t0 = time.monotonic()
            sock.sendall(request)
            up = wait_demand(seg, pid, True, 5)
            data = read_to_end(sock)
            t_end = time.monotonic()
            down = wait_demand(seg, pid, False, 5)
            assert b" 200 " in data.split(b"\r\n", 1)[0] and data.count(b"data: ") >= 48, data[:300]
            assert up is not None and down is not None, (up, down)
            rises.append(up - t0)
            falls.append(max(0.0, down - t_end))
    print(f"DEMAND rise after the send: {[f'{x * 1e3:.1f}' for x in rises]} ms; fall after the end: "
          f"{[f'{x * 1e3:.1f}' for x in falls]} ms")  # fmt: skip
    assert min(rises) < DEMAND_RISE_MAX_S and sorted(rises)[1] < DEMAND_RISE_MAX_S * 2, rises
    assert min(falls) < DEMAND_FALL_MAX_S and sorted(falls)[1] < DEMAND_FALL_MAX_S * 2, falls


@pytest.mark.slow
def test_no_proxy_serves_the_engine_port_and_demand_comes_from_the_probes(engines) -> None:
    sup, pid, line = engines.run(1.0, options=("--no-proxy",))
    st = json.loads(run_cli("status", str(pid), "--json").stdout)
    assert st["port"] == engine_port_of(pid)
    with Segment.attach_readonly(shm_path(engines.key)) as seg:
        sock, request = streamed_request(st["port"], 400)
        sock.sendall(request)
        up = wait_demand(seg, pid, True, PROBED_MAX_S)
        data = read_to_end(sock)
        down = wait_demand(seg, pid, False, PROBED_MAX_S)
    assert data.count(b"data: ") >= 400 and up is not None and down is not None, (up, down, data[:300])


@pytest.mark.slow
def test_a_paced_engine_stopped_with_requests_in_flight_keeps_demand(engines) -> None:
    """Two engines streaming at 1:1 are paced (each stopped part of the time); the proxy counts the request
    in flight across each stop, so a stopped engine's DEMAND stays set (spec §7: a waiting member keeps it).
    Only a stop between one request's end and the next one's head (a few ms each) may find it clear."""
    from llama_env import proc_state

    from testkit.load import StreamLoad

    (_, a, _), (_, b, _) = engines.run(1.0, name="a"), engines.run(1.0, name="b")
    ports = [json.loads(run_cli("status", str(p), "--json").stdout)["port"] for p in (a, b)]
    loads = [StreamLoad(port, 2000, banned_tokens=NON_TEXT_TOKEN_IDS).start() for port in ports]
    stopped, clear = {a: 0, b: 0}, 0
    try:
        with Segment.attach_readonly(shm_path(engines.key)) as seg:
            assert wait_demand(seg, a, True, 10) and wait_demand(seg, b, True, 10)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                for pid in (a, b):
                    if proc_state(pid) == "T":
                        stopped[pid] += 1
                        clear += demand_of(seg, pid) is not True
                time.sleep(0.003)
    finally:
        for lo in loads:
            lo.stop()
    assert stopped[a] > 0 and stopped[b] > 0, stopped  # both were paced while they streamed
    assert clear <= 0.05 * sum(stopped.values()), (clear, stopped)


@pytest.mark.slow
def test_a_flood_of_idle_connections_over_the_fd_limit_leaves_the_engine_served(engines) -> None:
    """Issue 26, finding 5: 1,224 idle connections at a soft fd limit of 1024 left the supervisor without fds.
    At a soft limit of 256 (cap (256 - PROXY_FD_HEADROOM) / 2 = 96), 400 idle connections: the proxy holds at
    most its cap (the rest wait in the backlog), a real request is still answered, and the supervisor's own
    control socket and activity still work (no EMFILE)."""
    import sys

    python = ["prlimit", "--nofile=256:256", sys.executable, "-m", "gpushare_tui"]
    sup, pid, _line = engines.run(1.0, python=python)
    public = json.loads(run_cli("status", str(pid), "--json").stdout)["port"]
    flood: list[socket.socket] = []
    try:
        for _ in range(400):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", public))
            flood.append(s)
        time.sleep(1.0)
        fds = len(os.listdir(f"/proc/{sup.pid}/fd"))
        assert fds < 256 - 16, fds  # headroom left for the rest of the supervisor
        t0 = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{public}/health", timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 10
        st = run_cli("status", str(pid), "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["state"] == "running", st.stderr
        sock, request = streamed_request(public, 16)
        sock.sendall(request)
        assert read_to_end(sock).count(b"data: ") >= 16
    finally:
        for s in flood:
            s.close()
    assert sup.poll() is None
    assert "EMFILE" not in open(json.loads(run_cli("status", str(pid), "--json").stdout)["log"]).read()


@pytest.mark.slow
def test_the_engines_port_answers_gpu_peers_and_its_props_carry_gpu_share(engines) -> None:
    """Issue 26, finding 11 (seed §5): GET /gpu/peers on the engine's own port, in the seed's shape with
    `self`, and llama-server's /props with `opencoti.gpu_share` added, every other byte as the engine sent it."""
    _sup, pid, _line = engines.run(1.5, name="seed")
    _sup2, other, _line2 = engines.run(1.0, name="other")
    public = json.loads(run_cli("status", str(pid), "--json").stdout)["port"]
    internal = engine_port_of(pid)
    assert httpx.get(f"http://127.0.0.1:{internal}/gpu/peers").status_code == 404  # the engine has none
    view = httpx.get(f"http://127.0.0.1:{public}/gpu/peers").json()
    seed_fields = {"pid", "name", "weight", "share_pct", "busy_pct", "active", "heartbeat_age_ms"}
    assert view["gpu_key"] == engines.key and seed_fields <= set(view["self"])
    assert (view["self"]["pid"], view["self"]["name"], view["self"]["weight"]) == (pid, "seed", 1.5)
    assert sorted(p["pid"] for p in view["peers"]) == sorted([pid, other])
    assert all(seed_fields <= set(p) for p in view["peers"])
    direct = httpx.get(f"http://127.0.0.1:{internal}/props").content
    via = httpx.get(f"http://127.0.0.1:{public}/props").content
    doc = json.loads(via)
    block = doc["opencoti"]["gpu_share"]
    assert block["enabled"] is True and block["gpu_key"] == engines.key and block["self"]["pid"] == pid
    added = b", " + b'"opencoti": ' + json.dumps(doc["opencoti"]).encode()
    assert via.replace(added, b"", 1) == direct
