"""The dashboard: a Textual app that attaches read-only to every registry segment.

The App owns refresh. A collector thread reads the segments (SegmentReader),
NVML (device_stats) and the control sockets of managed engines (status, with
short timeouts and not every tick), builds an immutable `DashboardModel` and
posts it to the UI; the widgets are created once and updated in place.
The data source and the clock are injectable (fixed data for snapshot tests).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Static

from .core import control as control_mod
from .core.clock import ClockUs, mono_us, wall_us
from .core.gpu import DeviceStats, device_stats
from .core.snapshot import SegmentReader
from .core.text import printable, printable_gpu, printable_problem
from .widgets.confirm_stop import ConfirmStop
from .widgets.gpu_panel import GpuPanel
from .widgets.help_screen import HelpScreen
from .widgets.launch_form import LaunchForm, LaunchResult, Runner
from .widgets.model import DashboardModel, EngineInfo, GpuView, History, PeerRow, achieved_shares
from .widgets.peers_table import PeersTable
from .widgets.segment_errors import SegmentErrors
from .widgets.share_plot import SharePlot
from .widgets.top_bar import TopBar
from .widgets.weight_modal import WeightModal

HISTORY_SPANS_S = (60.0, 120.0, 300.0, 600.0)
DEFAULT_HISTORY_S = 120.0
MIN_INTERVAL_S = 0.2
PLOTS_MIN_HEIGHT = 30


# -- data sources -------------------------------------------------------------


class DataSource(Protocol):
    def collect(self) -> DashboardModel: ...

    def prime(self) -> list[DashboardModel]: ...

    def forget_status(self, pid: int) -> None: ...

    def close(self) -> None: ...


class LiveSource:
    """Segments + NVML + control-socket status. Runs on the collector thread.

    `status` is asked only of managed engines (a control socket exists), with a
    short timeout, every `status_every_s`; one that answers slowly or not at
    all is asked less often. NVML is retried every `nvml_retry_s` for keys
    that are not devices (CPU hosts, test keys).
    """

    def __init__(
        self,
        gpu_key: str | None = None,
        clock: ClockUs = wall_us,
        *,
        status_every_s: float = 2.0,
        status_timeout_s: float = 0.5,
        nvml_retry_s: float = 30.0,
        stats: Callable[[str], DeviceStats | None] = device_stats,
        control=control_mod,
        shm_dir: str | None = None,
    ) -> None:
        self.clock = clock
        self.reader = SegmentReader(gpu_key, shm_dir)
        self.status_every_s = status_every_s
        self.status_timeout_s = status_timeout_s
        self.nvml_retry_s = nvml_retry_s
        self._stats = stats
        self._control = control
        self._nvml_next: dict[str, float] = {}
        self._status: dict[int, tuple[EngineInfo, float]] = {}
        self._lock = threading.Lock()

    def prime(self) -> list[DashboardModel]:
        return []

    def _device(self, key: str, mono: float) -> DeviceStats | None:
        if self._nvml_next.get(key, 0.0) > mono:
            return None
        dev = self._stats(key)
        if dev is None:
            self._nvml_next[key] = mono + self.nvml_retry_s
        return dev

    def _engine(self, pid: int, mono: float) -> EngineInfo:
        with self._lock:
            cached = self._status.get(pid)
        if cached is not None and cached[1] > mono:
            return cached[0]
        t0 = time.monotonic()
        try:
            r = self._control.request(pid, "status", timeout_s=self.status_timeout_s)
            info = EngineInfo(
                state=_str(r.get("state")),
                tok_s=_float(r.get("tok_s")),
                model=_str(r.get("model")),
                kind=_str(r.get("kind")),
                port=r.get("port"),
            )
            slow = time.monotonic() - t0 > self.status_timeout_s / 2
            due = mono + self.status_every_s * (5 if slow else 1)
        except self._control.ControlError as e:
            info = EngineInfo(error=str(e), state=cached[0].state if cached else None)
            due = mono + max(5.0, self.status_every_s)
        with self._lock:
            self._status[pid] = (info, due)
        return info

    def _control_sockets(self) -> set[int] | None:
        """Pids with a control socket (`<runtime dir>/<pid>.sock`): one listdir per tick
        instead of a stat per peer. None: fall back to `is_managed` per peer."""
        if self._control is not control_mod:
            return None
        try:
            names = os.listdir(control_mod.runtime_dir())
        except (OSError, control_mod.ControlError):
            return None
        return {int(n[:-5]) for n in names if n.endswith(".sock") and n[:-5].isdigit()}

    def forget_status(self, pid: int) -> None:
        """Ask `pid` again at the next tick (after a weight change or a stop)."""
        with self._lock:
            cached = self._status.get(pid)
            if cached is not None:
                self._status[pid] = (cached[0], 0.0)

    def collect(self) -> DashboardModel:
        t0 = time.perf_counter()
        mono = time.monotonic()
        now = self.clock()
        gpus, errors = self.reader.read(now)
        gpus, errors = [printable_gpu(g) for g in gpus], [printable_problem(e) for e in errors]
        views = []
        seen: set[int] = set()
        sockets = self._control_sockets()
        for g in gpus:
            dev = self._device(g.gpu_key, mono)
            vram = dict(dev.pid_mem_mib) if dev is not None else {}
            rows = []
            for p in g.peers:
                managed = p.pid in sockets if sockets is not None else self._control.is_managed(p.pid)
                engine = None
                if managed and p.alive:
                    engine = self._engine(p.pid, mono)
                    seen.add(p.pid)
                rows.append(PeerRow(g.gpu_key, p, managed, vram.get(p.pid), engine))
            rows_t = tuple(rows)
            views.append(GpuView(g, dev, rows_t, achieved_shares(rows_t)))
        with self._lock:
            for pid in [p for p in self._status if p not in seen]:
                del self._status[pid]
        return DashboardModel(now, tuple(views), tuple(errors), (time.perf_counter() - t0) * 1000, mono_us())

    def close(self) -> None:
        self.reader.close()


def _str(x: object) -> str | None:
    return printable(x) if isinstance(x, str) else None


def _float(x: object) -> float | None:
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class FixedSource:
    """Fixed models (tests, snapshots): `prime()` fills the plots' history, `collect()` repeats the last."""

    def __init__(self, models: list[DashboardModel]) -> None:
        if not models:
            raise ValueError("FixedSource needs at least one model")
        self.models = models

    def prime(self) -> list[DashboardModel]:
        return self.models[:-1]

    def collect(self) -> DashboardModel:
        return self.models[-1]

    def forget_status(self, pid: int) -> None:
        pass

    def close(self) -> None:
        pass


