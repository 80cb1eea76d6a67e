"""Types of the C relay (_relay.c, which says what it does)."""

from collections.abc import Sequence

LIVE: int
LAST: int
ODD: int
EOF: int
READ_ERROR: int
CLIENT_GONE: int
CANCELLED: int
DONE: int
HEAD: int
CONNECT_FAILED: int
IN_SIZE: int
IN_DATA: int
IN_CRLF: int
IN_LAST: int

# a read held for the loop: (time, where its event begins, its bytes)
Held = tuple[float, int, bytes]
# a request's reply, from its first byte: (first byte's time, status (0: no head parsed), head's time, streamed,
# written)
Head = tuple[float, int, float, int, int]
# (token, reason, errno, state, left, out, rest, times, dropped, relayed, held, head)
Report = tuple[int, int, int, int, int, bytes, bytes, tuple[float, ...], int, int, tuple[Held, ...], Head | None]

class Relayer:
    def __init__(
        self,
        notify_fd: int,
        not_tokens: Sequence[bytes],
        out_max: int,
        flush_s: float,
        stream_types: Sequence[bytes] = (),
        head_max: int = 65536,
        hop_headers: Sequence[bytes] = (),
    ) -> None: ...
    def start(self, up_fd: int, client_fd: int, timed: bool, hold_max: int = -1) -> int: ...
    def request(
        self,
        up_fd: int,
        client_fd: int,
        data: bytes,
        close_client: bool,
        timed: bool,
        hold_max: int,
        connect_s: float,
    ) -> int: ...
    def half_close(self, token: int) -> None: ...
    def seen(self, token: int, found: bool) -> tuple[Held, ...]: ...
    def collect(self) -> list[Report]: ...
    def cancel(self, token: int) -> Report | None: ...
    def close(self) -> None: ...
