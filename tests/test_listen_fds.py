"""A listening socket handed down to `gpushare-tui run` (core/host/listen_fds.py): systemd's LISTEN_FDS
(sd_listen_fds(3) rules: not for our pid, ignored; for us and unusable, one line and exit 2) and `up`'s
--listen-fd; a real llama-server served on a socket passed the way systemd passes it, with a request sent
before the supervisor even started answered once the model has loaded."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import pytest

from gpushare_tui.core.host.listen_fds import ListenFdError, from_systemd, listening_socket
from testkit.cli import cli_argv
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS

SYSTEMD_STYLE = 'exec 3<&{fd} {fd}<&-; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"'  # the socket as fd 3, our pid


def test_variables_for_another_process_are_ignored_and_removed() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x", "PATH": "/bin"}
    assert from_systemd(env, pid=2) is None
    assert env == {"PATH": "/bin"}  # an engine we start never takes them for its own
    assert from_systemd({"LISTEN_FDS": "1"}, pid=2) is None  # no LISTEN_PID: not for us
    assert from_systemd({"LISTEN_PID": "2", "LISTEN_FDS": "0"}, pid=2) is None


@pytest.mark.parametrize(
    ("fds", "said"), [("x", "is not a count"), ("2", "one listening socket per engine"), ("9" * 20, "one listening")]
)
def test_a_bad_count_for_us_is_one_clear_error(fds: str, said: str) -> None:
    with pytest.raises(ListenFdError, match=said):
        from_systemd({"LISTEN_PID": "7", "LISTEN_FDS": fds}, pid=7)


def test_what_is_no_listening_tcp_socket_is_refused(tmp_path) -> None:
    with open(tmp_path / "f", "w") as f:
        with pytest.raises(ListenFdError, match=f"fd {f.fileno()} is not a socket"):
            listening_socket(f.fileno(), "LISTEN_FDS")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(ListenFdError, match="not a TCP socket .*SOCK_DGRAM"):
            listening_socket(udp.fileno(), "--listen-fd")
    with socket.socket() as tcp:
        tcp.bind(("127.0.0.1", 0))
        with pytest.raises(ListenFdError, match="does not listen"):
            listening_socket(tcp.fileno(), "--listen-fd")
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(tmp_path / "s"))
        unix.listen()
        with pytest.raises(ListenFdError, match="AF_UNIX"):
            listening_socket(unix.fileno(), "--listen-fd")
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(ListenFdError, match="is not open"):
        listening_socket(r, "--listen-fd")


def test_a_listening_socket_is_taken_and_not_inherited() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    fd = os.dup(s.fileno())
    s.close()
    got = listening_socket(fd, "--listen-fd")
    try:
        assert got.getsockname()[1] == port and not got.get_inheritable()
        with pytest.raises(OSError):
            os.fstat(fd)  # the fd handed down is closed: `got` is our one copy
    finally:
        got.close()


def _run_on(procs, sock: socket.socket, *args: str):
    fd = sock.fileno()
    return procs.start(["bash", "-c", SYSTEMD_STYLE.format(fd=fd), "sh", *cli_argv("run", *args)], pass_fds=[fd])


@pytest.mark.parametrize("what", ["file", "udp", "unlistening"])
def test_run_on_a_bad_socket_from_systemd_exits_2_with_one_line(procs, gpu_key, runtime_dir, tmp_path, what) -> None:
    if what == "file":
        handed = open(tmp_path / "f", "w")  # noqa: SIM115
    elif what == "udp":
        handed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    else:
        handed = socket.socket()
        handed.bind(("127.0.0.1", 0))
    with handed:
        fd = handed.fileno()
        p = procs.start(
            ["bash", "-c", SYSTEMD_STYLE.format(fd=fd), "sh", *cli_argv("run", "--gpu-key", gpu_key, "--", "true")],
            pass_fds=[fd],
        )
        _out, err = p.communicate(timeout=30)
    assert p.returncode == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "LISTEN_FDS: fd 3 " in lines[0] and "Traceback" not in err


def _completion(port: int) -> bytes:
    bias = [[t, False] for t in NON_TEXT_TOKEN_IDS]
    body = json.dumps({"prompt": "the a of", "n_predict": 4, "ignore_eos": True, "logit_bias": bias}).encode()
    head = f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


@pytest.mark.llama
def test_a_socket_passed_like_systemd_is_served_and_an_early_request_waits(
    procs, gpu_key, runtime_dir, llama_server, tiny_model
) -> None:
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    port = sock.getsockname()[1]
    early = socket.create_connection(("127.0.0.1", port), timeout=60)  # in the backlog: nothing serves it yet
    early.sendall(_completion(port))
    t0 = time.monotonic()
    p = _run_on(procs, sock, "--gpu-key", gpu_key, "--", llama_server, "-m", tiny_model, "-t", "1", "-c", "512")
    sock.close()  # the supervisor's copy serves it
    reply = b""
    while chunk := early.recv(65536):
        reply += chunk
    early.close()
    assert reply.startswith(b"HTTP/1.1 200 "), (reply[:200], p.poll())
    assert b'"content"' in reply and time.monotonic() - t0 < 60
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    assert health.status_code == 200
    p.terminate()
    assert p.wait(30) == 0 or p.returncode < 0 or p.returncode > 128, p.stderr.read() if p.stderr else ""


@pytest.mark.llama
@pytest.mark.parametrize(
    ("options", "engine", "said"),
    [
        ([], ["true"], "is served by the front proxy"),  # not llama-server: nothing would serve it
        (["--no-proxy"], ["LLAMA"], "is served by the front proxy"),
        ([], ["LLAMA", "--port", "1"], "--port 1: the listening socket handed down is on port"),
    ],
)
def test_a_socket_nothing_would_serve_as_asked_exits_2_with_one_line(
    procs, gpu_key, runtime_dir, llama_server, tiny_model, options, engine, said
) -> None:
    engine = [*([llama_server, "-m", tiny_model] if engine[0] == "LLAMA" else engine[:1]), *engine[1:]]
    with socket.create_server(("127.0.0.1", 0)) as sock:
        p = _run_on(procs, sock, *options, "--gpu-key", gpu_key, "--", *engine)
        _out, err = p.communicate(timeout=30)
    lines = [x for x in err.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and said in lines[0], err
