"""The SLO governor (core/pacing/governor.py) run for one supervised engine: a slow loop of its own (a thread, one
step every SLO_TICK_S), never on the pacing path. It reads the front proxy's figures (latency_link.LatencySnapshot),
moves the engine's weight and class with the supervisor's own setters, and writes each decision as one line in the
engine's log (`gpushare-tui: governor: ...`) and on the supervisor's output.

    keeper = SloKeeper(target, bounds, engine=supervisor, snapshot=..., usage=..., log_path=..., say=...).start()
    handlers = keeper.wrap(handlers)   # the control socket's set_weight/set_class: who set it
    keeper.report()                    # the `status` reply's `slo`
    keeper.close()

Who writes the weight and class (one writer per value, governor.paused_s): `up` (its start; a reload that changes
the weight: `set_weight` with `"config": true`) declares the engine again: its declared class is set again, and
the governor starts afresh from them; a person's edit (`set_weight`/`set_class` on the control socket otherwise:
the dashboard, `gpushare-tui weight`/`class`) applies at once and holds the governor off for
GOVERNOR_MANUAL_HOLD_S; the governor writes only when neither holds it off."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from ..host import paths
from ..pacing.control import Handler
from ..pacing.governor import GOVERNOR_BUSY_WINDOW_S, Figures, Governor, GovernorBounds, SloReport, SloTarget
from .latency_link import LatencySnapshot

SLO_TICK_S = 1.0  # one governor step this often
NO_FIGURES = Figures(None, None, 0)
Usage = Callable[[], "tuple[int, float] | None"]  # (its µs with work in flight so far, the others' weights summed)


class Governed(Protocol):
    """What the keeper needs of the engine (the supervisor)."""

    klass: str
    weight: float

    def set_weight(self, weight: float) -> float: ...

    def set_class(self, klass: str) -> str: ...


class SloKeeper:
    """One engine's governor, ticked on a thread of its own; thread-safe (a lock serialises the ticks and the
    edits the control socket reports). `snapshot()`: the proxy's figures as last received (None: none yet);
    `usage()`: the µs the engine had work in flight so far and the other members' weights now (None: unknown),
    from which each step's figures get its use over GOVERNOR_BUSY_WINDOW_S (governor.Figures.busy_frac)."""

    def __init__(
        self,
        target: SloTarget,
        bounds: GovernorBounds,
        *,
        engine: Governed,
        snapshot: Callable[[], LatencySnapshot | None],
        log_path: str | None,
        usage: Usage | None = None,
        say: Callable[[str], None] = print,
        clock_s: Callable[[], float] = time.monotonic,
        tick_s: float = SLO_TICK_S,
    ) -> None:
        self._engine, self._snapshot, self._log_path, self._say = engine, snapshot, log_path, say
        self._usage = usage
        self._busy: deque[tuple[float, int]] = deque()  # (monotonic s, in-flight µs) samples: the window's and one more
        self._clock, self._tick_s = clock_s, tick_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.changes: list[tuple[float, str, float]] = []  # (monotonic s, class, weight) the governor set
        self.declared_class = engine.klass  # up's (or run's --class): a reload by up sets it again
        self.governor = Governor(
            target,
            bounds,
            klass=engine.klass,
            weight=engine.weight,
            figures=self._figures,
            apply=self._apply,
            say=self._line,
            now_s=clock_s(),
        )
        self._line(f"governor: target {_target_text(target)}; bounds {_bounds_text(bounds)}")

    def start(self) -> SloKeeper:
        self._thread = threading.Thread(target=self._run, name="gpushare-slo", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def tick(self) -> None:
        """One governor step now (the thread's; tests call it)."""
        with self._lock:
            self.governor.tick(self._clock())

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                self.tick()
            except Exception as e:  # a bug: said once; the engine runs on at the setting it has
                self._say(f"gpushare-tui: governor stopped ({type(e).__name__}: {e}); the weight stays as it is")
                return

    def _figures(self, now_s: float) -> Figures:
        snap = self._snapshot()
        figures = snap.recent if snap is not None else NO_FIGURES
        got = self._usage() if self._usage is not None else None
        if got is None:
            return figures
        busy_us, others_weight = got
        samples = self._busy
        samples.append((now_s, busy_us))
        while len(samples) > 2 and now_s - samples[1][0] >= GOVERNOR_BUSY_WINDOW_S:
            samples.popleft()  # the oldest kept is the last one at least the window back
        t0, b0 = samples[0]
        if now_s - t0 < GOVERNOR_BUSY_WINDOW_S / 2 or busy_us < b0:  # too short to judge, or a counter that went back
            return replace(figures, others_weight=others_weight)
        return replace(figures, busy_frac=(busy_us - b0) / 1e6 / (now_s - t0), others_weight=others_weight)

    def _apply(self, klass: str, weight: float) -> None:
        """The governor's change, through the engine's own setters (not the control socket: no person's edit)."""
        if klass != self._engine.klass:
            self._engine.set_class(klass)
        self._engine.set_weight(weight)
        self.changes.append((self._clock(), klass, weight))

    def _line(self, text: str) -> None:
        """One line in the engine's log and on the supervisor's output."""
        line = f"gpushare-tui: {text}"
        self._say(line)
        if self._log_path is None:
            return
        try:
            fd = paths.open_log(self._log_path)
        except (OSError, paths.UntrustedPathError):
            return
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- who set it ---------------------------------------------------------------------------------------

    def wrap(self, handlers: dict[str, Handler]) -> dict[str, Handler]:
        """The control socket's `set_weight` and `set_class`, telling the governor who set the value: `up` (a
        `set_weight` with `"config": true`) declares it again; anyone else is a person's edit."""
        set_weight, set_class = handlers["set_weight"], handlers["set_class"]

        def governed_set_weight(req: dict) -> dict:
            reply = set_weight(req)
            self._edited(by_up=req.get("config") is True)
            return reply

        def governed_set_class(req: dict) -> dict:
            reply = set_class(req)
            self._edited(by_up=False)
            return reply

        return {**handlers, "set_weight": governed_set_weight, "set_class": governed_set_class}

    def _edited(self, *, by_up: bool) -> None:
        e, g = self._engine, self.governor
        with self._lock:
            now = self._clock()
            if by_up:
                if e.klass != self.declared_class:
                    e.set_class(self.declared_class)
                g.declare(now, g.target, g.bounds, klass=e.klass, weight=e.weight)
                self._line(f"governor: restarted from {e.klass} weight {e.weight:g} (set by up)")
            else:
                g.manual(now, klass=e.klass, weight=e.weight)

    def report(self) -> SloReport:
        snap = self._snapshot()
        with self._lock:
            return self.governor.report(snap.minute if snap is not None else None, self._clock())


def _target_text(t: SloTarget) -> str:
    parts = [f"{k} p99 ≤ {v:g} ms" for k, v in (("ttft", t.ttft_p99_ms), ("itl", t.itl_p99_ms)) if v is not None]
    return ", ".join(parts)


def _bounds_text(b: GovernorBounds) -> str:
    return f"weight {b.weight_min:g}-{b.weight_max:g}, class {' or '.join(b.classes)}"
