"""An independent registry writer: stdlib only (struct + mmap), straight from spec/registry-abi.md,
sharing no code with gpushare_tui. It creates /dev/shm/opencoti-gpu-KEY, claims the first slots
for itself and heartbeats them until killed.

usage: python raw_writer.py KEY WEIGHT:NAME[:dead] ...   ("dead": heartbeat 60 s old, never renewed)
Prints "ready" once every slot is written.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time

HEADER = struct.Struct("<8sIIII")  # magic, version, slot_count, slot_size, header_size
SLOT = struct.Struct("<IIqfIqI48s")  # pid, seq, boot_us, weight, active, heartbeat_us, busy_ppm, name
HEADER_SIZE, SLOT_SIZE, SLOTS, SIZE = 64, 128, 16, 4096


def now_us() -> int:
    return time.time_ns() // 1000


def main(key: str, specs: list[str]) -> None:
    fd = os.open(f"/dev/shm/opencoti-gpu-{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, SIZE)
    mm = mmap.mmap(fd, SIZE)
    struct.pack_into("<IIII", mm, 8, 1, SLOTS, SLOT_SIZE, HEADER_SIZE)
    mm[0:8] = b"OCGPU\0\0\0"  # magic last
    boot, pid = now_us(), os.getpid()
    slots = []
    for i, spec in enumerate(specs):
        weight, name, *rest = spec.split(":")
        slots.append((i, float(weight), name.encode(), bool(rest and rest[0] == "dead")))

    def write(i: int, weight: float, name: bytes, hb_us: int, seq: int) -> None:
        off = HEADER_SIZE + i * SLOT_SIZE
        struct.pack_into("<I", mm, off + 4, seq + 1)  # odd: writing
        SLOT.pack_into(mm, off, pid, seq + 1, boot, weight, 1, hb_us, 500_000, name)
        struct.pack_into("<I", mm, off + 4, seq + 2)

    seqs = [0] * len(slots)
    for i, weight, name, dead in slots:
        write(i, weight, name, now_us() - (60_000_000 if dead else 0), seqs[i])
        seqs[i] += 2
    print("ready", flush=True)
    while True:
        time.sleep(0.3)
        for i, weight, name, dead in slots:
            if not dead:
                write(i, weight, name, now_us(), seqs[i])
                seqs[i] += 2


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