# -- the app ------------------------------------------------------------------


class ModelReady(Message):
    def __init__(self, model: DashboardModel) -> None:
        super().__init__()
        self.model = model


class CollectFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


ADMIN_ACTIONS = frozenset({"edit_weight", "nudge", "launch", "stop_engine"})

# (key shown, what, admin) for the help overlay: every key the app binds.
KEY_HELP: list[tuple[str, str, bool]] = [
    ("w", "edit the selected peer's weight (managed engines)", True),
    ("+ / -", "nudge the selected peer's weight up / down (+1 / −1; halves or doubles below 1)", True),
    ("l", "launch a supervised engine (llama-server) on the selected GPU", True),
    ("s", "stop the selected managed engine (asks first)", True),
    ("o", "cycle the sort column (slot, share, busy, weight, tok/s, name, pid)", False),
    ("h", "cycle the plots' time span (1, 2, 5, 10 minutes)", False),
    ("p", "show / hide the plots (hidden by default below 30 lines)", False),
    ("?", "show / hide this help", False),
    ("q / Ctrl+C", "quit", False),
]


class Body(Vertical):
    """Everything between the title bar and the footer; tells the app when the terminal resizes."""

    DEFAULT_CSS = "Body { height: 1fr; }"

    def on_resize(self) -> None:
        self.app._layout_plots()  # type: ignore[attr-defined]


