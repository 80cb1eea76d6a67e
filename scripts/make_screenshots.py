"""Screenshots of a real demo run, for the README: SVG (Textual) and PNG where a renderer exists.

Starts the three demo engines (real `gpushare-tui synth` processes, their
default weights 2/1/1), opens the dashboard on them headless at 120x40 with its
default time span (DEFAULT_HISTORY_S), lets the plots fill it, and saves:

  dashboard.svg         main view, 120x40, default weights
  weight-modal.svg      the weight modal, `chat` 2 -> 3 typed
  help.svg              the help overlay
  launch-form.svg       the launch form
  dashboard-80x24.svg   main view at 80x24 (plots hidden there; `p` shows them)
  llama-pair.svg        two real llama-servers (tiny random model, this machine's
                        CPU) launched at 2:1, each streaming alone first (its solo
                        rate), then both under load, paced by the supervisor
                        (skipped with a note when no llama-server is found)

then converts each to PNG with rsvg-convert (librsvg2-bin) or cairosvg if
either is present. Braille (the plots) is missing from most monospace fonts
and SVG renderers ignore `textLength`, so a fallback face would draw those
runs too wide: for the PNGs each braille run is split into one glyph per
cell, drawn with DejaVu Sans squeezed to the cell width.

    .venv/bin/python scripts/make_screenshots.py [--seconds 120] [--out screenshots] [--no-llama]
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import shutil
import subprocess
import sys
import time

from gpushare_tui.app import DEFAULT_HISTORY_S, DashboardApp
from gpushare_tui.demo import start_demo, stop_demo
from gpushare_tui.widgets import launch_form
from gpushare_tui.widgets.peers_table import PeersTable

BRAILLE_RUN = re.compile(
    r'<text ([^>]*?)x="([0-9.]+)"([^>]*?)textLength="([0-9.]+)"([^>]*)>([^<]*[\u2800-\u28ff][^<]*)</text>'
)
BRAILLE_FONT = "DejaVu Sans"
BRAILLE_ADVANCE_EM = 0.7324  # DejaVu Sans braille advance width
FONT_SIZE_PX = 20.0  # Textual's SVG terminal font size
SOLO_S = 4.0  # each llama-server streams alone this long before the pair runs together
IDLE_S = 3.0


async def _until(pilot, pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the dashboard")
        await pilot.pause(0.05)


async def shoot(out: str, seconds: float) -> list[str]:
    saved: list[str] = []
    demo = start_demo()
    try:
        app = DashboardApp(gpu_key=demo.key, interval_s=1.0)  # the default span, as a user sees it
        async with app.run_test(size=(120, 40)) as pilot:
            table = app.query_one(PeersTable)
            await _until(
                pilot, lambda: table.row_count == 3 and all(table.row(k).engine is not None for k in table.order)
            )
            chat = next(k for k in table.order if table.row(k).peer.name == "chat")
            table.select_key(chat)
            await pilot.pause(seconds)
            saved.append(app.save_screenshot("dashboard.svg", out))

            await pilot.press("w")
            await pilot.pause(0.3)
            await pilot.press("backspace", "backspace", "3")
            await pilot.pause(0.3)
            saved.append(app.save_screenshot("weight-modal.svg", out))
            await pilot.press("escape")
            await pilot.press("question_mark")
            await pilot.pause(0.5)
            saved.append(app.save_screenshot("help.svg", out))
            await pilot.press("escape")
            # a neutral example instead of this machine's paths
            launch_form.default_binary = lambda: "llama-server"
            await pilot.press("l")
            await pilot.pause(0.3)
            await pilot.press(*"~/models/qwen2.5-7b-instruct-q4_k_m.gguf")
            await pilot.pause(0.5)
            saved.append(app.save_screenshot("launch-form.svg", out))
            await pilot.press("escape")

        small = DashboardApp(gpu_key=demo.key, interval_s=1.0)
        async with small.run_test(size=(80, 24)) as pilot:
            await _until(pilot, lambda: small.query_one(PeersTable).row_count == 3)
            await pilot.pause(2.5)
            saved.append(small.save_screenshot("dashboard-80x24.svg", out))
    finally:
        stop_demo(demo)
    return saved


async def shoot_llama_pair(out: str, seconds: float) -> list[str]:
    """Two supervised llama-servers (weights 2 and 1, `gpushare-tui launch`), each under a streaming
    load, on one key: the dashboard after `seconds`. Both engines are stopped afterwards."""
    import uuid

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, testkit/
    from bench.pacing import end, llama_server_path, start_supervised
    from testkit.load import StreamLoad
    from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS, write_tiny_llama

    server = llama_server_path()
    model = write_tiny_llama(os.path.join(out, ".tiny-llama.gguf"), 512, 6)
    key = f"llama-pair-{uuid.uuid4().hex[:6]}"
    engines = []
    try:
        for weight in (2.0, 1.0):
            engines.append(start_supervised(server, model, key, weight, threads=1, ctx=512))
        for e in engines:  # each alone for a while first: its solo rate (SPD% = tok/s ÷ solo)
            e.load = StreamLoad(e.port, 256, banned_tokens=NON_TEXT_TOKEN_IDS).start()
            time.sleep(SOLO_S)
            e.load.stop()
            time.sleep(IDLE_S)  # the activity window: it leaves the schedule before the next one runs
        for e in engines:
            e.load = StreamLoad(e.port, 256, banned_tokens=NON_TEXT_TOKEN_IDS).start()
        app = DashboardApp(gpu_key=key, interval_s=1.0)
        async with app.run_test(size=(120, 40)) as pilot:
            table = app.query_one(PeersTable)
            await _until(pilot, lambda: table.row_count == 2)
            await pilot.pause(seconds)
            return [app.save_screenshot("llama-pair.svg", out)]
    finally:
        end(engines)
        os.unlink(model)
        try:
            os.unlink(f"/dev/shm/opencoti-gpu-{key}")
        except FileNotFoundError:
            pass


def _split_braille_run(m: re.Match) -> str:
    """One <text> per cell for a run that contains braille, each glyph at its cell's x."""
    pre, x, mid, length, post, content = m.groups()
    chars = html.unescape(content)
    cell = float(length) / max(1, len(chars))
    squeeze = cell / (BRAILLE_ADVANCE_EM * FONT_SIZE_PX)
    out = []
    for i, ch in enumerate(chars):
        if ch in (" ", "\u00a0"):
            continue
        cx = float(x) + i * cell
        extra = ""
        if "\u2800" <= ch <= "\u28ff":
            extra = (
                f' style="font-family: {BRAILLE_FONT}"'
                f' transform="matrix({squeeze:.4f} 0 0 1 {cx * (1 - squeeze):.2f} 0)"'
            )
        out.append(f'<text {pre}x="{cx:.1f}"{mid}{post}{extra}>{html.escape(ch)}</text>')
    return "".join(out)


