"""A Python engine sharing a GPU through `GpuShare`: a decode-like loop of matrix-vector products,
paced so that it gets its weighted share of the GPU beside llama-servers and other engines.

    python examples/share_loop.py --weight 2 --gpu 0            # PyTorch on CUDA when importable
    python examples/share_loop.py --gpu-key demo --seconds 10   # else numpy, else pure Python, on the CPU

Watch it with `gpushare-tui` (or `gpushare-tui --once --gpu-key demo`); re-weight it from the
dashboard or with `gpushare-tui weight <pid> 3`; `gpushare-tui stop <pid>` ends the loop.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from gpushare_tui import GpuShare
from gpushare_tui.core.host.errors import GpushareError

DIM = 1024
PYTHON_DIM = 128  # pure Python: 8 x 128 x 128 multiply-adds a step (~20 ms), not 8 M


def make_step(dim: int | None):
    """(backend name, step): one "token" through 8 layers, synchronised. `dim` None: DIM (PYTHON_DIM
    in pure Python, the fallback when neither PyTorch with CUDA nor numpy is installed)."""
    try:
        import torch

        if torch.cuda.is_available():
            n = dim or DIM
            ws = [torch.randn(n, n, dtype=torch.float16, device="cuda") * n**-0.5 for _ in range(8)]
            x0 = torch.ones(n, dtype=torch.float16, device="cuda")

            def step() -> None:
                x = x0
                for w in ws:
                    x = torch.mv(w, x)
                torch.cuda.synchronize()  # the step's GPU work is done before pace() measures it

            return "torch/cuda", step
    except ImportError:
        pass
    try:
        import numpy as np
    except ImportError:
        return "python/cpu", python_step(dim or PYTHON_DIM)
    n = dim or DIM
    ws = [np.random.default_rng(i).standard_normal((n, n), dtype=np.float32) * n**-0.5 for i in range(8)]
    x0 = np.ones(n, dtype=np.float32)

    def step() -> None:
        x = x0
        for w in ws:
            x = w @ x

    return "numpy/cpu", step


def python_step(n: int):
    """The same 8 matrix-vector products in pure Python (`pip install .` brings no numpy)."""
    ws = [[[random.Random(i * n + r).gauss(0, n**-0.5) for _ in range(n)] for r in range(n)] for i in range(8)]
    x0 = [1.0] * n

    def step() -> None:
        x = x0
        for w in ws:
            x = [sum(a * b for a, b in zip(row, x)) for row in w]

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weight", type=float, default=1.0)
    ap.add_argument("--name", default="example")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index (its NVML UUID is the registry key)")
    ap.add_argument("--gpu-key", default=None, help="registry key instead of a GPU (no NVIDIA driver needed)")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until stopped)")
    ap.add_argument("--dim", type=int, default=None, help=f"matrix size (default {DIM}; {PYTHON_DIM} in pure Python)")
    a = ap.parse_args()
    backend, step = make_step(a.dim)
    try:
        share = GpuShare(weight=a.weight, name=a.name, gpu=a.gpu, gpu_key=a.gpu_key, model=backend).open()
    except GpushareError as e:
        print(f"share_loop: {e}", file=sys.stderr)
        return 1
    with share:
        print(f"share_loop: {backend}, slot {share.slot} of {share.gpu_key}, weight {share.weight:g}", flush=True)
        t0 = last = time.monotonic()
        while not share.stop_requested.is_set() and (a.seconds <= 0 or time.monotonic() - t0 < a.seconds):
            step()
            share.pace()
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                print(f"share_loop: {share.steps_per_s:.0f} steps/s, slept {share.slept_us / 1e6:.1f} s", flush=True)
        print(f"share_loop: {share.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
