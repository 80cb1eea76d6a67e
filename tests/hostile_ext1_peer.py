"""A hostile Extension-1 peer for the budget tests: stdlib only (struct + mmap), straight from
docs/registry-abi.md, sharing no code with gpushare_tui. It creates /dev/shm/opencoti-gpu-KEY (or
opens the existing one), takes the first free slot and writes it, heartbeating, until killed:

- `priority`: EXT1 + INTERACTIVE + DEMAND + PRIORITY forever, busy_ppm 0 (a liar: never over budget);
- `toggle`: the same, PRIORITY flipped every TOGGLE_S (about 1,600 flips a second), busy_ppm 0;
- `jump`: EXT1 + DEMAND (batch), busy_total_us rising by 1e15 every second (1e14 per 0.1 s).

usage: python hostile_ext1_peer.py KEY MODE [WEIGHT]      prints "ready SLOT" once its slot is written
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

HEADER_SIZE, SLOT_SIZE, SLOTS, SIZE = 64, 128, 16, 4096
SLOT = struct.Struct("<IIqfIqI48s")  # pid, seq, boot_us, weight, active, heartbeat_us, busy_ppm, name
EXT1, INTERACTIVE, DEMAND, PRIORITY = 1, 2, 4, 8
OFF_FLAGS, OFF_BUSY_TOTAL = 84, 88
TOGGLE_S = 0.0003


def now_us() -> int:
    return time.time_ns() // 1000


def open_segment(key: str) -> mmap.mmap:
    path = f"/dev/shm/opencoti-gpu-{key}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, SIZE)
        mm = mmap.mmap(fd, SIZE)
        struct.pack_into("<IIII", mm, 8, 1, SLOTS, SLOT_SIZE, HEADER_SIZE)
        mm[0:8] = b"OCGPU\0\0\0"  # magic last
    except FileExistsError:
        fd = os.open(path, os.O_RDWR)
        deadline = time.monotonic() + 1
        while os.fstat(fd).st_size < SIZE or os.pread(fd, 8, 0) != b"OCGPU\0\0\0":
            if time.monotonic() > deadline:
                raise SystemExit("segment never became valid") from None
            time.sleep(0.01)
        mm = mmap.mmap(fd, SIZE)
    return mm


def main(key: str, mode: str, weight: float) -> None:
    mm = open_segment(key)
    pid, boot = os.getpid(), now_us()
    slot = next(i for i in range(SLOTS) if struct.unpack_from("<I", mm, HEADER_SIZE + i * SLOT_SIZE)[0] == 0)
    off = HEADER_SIZE + slot * SLOT_SIZE
    seq = struct.unpack_from("<I", mm, off + 4)[0] & ~1
    base = EXT1 | DEMAND | (INTERACTIVE | PRIORITY if mode in ("priority", "toggle") else 0)
    total_us = 0

    def write(flags: int) -> None:
        nonlocal seq
        struct.pack_into("<I", mm, off + 4, seq + 1)  # odd: writing
        SLOT.pack_into(mm, off, pid, seq + 1, boot, weight, 1, now_us(), 0, mode.encode())
        struct.pack_into("<IQ", mm, off + OFF_FLAGS, flags, total_us)
        struct.pack_into("<I", mm, off + 4, seq + 2)
        seq += 2

    write(base)
    print(f"ready {slot}", flush=True)
    next_beat = next_jump = time.monotonic()
    on = True
    while True:
        t = time.monotonic()
        if mode == "toggle":
            on = not on
            write(base if on else base & ~PRIORITY)
            time.sleep(TOGGLE_S)
            continue
        if mode == "jump" and t >= next_jump:
            total_us += 10**14
            next_jump += 0.1
        if t >= next_beat or mode == "jump":
            write(base)
            next_beat = t + 0.3
        time.sleep(0.1 if mode == "jump" else 0.3)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