def to_png(svg_path: str) -> str | None:
    """PNG beside the SVG, or None when no renderer is installed."""
    png_path = svg_path[:-4] + ".png"
    with open(svg_path, encoding="utf-8") as f:
        svg = f.read()
    svg = BRAILLE_RUN.sub(_split_braille_run, svg)
    # Textual writes runs of blanks as no-break spaces; a renderer's fallback face may draw those narrower than
    # a cell, so a right-justified header ("     PID") ran into the one before it: plain spaces, kept as written
    svg = svg.replace("&#160;", " ").replace("<svg ", '<svg xml:space="preserve" ', 1)
    tmp = svg_path[:-4] + ".render.svg"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(svg)
    try:
        if shutil.which("rsvg-convert"):
            subprocess.run(["rsvg-convert", "--zoom", "1.5", "-o", png_path, tmp], check=True)
            return png_path
        try:
            import cairosvg
        except ImportError:
            return None
        cairosvg.svg2png(url=tmp, write_to=png_path, scale=1.5)
        return png_path
    finally:
        os.unlink(tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_HISTORY_S,
        help="run time before the main screenshots (default: the plots' default span, filled)",
    )
    ap.add_argument("--no-llama", action="store_true", help="skip the llama-server pair screenshot")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "screenshots"))
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    saved = asyncio.run(shoot(out, args.seconds))
    if not args.no_llama:
        saved += asyncio.run(shoot_llama_pair(out, args.seconds))
    for svg in saved:
        png = to_png(svg)
        print(svg + (f"\n{png}" if png else "  (no PNG: install librsvg2-bin or cairosvg)"))
    if not any(shutil.which(x) for x in ("rsvg-convert",)):
        print("note: PNGs need rsvg-convert (apt install librsvg2-bin) or `pip install cairosvg`", file=sys.stderr)


if __name__ == "__main__":
    main()
