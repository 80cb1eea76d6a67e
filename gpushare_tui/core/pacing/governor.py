"""The SLO governor: a pure rule that moves one engine's weight and latency class inside its bounds so that
its latency target holds, and gives back what the target does not need. No I/O; the clock is passed in.

    target = SloTarget(ttft_p99_ms=300)
    bounds = GovernorBounds(weight_min=1, weight_max=8, classes=("batch", "interactive"))
    state = initial_state(bounds, klass="batch", weight=1.0)
    d = step(target, bounds, state, figures, now_s)   # at most every second; figures over the last 10 s
    state = d.state; apply d.klass, d.weight when d.changed; log d.line when it is not None

The settings it may use form a ladder, least GPU first (`ladder`): with both classes allowed, the batch class
at the lowest weight, then the interactive class (spec §7: it runs first while it has work, within its share)
at weights doubling from the lowest to the highest; with one class, that class at those weights. The rule:
- up while the target is missed: a p99 above its target in the figures of the last GOVERNOR_WINDOW_S, taken
  only once that window is all after the last change (GOVERNOR_WINDOW_S, also the least time between changes:
  a weight changes at most once per 10 s). One rung, or more for a large miss (1 + log2 of p99 / target);
- down one rung while it is met with margin: every p99 at or below GOVERNOR_MARGIN x its target for
  GOVERNOR_DOWN_AFTER_S (30 s), so batch engines get what the target does not need;
- hysteresis: between the margin and the target nothing moves; an up that follows a down (a reversal: the
  rung below did not hold) makes the rung it goes to a floor, and doubles the wait before the next down (up to
  GOVERNOR_DOWN_AFTER_MAX_S); the wait returns to its base after that long without a reversal;
- fewer than GOVERNOR_MIN_REQUESTS requests in the window: no judgement, nothing moves (an idle engine has no
  window anyway: what it holds costs no one anything);
- what its share costs the others (when the engine's use, the fraction of the time it had work in flight, and
  the other members' weights are known: Figures.busy_frac, Figures.others_weight): a setting costs the others
  device time only while the engine uses
  its whole share; below it, the engine takes what its work needs whatever the setting. So a down is made only
  when it frees device time: the engine uses at least GOVERNOR_PRESS of the share the rung below would give it
  (else a lower setting would give the others nothing and could only cost the target: held). And an engine that
  presses on its share (uses more than GOVERNOR_PRESS of it: an interactive engine is about to lose its
  priority, spec §7's budget is its share) while its p99s are no longer met with margin goes up before the
  target is missed, to the lowest rung whose share it would not press on (a flood's onset: the figures lag);
- unreachable: at the top rung, missed for GOVERNOR_UNREACHABLE_AFTER_S: said once (a line), reported (state
  "unreachable"), and held — the top rung is kept, never chased past, until the target is met again.

Several engines whose targets cannot all hold: each climbs to its top rung and reports its target unreachable;
each then holds its highest weight (and the interactive class if allowed), so the GPU is split between them in
proportion to their `weight_max` (Extension 1 bounds each one's priority by its share): the bounds say which
target matters more. Nothing oscillates: rungs change at most once per 10 s, and a miss only moves up.

One writer per value (`paused_s`): a person's edit (the dashboard's weight, `gpushare-tui weight`/`class`)
wins over the governor, which stands aside for GOVERNOR_MANUAL_HOLD_S after it and resumes from the value
set; `up` (its start, `up --reload` of a changed declaration) wins over both: it sets the target, the bounds
and the starting weight and class, and the governor starts afresh from them (`initial_state`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..observe.latency import WindowStats
from ..registry.abi import LATENCY_CLASSES

GOVERNOR_WINDOW_S = 10.0  # the figures it judges, and the least time between two changes
GOVERNOR_MARGIN = 0.7  # met with margin: every p99 at or below this fraction of its target
GOVERNOR_DOWN_AFTER_S = 30.0  # margin held this long before one rung down
GOVERNOR_DOWN_AFTER_MAX_S = 1800.0  # the most that wait grows to after reversals
GOVERNOR_UNREACHABLE_AFTER_S = 30.0  # missed at the top rung this long: the target is unreachable
GOVERNOR_MIN_REQUESTS = 3  # fewer requests in the window: no judgement
GOVERNOR_MANUAL_HOLD_S = 600.0  # a person's weight or class edit holds the governor off this long
GOVERNOR_BUSY_WINDOW_S = 2.0  # the engine's busy fraction (Figures.busy_frac) is over this: a flood shows in it
GOVERNOR_PRESS = 0.8  # busy above this fraction of its share: it presses on its share
WEIGHT_STEP = 2.0  # weights on the ladder: the lowest, doubling, then the highest

CLASS_ORDER = ("batch", "interactive")  # least first: interactive runs first while it has work (spec §7)


class GovernorConfigError(ValueError):
    """A target or bounds that cannot be governed; the message says which field and why, `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SloTarget:
    """p99 targets in ms (None: that figure has none); at least one is set."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_p99_ms", "itl_p99_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf):
                raise GovernorConfigError(f"invalid {name} {v!r}: must be a number of ms > 0", name)
        if self.ttft_p99_ms is None and self.itl_p99_ms is None:
            raise GovernorConfigError("an SLO needs ttft_p99_ms or itl_p99_ms", "ttft_p99_ms")


@dataclass(frozen=True)
class GovernorBounds:
    """What the governor may set: weights from `weight_min` to `weight_max`, and the latency classes in
    `classes` (the interactive class's priority is bounded by the engine's share, spec §7: `weight_max` is
    the most it may take with it)."""

    weight_min: float = 1.0
    weight_max: float = 8.0
    classes: tuple[str, ...] = CLASS_ORDER

    def __post_init__(self) -> None:
        for name in ("weight_min", "weight_max"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 3.4e38):
                raise GovernorConfigError(f"invalid {name} {v!r}: must be a number > 0", name)
        if self.weight_min > self.weight_max:
            raise GovernorConfigError(
                f"weight_min {self.weight_min:g} is above weight_max {self.weight_max:g}", "weight_max"
            )
        if (
            not self.classes
            or any(c not in LATENCY_CLASSES for c in self.classes)
            or len(set(self.classes)) != len(self.classes)
        ):
            raise GovernorConfigError(
                f"invalid classes {self.classes!r}: one or both of {', '.join(CLASS_ORDER)}", "classes"
            )


@dataclass(frozen=True)
class Figures:
    """What the governor reads: the p99s (ms) over its last GOVERNOR_WINDOW_S (None: no sample) and how many
    requests it judges them by."""

    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    requests: int
    busy_frac: float | None = None  # its use over GOVERNOR_BUSY_WINDOW_S: the time with work in flight (None: unknown)
    others_weight: float | None = None  # the weights of the schedule's other members, summed (None: unknown)


@dataclass(frozen=True)
class GovernorState:
    """The governor's memory: its rung and what it learned (immutable; `step` returns the next one)."""

    rung: int
    changed_at_s: float | None = None  # the last change (None: none yet)
    last_move: int = 0  # +1 up, -1 down, 0 none yet
    margin_since_s: float | None = None  # met with margin continuously since
    missed_top_since_s: float | None = None  # missed at the top rung continuously since
    floor: int = 0  # no down below this rung ...
    floor_until_s: float = -math.inf  # ... until then
    down_after_s: float = GOVERNOR_DOWN_AFTER_S  # margin held this long before a down
    reversal_at_s: float | None = None
    unreachable: bool = False


@dataclass(frozen=True)
class Decision:
    """One step's outcome: the setting to hold (`changed`: it differs from the last one), the state to keep,
    `reason` (one line: what holds or moved and why; `status` shows it) and `line` (set when something a
    person should know happened: a change, an unreachable target, one met again: the engine's log takes it)."""

    state: GovernorState
    klass: str
    weight: float
    changed: bool
    reason: str
    line: str | None = None
    verdict: str = "idle"  # "missed" | "met" | "margin" | "idle" (too few requests) | "unreachable" | "settling"


DEFAULT_WEIGHT_MAX_FACTOR = 8.0  # bounds not declared: from the engine's weight up to this many times it


def default_bounds(weight: float, classes: tuple[str, ...] = CLASS_ORDER) -> GovernorBounds:
    """The bounds of an engine that declares a target and no bounds: its weight to DEFAULT_WEIGHT_MAX_FACTOR x it
    (within what a weight may be), both classes."""
    return GovernorBounds(weight, min(3e38, weight * DEFAULT_WEIGHT_MAX_FACTOR), classes)


def ladder(bounds: GovernorBounds) -> tuple[tuple[str, float], ...]:
    """The settings the governor moves along, least GPU first (see the module)."""
    weights = [bounds.weight_min]
    while weights[-1] * WEIGHT_STEP < bounds.weight_max:
        weights.append(weights[-1] * WEIGHT_STEP)
    if weights[-1] < bounds.weight_max:
        weights.append(bounds.weight_max)
    classes = [c for c in CLASS_ORDER if c in bounds.classes]
    if len(classes) == 2:
        return (("batch", bounds.weight_min), *(("interactive", w) for w in weights))
    return tuple((classes[0], w) for w in weights)


def rung_of(bounds: GovernorBounds, klass: str, weight: float) -> int:
    """The highest rung at or below (`klass`, `weight`) (the lowest when it is below them all): where a
    governor starts from a setting made elsewhere (`up`, a person's edit)."""
    rungs = ladder(bounds)
    rank = CLASS_ORDER.index(klass) if klass in CLASS_ORDER else 0
    below = [i for i, (c, w) in enumerate(rungs) if (CLASS_ORDER.index(c), w) <= (rank, weight)]
    return below[-1] if below else 0


def initial_state(bounds: GovernorBounds, klass: str, weight: float) -> GovernorState:
    """A fresh governor from the engine's current class and weight."""
    return GovernorState(rung=rung_of(bounds, klass, weight))


def _ratio(p99_ms: float | None, target_ms: float | None) -> float | None:
    return None if p99_ms is None or target_ms is None else p99_ms / target_ms


def _figures_text(target: SloTarget, f: Figures) -> str:
    parts = []
    for label, p99, tgt in (("ttft", f.ttft_p99_ms, target.ttft_p99_ms), ("itl", f.itl_p99_ms, target.itl_p99_ms)):
        if tgt is not None:
            shown = "-" if p99 is None else f"{p99:.0f}"
            parts.append(f"{label} p99 {shown} ms {'>' if p99 is not None and p99 > tgt else '≤'} {tgt:g}")
    return ", ".join(parts) + f" ({f.requests} requests)"


def _setting_text(rung: tuple[str, float]) -> str:
    return f"{rung[0]} weight {rung[1]:g}"


def share_of(weight: float, others_weight: float) -> float:
    """The share of the device a member of `weight` gets beside members of `others_weight` (spec §5, the floor
    aside): its window, and an interactive member's priority budget (§7)."""
    return weight / (weight + others_weight) if others_weight > 0 else 1.0


def _usage(f: Figures) -> tuple[float, float] | None:
    """(busy fraction, the others' weights) when both are known and make sense, else None (not judged)."""
    b, o = f.busy_frac, f.others_weight
    if b is None or o is None or not (0 <= b < math.inf and 0 <= o < math.inf):
        return None
    return min(b, 1.0), o


def step(target: SloTarget, bounds: GovernorBounds, state: GovernorState, figures: Figures, now_s: float) -> Decision:
    """The next setting (see the module for the rule). `figures` are over the GOVERNOR_WINDOW_S before `now_s`."""
    rungs = ladder(bounds)
    top = len(rungs) - 1
    rung = min(max(state.rung, 0), top)
    s = replace(state, rung=rung)
    if s.reversal_at_s is not None and now_s - s.reversal_at_s >= GOVERNOR_DOWN_AFTER_MAX_S:
        s = replace(s, down_after_s=GOVERNOR_DOWN_AFTER_S, reversal_at_s=None)  # no reversal for long: forgotten

    def hold(st: GovernorState, why: str, verdict: str, line: str | None = None) -> Decision:
        return Decision(st, *rungs[st.rung], False, f"{_setting_text(rungs[st.rung])}: {why}", line, verdict)

    ratios = [
        r
        for r in (_ratio(figures.ttft_p99_ms, target.ttft_p99_ms), _ratio(figures.itl_p99_ms, target.itl_p99_ms))
        if r is not None
    ]
    seen = _figures_text(target, figures)
    if figures.requests < GOVERNOR_MIN_REQUESTS or not ratios:
        why = f"too few requests to judge ({figures.requests} in {GOVERNOR_WINDOW_S:g} s)"
        return hold(replace(s, margin_since_s=None), why, "idle")
    since_change = math.inf if s.changed_at_s is None else now_s - s.changed_at_s
    worst = max(ratios)
    usage = _usage(figures)
    needed = None  # pressing on its share: the lowest rung it would not press on (None: it does not, or unknown)
    if usage is not None and usage[0] > GOVERNOR_PRESS * share_of(rungs[rung][1], usage[1]):
        fits = (r for r in range(rung + 1, top + 1) if usage[0] <= GOVERNOR_PRESS * share_of(rungs[r][1], usage[1]))
        needed = next(fits, top)
    if worst <= 1.0 and needed is not None and rung < top and worst > GOVERNOR_MARGIN:  # about to miss
        assert usage is not None
        s = replace(s, margin_since_s=None, missed_top_since_s=None, unreachable=False)
        if since_change < GOVERNOR_WINDOW_S:
            return hold(s, f"pressing on its share: {seen}; settling after the last change", "settling")
        why = f"pressing on its share (busy {usage[0]:.0%} of {share_of(rungs[rung][1], usage[1]):.0%}), {seen}"
        return _up(s, rungs, rung, needed, now_s, why, "met")
    if worst > 1.0:  # missed
        s = replace(s, margin_since_s=None)
        if rung == top:
            since = s.missed_top_since_s if s.missed_top_since_s is not None else now_s
            s = replace(s, missed_top_since_s=since)
            if s.unreachable or now_s - since >= GOVERNOR_UNREACHABLE_AFTER_S:
                line = None
                if not s.unreachable:
                    line = f"target unreachable at the top of its bounds ({_setting_text(rungs[top])}): {seen}; held"
                return hold(replace(s, unreachable=True), f"target unreachable: {seen}", "unreachable", line)
            return hold(s, f"missed at the top of its bounds: {seen}", "missed")
        if since_change < GOVERNOR_WINDOW_S:
            return hold(s, f"missed: {seen}; settling after the last change", "settling")
        new = rung + 1 + int(math.log2(min(worst, 2.0**16)))  # a ratio may overflow to inf
        return _up(s, rungs, rung, max(new, needed or 0), now_s, f"missed, {seen}", "missed")
    recovered = "target met again: " if s.unreachable else ""
    line = f"{recovered}{seen}" if s.unreachable else None
    s = replace(s, missed_top_since_s=None, unreachable=False)
    if worst > GOVERNOR_MARGIN:
        return hold(replace(s, margin_since_s=None), f"met: {seen}", "met", line)
    since = s.margin_since_s if s.margin_since_s is not None else now_s
    s = replace(s, margin_since_s=since)
    lowest = s.floor if now_s < s.floor_until_s else 0
    if rung <= lowest:
        why = "at the bottom of its bounds" if rung == 0 else f"at its floor until {s.floor_until_s:.0f} s"
        return hold(s, f"met with margin: {seen}; {why}", "margin", line)
    if now_s - since < s.down_after_s or since_change < GOVERNOR_WINDOW_S:
        return hold(s, f"met with margin: {seen}; down after {s.down_after_s:g} s of it", "margin", line)
    if usage is not None and usage[0] < GOVERNOR_PRESS * (below := share_of(rungs[rung - 1][1], usage[1])):
        why = f"a lower setting frees nothing (busy {usage[0]:.0%}, the share below {below:.0%})"
        return hold(s, f"met with margin: {seen}; {why}", "margin", line)
    new = rung - 1
    s = replace(s, rung=new, changed_at_s=now_s, last_move=-1, margin_since_s=now_s)
    down = f"down to {_setting_text(rungs[new])} (from {_setting_text(rungs[rung])}): met with margin, {seen}"
    return Decision(s, *rungs[new], True, down, f"{recovered}{down}", "margin")


def _up(
    s: GovernorState, rungs: tuple[tuple[str, float], ...], rung: int, new: int, now_s: float, why: str, verdict: str
) -> Decision:
    """Up from `rung` to `new` (at most the top) because `why`. An up that follows a down (the rung below did not
    hold) makes the rung it goes to a floor, and doubles the wait before the next down."""
    new = min(len(rungs) - 1, new)
    if s.last_move < 0:
        down_after = min(GOVERNOR_DOWN_AFTER_MAX_S, 2 * s.down_after_s)
        s = replace(s, floor=new, floor_until_s=now_s + down_after, down_after_s=down_after, reversal_at_s=now_s)
    s = replace(s, rung=new, changed_at_s=now_s, last_move=1, missed_top_since_s=None)
    line = f"up to {_setting_text(rungs[new])} (from {_setting_text(rungs[rung])}): {why}"
    return Decision(s, *rungs[new], True, line, line, verdict)


def paused_s(now_s: float, manual_at_s: float | None, declared_at_s: float | None) -> float:
    """How long the governor still stands aside (0: it may write): a person's edit at `manual_at_s` holds it off
    for GOVERNOR_MANUAL_HOLD_S, unless `up` declared the engine again since (`declared_at_s`: its start or a
    reload that changed it), which wins over both."""
    if manual_at_s is None or (declared_at_s is not None and declared_at_s >= manual_at_s):
        return 0.0
    return max(0.0, manual_at_s + GOVERNOR_MANUAL_HOLD_S - now_s)


@dataclass(frozen=True)
class SloReport:
    """An engine's target and how it fares, as its control socket reports it (`status`'s `slo`; None: unknown).
    `*_attained_pct`: over the last minute, % of requests whose TTFT (of inter-token gaps: ITL) was within the
    target; `state`: the governor's last verdict (met, margin, missed, settling, idle, unreachable) or
    "paused" (a person's edit holds it off); `reason`: its last decision in one line."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    ttft_attained_pct: float | None = None
    itl_attained_pct: float | None = None
    state: str | None = None
    weight_min: float | None = None
    weight_max: float | None = None
    classes: str | None = None  # the classes it may set, comma-separated
    reason: str | None = None
    changed_ago_s: float | None = None  # since its last change (None: none yet)
    paused_s: float | None = None  # left of a person's hold (0 when not paused)


def figures_of(window: WindowStats) -> Figures:
    """The governor's figures from a recorder's window (core/observe/latency.py): its requests are those whose
    first token came in it (a long stream that has not ended is judged by its TTFT already)."""
    ttft, itl = window.percentile("ttft", 0.99), window.percentile("itl", 0.99)
    requests = window.count("ttft")
    return Figures(None if ttft is None else ttft * 1000, None if itl is None else itl * 1000, requests)


class Governor:
    """One engine's governor, run at its cadence (`tick`, about once a second, off the pacing path) by the process
    that owns the engine: `figures(now_s)` gives the last GOVERNOR_WINDOW_S (figures_of a recorder's window),
    `apply(klass, weight)` sets a change (the engine's own set_class / set_weight), `say(line)` logs a line.
    No I/O of its own: what those do is the caller's. Not thread-safe: one thread ticks it and tells it of
    edits (`manual`) and declarations (`declare`)."""

    def __init__(
        self,
        target: SloTarget,
        bounds: GovernorBounds,
        *,
        klass: str,
        weight: float,
        figures: Callable[[float], Figures],
        apply: Callable[[str, float], None],
        say: Callable[[str], None],
        now_s: float,
    ) -> None:
        self._figures, self._apply, self._say = figures, apply, say
        self.declare(now_s, target, bounds, klass=klass, weight=weight)

    def declare(self, now_s: float, target: SloTarget, bounds: GovernorBounds, *, klass: str, weight: float) -> None:
        """`up` declared the engine (its start, or a reload that changed it): it wins over a person's edit; the
        governor starts afresh from the declared class and weight."""
        self.target, self.bounds = target, bounds
        self.state = initial_state(bounds, klass, weight)
        self.declared_at_s: float = now_s
        self.manual_at_s: float | None = None
        self.last: Decision | None = None

    def manual(self, now_s: float, *, klass: str, weight: float) -> None:
        """A person set the class or weight: the governor stands aside (paused_s), then resumes from it."""
        self.manual_at_s = now_s
        self.state = replace(initial_state(self.bounds, klass, weight), changed_at_s=now_s)
        self._say(f"governor paused for {GOVERNOR_MANUAL_HOLD_S:g} s: {klass} weight {weight:g} set by hand")

    def paused_s(self, now_s: float) -> float:
        return paused_s(now_s, self.manual_at_s, self.declared_at_s)

    def tick(self, now_s: float) -> Decision | None:
        """One step, unless paused (None then)."""
        if self.paused_s(now_s) > 0:
            return None
        d = step(self.target, self.bounds, self.state, self._figures(now_s), now_s)
        self.state, self.last = d.state, d
        if d.changed:
            self._apply(d.klass, d.weight)
        if d.line is not None:
            self._say(f"governor: {d.line}")
        return d

    def report(self, window: WindowStats | None, now_s: float) -> SloReport:
        """The `status` reply's `slo`: the target, its attainment over `window` (the recorder's last minute) and
        the governor's last verdict."""
        t = self.target
        ttft = None if window is None or t.ttft_p99_ms is None else window.within_pct("ttft", t.ttft_p99_ms / 1000)
        itl = None if window is None or t.itl_p99_ms is None else window.within_pct("itl", t.itl_p99_ms / 1000)
        paused = self.paused_s(now_s)
        last = self.last
        changed = self.state.changed_at_s
        return SloReport(
            ttft_p99_ms=t.ttft_p99_ms,
            itl_p99_ms=t.itl_p99_ms,
            ttft_attained_pct=ttft,
            itl_attained_pct=itl,
            state="paused" if paused > 0 else (last.verdict if last is not None else "idle"),
            weight_min=self.bounds.weight_min,
            weight_max=self.bounds.weight_max,
            classes=",".join(self.bounds.classes),
            reason=None if last is None else last.reason,
            changed_ago_s=None if changed is None else max(0.0, now_s - changed),
            paused_s=paused,
        )