class DashboardApp(App):
    """`gpushare-tui` with no arguments."""

    TITLE = "gpushare-tui"
    ENABLE_COMMAND_PALETTE = False

    CSS = """
    Screen { layout: vertical; }
    #gpus { height: auto; max-height: 40%; }
    #empty { height: auto; padding: 1 2; color: $text-muted; }
    #empty.-hidden { display: none; }
    #peers {
        height: auto; max-height: 45%;
        border: round $primary 40%; border-title-color: $text;
    }
    #peers:focus-within { border: round $accent; }
    #plots { height: 1fr; min-height: 10; }
    #plots.-hidden { display: none; }
    DashboardApp.-noplots #peers { height: 1fr; max-height: 100%; }
    DashboardApp.-compact #gpus { display: none; }
    DashboardApp.-compact #peers { max-height: 40%; }
    """

    BINDINGS = [
        Binding("w", "edit_weight", "Weight"),
        Binding("plus", "nudge(1)", "+W", key_display="+", show=False),
        Binding("minus", "nudge(-1)", "-W", key_display="-", show=False),
        Binding("l", "launch", "Launch"),
        Binding("s", "stop_engine", "Stop"),
        Binding("w,plus,minus,l,s", "readonly_refused", show=False),
        Binding("o", "sort", "Sort"),
        Binding("h", "span", "Span"),
        Binding("p", "toggle_plots", "Plots"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        source: DataSource | None = None,
        *,
        gpu_key: str | None = None,
        interval_s: float = 1.0,
        readonly: bool = False,
        history_s: float | None = None,
        clock: ClockUs = wall_us,
        control=control_mod,
        launch_runner: Runner | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__()
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s")
        self.gpu_key = gpu_key
        self.interval_s = float(interval_s)
        self.readonly = readonly
        self.clock = clock
        self.control = control
        self.launch_runner = launch_runner
        self.source: DataSource = source if source is not None else LiveSource(gpu_key, clock, control=control)
        self.history_s = float(history_s or _env_history_s() or DEFAULT_HISTORY_S)
        self.history = History(max(max(HISTORY_SPANS_S), self.history_s))
        self.model: DashboardModel | None = None
        self.models_seen = 0
        self.selected_gpu: str | None = None
        self._panels: dict[str, GpuPanel] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._host = host
        self._plot_state: tuple | None = None
        self._plots_wanted: bool | None = None
        self._plots = None  # widget references, set on mount

    # -- layout ----------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TopBar(self.interval_s, self.readonly, self._host, id="top")
        with Body(id="body"):
            yield VerticalScroll(id="gpus")
            yield SegmentErrors(id="errors")
            yield Static(self._empty_text(), id="empty")
            table = PeersTable(id="peers")
            table.border_title = "peers"
            yield table
            with Horizontal(id="plots"):
                yield SharePlot("share %", span_s=self.history_s, id="plot-share")
                yield SharePlot("busy %", span_s=self.history_s, id="plot-busy")
                yield SharePlot(
                    "achieved vs configured share %",
                    span_s=self.history_s,
                    id="plot-achieved",
                    empty="no tok/s: needs managed engines",
                )
        yield Footer()

    def _empty_text(self) -> str:
        which = f"/opencoti-gpu-{self.gpu_key}" if self.gpu_key else "/opencoti-gpu-* segments"
        return (
            f"Waiting for {which} … none on this host yet.\n"
            "Start engines with `gpushare-tui launch --weight W -- llama-server -m MODEL`, "
            "or try `gpushare-tui demo`."
        )

    def on_mount(self) -> None:
        for m in self.source.prime():
            self.history.add(m)
        self._top = self.query_one(TopBar)
        self._errors = self.query_one(SegmentErrors)
        self._empty = self.query_one("#empty")
        self._table = self.query_one(PeersTable)
        self._gpus_box = self.query_one("#gpus", VerticalScroll)
        self._plots = self.query_one("#plots")
        self._plot_share, self._plot_busy, self._plot_achieved = (
            self.query_one(f"#plot-{n}", SharePlot) for n in ("share", "busy", "achieved")
        )
        self._table.focus()
        self._thread = threading.Thread(target=self._collector, name="gpushare-collector", daemon=True)
        self._thread.start()

    def on_unmount(self) -> None:
        self.stop_collector()

    def stop_collector(self) -> None:
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2)
        self.source.close()

    # -- refresh ---------------------------------------------------------

    def _collector(self) -> None:
        """Collector thread: one model per interval, posted to the UI."""
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                model = self.source.collect()
            except Exception as e:  # never kill the UI over one bad read
                self.post_message(CollectFailed(f"{type(e).__name__}: {e}"))
            else:
                self.post_message(ModelReady(model))
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:
                next_t = now
            self._wake.wait(next_t - now)
            self._wake.clear()

    def refresh_now(self) -> None:
        self._wake.set()

    def on_model_ready(self, message: ModelReady) -> None:
        self.apply_model(message.model)

    def on_collect_failed(self, message: CollectFailed) -> None:
        self.notify(f"refresh failed: {message.error}", severity="error", timeout=5)

    def apply_model(self, model: DashboardModel) -> None:
        """Render one model; everything is updated in place."""
        if self._stop.is_set() or not self._table.is_attached:
            return  # a late model while the app shuts down
        self.model = model
        self.models_seen += 1
        self.history.add(model)
        self._top.show(model.now_us, len(model.gpus), sum(len(g.rows) for g in model.gpus))
        self._show_panels(model)
        self._errors.show(model.errors)
        self._empty.set_class(bool(model.gpus or model.errors), "-hidden")
        table = self._table
        table.show(model.rows())
        self._select_gpu()
        self._show_plots()

    def _show_panels(self, model: DashboardModel) -> None:
        box = self._gpus_box
        keys = [g.gpu_key for g in model.gpus]
        for gone in [k for k in self._panels if k not in keys]:
            self._panels.pop(gone).remove()
        for g in model.gpus:
            panel = self._panels.get(g.gpu_key)
            if panel is None:
                panel = self._panels[g.gpu_key] = GpuPanel(g)
                box.mount(panel)
            else:
                panel.show(g)

    def _select_gpu(self) -> None:
        row = self._table.selected_row
        gpu = row.gpu_key if row is not None else None
        if gpu is None and self.model is not None and self.model.gpus:
            gpu = self.model.gpus[0].gpu_key
        if gpu != self.selected_gpu:
            self.selected_gpu = gpu
            for k, p in self._panels.items():
                p.set_class(k == gpu and len(self._panels) > 1, "-selected")

    def _show_plots(self, force: bool = False) -> None:
        """Redraw the plots when time has moved by one plot column, when the shares change
        (a weight edit shows at once), or on demand; plotext rebuilds are the costly part."""
        plots = self._plots
        if plots is None or plots.display is False or self.model is None:
            return
        share, busy, achieved = self._plot_share, self._plot_busy, self._plot_achieved
        gpu = self.selected_gpu
        now_s = self.model.plot_s
        buckets = share.buckets
        column = int(now_s // (2 * self.history_s / buckets))
        view = self.model.gpu(gpu)
        shares = tuple((r.peer.slot, round(r.peer.share_pct, 1)) for r in view.rows) if view else ()
        state = (gpu, column, buckets, self.history_s, shares)
        if state == self._plot_state and not force:
            return
        self._plot_state = state
        if gpu is None:
            for p in (share, busy, achieved):
                p.show(())
            return
        label = f"{gpu}" if len(self.model.gpus) > 1 else None
        span = self.history_s
        share.show(self.history.series(gpu, "share", now_s, span, buckets), note=label)
        busy.show(self.history.series(gpu, "busy", now_s, span, buckets), note=label)
        a = self.history.series(gpu, "achieved", now_s, span, buckets)
        c = self.history.series(gpu, "configured", now_s, span, buckets)
        achieved.show(a, c, note="⣿ achieved, 5s avg  -- configured" if a else None)

    @on(PeersTable.Highlighted)
    def _row_highlighted(self, event: PeersTable.Highlighted) -> None:
        self._select_gpu()
        self._show_plots()

    def _layout_plots(self) -> None:
        """Short terminals: the table matters more than the plots (`p` overrides)."""
        show = self._plots_wanted if self._plots_wanted is not None else self.size.height >= PLOTS_MIN_HEIGHT
        plots = self.query_one("#plots")
        changed = plots.has_class("-hidden") == show
        plots.set_class(not show, "-hidden")
        self.set_class(not show, "-noplots")
        self.set_class(show and self.size.height < PLOTS_MIN_HEIGHT, "-compact")
        if changed:
            self.call_after_refresh(self._show_plots, True)

    def action_toggle_plots(self) -> None:
        shown = not self.query_one("#plots").has_class("-hidden")
        self._plots_wanted = not shown
        self._layout_plots()

    # -- actions ---------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ADMIN_ACTIONS:
            return not self.readonly
        if action == "readonly_refused":
            return self.readonly
        return True

    def action_readonly_refused(self) -> None:
        self.notify("read-only dashboard (--readonly): admin actions are disabled", severity="warning")

    def _selected(self) -> PeerRow | None:
        row = self.query_one(PeersTable).selected_row
        if row is None:
            self.notify("no peer selected", severity="warning")
        return row

    def _refuse_foreign(self, row: PeerRow) -> bool:
        if row.managed:
            return False
        p = row.peer
        self.notify(
            f"{p.name or 'pid'} (pid {p.pid}) is a foreign peer: no gpushare-tui control socket, "
            "so it is read-only here",
            severity="warning",
        )
        return True

    def action_edit_weight(self) -> None:
        row = self._selected()
        if row is None or self._refuse_foreign(row):
            return

        def done(weight: float | None) -> None:
            if weight is not None:
                self.send_weight(row, weight)

        self.push_screen(WeightModal(row), done)

    def action_nudge(self, direction: int) -> None:
        row = self._selected()
        if row is None or self._refuse_foreign(row):
            return
        self.send_weight(row, nudged_weight(row.peer.weight or 1.0, direction))

    def send_weight(self, row: PeerRow, weight: float) -> None:
        name = row.peer.name or f"pid {row.peer.pid}"
        self._control_call(row, "set_weight", f"weight of {name} → {{weight:g}}", weight=weight)

    def action_stop_engine(self) -> None:
        row = self._selected()
        if row is None or self._refuse_foreign(row):
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._control_call(row, "stop", f"stopping {row.peer.name or row.peer.pid}")

        self.push_screen(ConfirmStop(row), done)

    def _control_call(self, row: PeerRow, cmd: str, ok_text: str, **args: object) -> None:
        """One control request on a worker thread; the outcome is a notification."""
        pid = row.peer.pid

        def work() -> None:
            try:
                reply = self.control.request(pid, cmd, timeout_s=3.0, **args)
            except self.control.ControlError as e:
                self.call_from_thread(self.notify, str(e), title=cmd, severity="error", timeout=8)
                return
            self.source.forget_status(pid)
            self.refresh_now()
            self.call_from_thread(self.notify, ok_text.format(**{**args, **reply}), title=cmd)

        self.run_worker(work, thread=True, group="control", exit_on_error=False)

    def action_launch(self) -> None:
        self.push_screen(LaunchForm(self.selected_gpu or self.gpu_key or "", runner=self.launch_runner), self._launched)

    def _launched(self, result: LaunchResult | None) -> None:
        if result is not None:
            self.notify(result.summary(), title="engine launched", timeout=15)
            self.refresh_now()

    def action_sort(self) -> None:
        column = self.query_one(PeersTable).cycle_sort()
        self.notify(f"sorted by {column}", timeout=2)

    def action_span(self) -> None:
        spans = HISTORY_SPANS_S
        nxt = next((s for s in spans if s > self.history_s), spans[0])
        self.history_s = nxt
        for p in self.query(SharePlot):
            p.span_s = nxt
            p.refresh()
        self._show_plots(force=True)
        self.notify(f"plots: last {nxt / 60:g} min", timeout=2)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen(KEY_HELP, self.readonly))

    async def action_quit(self) -> None:
        self.stop_collector()
        self.exit()


def nudged_weight(w: float, direction: int) -> float:
    """+: w+1 (doubling below 1); -: w-1 (halving below 2). Never ≤ 0."""
    if direction > 0:
        return w + 1 if w >= 1 else min(1.0, w * 2)
    return w - 1 if w >= 2 else max(w / 2, 1e-3)


def _env_history_s() -> float | None:
    raw = os.environ.get("GPUSHARE_TUI_HISTORY_S")
    try:
        v = float(raw) if raw else None
    except ValueError:
        return None
    return v if v and v > 0 else None


def run_dashboard(
    gpu_key: str | None = None, interval_s: float = 1.0, readonly: bool = False, history_s: float | None = None
) -> None:
    """The CLI's default command."""
    DashboardApp(gpu_key=gpu_key, interval_s=interval_s, readonly=readonly, history_s=history_s).run()
