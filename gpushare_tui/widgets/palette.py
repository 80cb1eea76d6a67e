"""Per-peer colours, stable by slot, shared by the timeline, the table and the plots.

Colour is never the only cue: every slot also has a fill pattern and a marker
character, so the dashboard stays readable with NO_COLOR (monochrome).
"""

from __future__ import annotations

# 16 colours (one per slot of ABI v1), distinct on a dark background.
SLOT_COLOURS: tuple[str, ...] = (
    "#4fc3f7",  # light blue
    "#ffb74d",  # orange
    "#81c784",  # green
    "#f06292",  # pink
    "#ba68c8",  # purple
    "#fff176",  # yellow
    "#4db6ac",  # teal
    "#e57373",  # red
    "#a1887f",  # brown
    "#7986cb",  # indigo
    "#aed581",  # light green
    "#ff8a65",  # deep orange
    "#4dd0e1",  # cyan
    "#dce775",  # lime
    "#9575cd",  # deep purple
    "#90a4ae",  # blue grey
)

# Monochrome cues: timeline fill and plot marker per slot.
SLOT_FILLS: tuple[str, ...] = ("█", "▓", "▒", "░")
SLOT_MARKERS: str = "0123456789abcdef"


def slot_colour(slot: int) -> str:
    """Hex colour (`#rrggbb`) of a slot."""
    return SLOT_COLOURS[slot % len(SLOT_COLOURS)]


def slot_rgb(slot: int) -> tuple[int, int, int]:
    h = slot_colour(slot)
    return int(h[1:3], 16), int(h[3:5], 16), int(h[5:7], 16)


def slot_fill(slot: int) -> str:
    return SLOT_FILLS[slot % len(SLOT_FILLS)]


def slot_marker(slot: int) -> str:
    return SLOT_MARKERS[slot % len(SLOT_MARKERS)]
