"""The dashboard: a Textual app that attaches read-only to every registry segment.

The App composes the widgets and owns refresh. A collector (a thread worker)
asks the data source (`dashboard.source`) for an immutable `DashboardModel`
every interval and posts it to the UI, where `apply_model` updates the
widgets, created once, in place. The data source, the control client and the
clock are injectable (fixed data for snapshot tests, fakes for unit tests).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.notifications import Notify, SeverityLevel
from textual.reactive import var
from textual.widgets import Footer, Static
from textual.worker import Worker, get_current_worker

from .core.host.clock import ClockUs, wall_us
from .core.host.errors import GpushareError
from .core.host.text import counted
from .core.pacing.control import ControlError, Target
from .core.registry.abi import to_f32
from .dashboard import MIN_INTERVAL_S
from .dashboard.columns import fmt_age
from .dashboard.control import LocalControl
from .dashboard.history import History, Series
from .dashboard.model import DashboardModel, PeerRow, without_idle_segments
from .dashboard.protocols import ControlClient, DataSource
from .dashboard.source import LiveSource
from .widgets.confirm_stop import ConfirmStop
from .widgets.engine_detail import EngineDetail
from .widgets.gpu_panel import GpuPanel
from .widgets.help_screen import HelpScreen, help_rows
from .widgets.launch_form import SYNTHETIC, LaunchForm, LaunchResult, Runner
from .widgets.log_pane import LogPane, open_engine_log
from .widgets.peers_table import PeersTable
from .widgets.segment_errors import SegmentErrors
from .widgets.share_plot import ACHIEVED_LEGENDS, ACHIEVED_MONO_LEGENDS, ACHIEVED_TITLES, SharePlot
from .widgets.top_bar import TopBar
from .widgets.weight_modal import WeightModal

HISTORY_SPANS_S = (60.0, 120.0, 300.0, 600.0)
DEFAULT_HISTORY_S = 120.0
PLOTS_MIN_HEIGHT = 30

ADMIN_ACTIONS = frozenset({"edit_weight", "nudge", "launch", "stop_engine"})

_NUDGE_HELP = "nudge the selected peer's weight up / down (+1 / −1; halves or doubles below 1)"
_SPANS_HELP = ", ".join(f"{s / 60:g}" for s in HISTORY_SPANS_S)


class ModelReady(Message):
    def __init__(self, model: DashboardModel) -> None:
        super().__init__()
        self.model = model


class CollectFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class DashboardApp(App):
    """`gpushare-tui` with no arguments."""

    TITLE = "gpushare-tui"
    ENABLE_COMMAND_PALETTE = False
    NOTIFICATION_TIMEOUT = 4.0

    CSS = """
    Screen { layout: vertical; }
    #body { height: 1fr; }
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
    DashboardApp.-tight GpuPanel { border: none; border-top: round $primary 60%; }
    DashboardApp.-tight GpuPanel.-selected { border-top: round $accent; }
    DashboardApp.-compact #peers { max-height: 40%; }
    """

    # The tooltips are the help overlay's rows (bindings that share one are one row).
    BINDINGS = [
        Binding("w", "edit_weight", "Weight", tooltip="edit the selected peer's weight (managed engines)"),
        Binding("plus", "nudge(1)", "+W", key_display="+", show=False, tooltip=_NUDGE_HELP),
        Binding("minus", "nudge(-1)", "-W", key_display="-", show=False, tooltip=_NUDGE_HELP),
        Binding("l", "launch", "Launch", tooltip="launch an engine (llama-server, synthetic) on the selected GPU"),
        Binding("s", "stop_engine", "Stop", tooltip="stop the selected managed engine (asks first)"),
        Binding("w,plus,minus,l,s", "readonly_refused", show=False),
        Binding("L", "show_log", "Log", show=False, tooltip="show the selected managed engine's log, live"),
        Binding(
            "d",
            "show_detail",
            "Detail",
            show=False,
            tooltip="show the selected engine's latency: last minute's figures, its target, a plot over time",
        ),
        Binding("o", "sort", "Sort", tooltip="cycle the sort (slot, share, busy, weight, tok/s, speed, name, pid)"),
        Binding("h", "span", "Span", tooltip=f"cycle the plots' time span ({_SPANS_HELP} minutes)"),
        Binding(
            "p",
            "toggle_plots",
            "Plots",
            tooltip=f"show / hide the plots (hidden by default below {PLOTS_MIN_HEIGHT} lines)",
        ),
        Binding(
            "e",
            "toggle_idle_segments",
            "Idle segs",
            show=False,
            tooltip="show / hide segments with no live peers (hidden by default; never removed)",
        ),
        Binding("question_mark", "help", "Help", key_display="?", tooltip="show / hide this help"),
        Binding("q", "quit", "Quit", tooltip="quit"),
        Binding("ctrl+c", "quit", "Quit", key_display="Ctrl+C", show=False, priority=True, tooltip="quit"),
    ]

    history_s: var[float] = var(DEFAULT_HISTORY_S, init=False)
    """The plots' time span (s); `h` cycles HISTORY_SPANS_S."""
    selected_gpu: var[str | None] = var(None, init=False)
    """The GPU of the selected row (else the first): its panel is marked and the plots show it."""
    show_idle_segments: var[bool] = var(False, init=False)
    """`e`: also show segments with no live peer (always shown when --gpu-key names one)."""
    plots_wanted: var[bool | None] = var(None, init=False)
    """`p`'s choice; None: plots shown when the terminal has PLOTS_MIN_HEIGHT lines."""

    def __init__(
        self,
        source: DataSource | None = None,
        *,
        gpu_key: str | None = None,
        interval_s: float = 1.0,
        readonly: bool = False,
        history_s: float | None = None,
        clock: ClockUs = wall_us,
        control: ControlClient | None = None,
        launch_runner: Runner | None = None,
        host: str | None = None,
        demo: bool = False,
        launch_defaults: dict[str, str] | None = None,
    ) -> None:
        """`demo`: the dashboard of `gpushare-tui demo` (its hints; the launch form starts a synthetic
        engine first, and `launch_runner` ends what it launches with the demo). `launch_defaults`: the
        launch form's initial field values."""
        super().__init__()
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s")
        self.gpu_key = gpu_key
        self.interval_s = float(interval_s)
        self.readonly = readonly
        self.control: ControlClient = control if control is not None else LocalControl()
        self.launch_runner = launch_runner
        self.demo = demo
        self.launch_defaults = launch_defaults or {}
        self.clock = clock  # the timelines' cursor too (frozen in tests)
        self.source: DataSource = source if source is not None else LiveSource(gpu_key, clock, control=self.control)
        self.set_reactive(DashboardApp.history_s, float(history_s or _env_history_s() or DEFAULT_HISTORY_S))
        self.history = History(max(max(HISTORY_SPANS_S), self.history_s))
        self.model: DashboardModel | None = None  # what is shown (idle segments left out unless `e`)
        self.collected: DashboardModel | None = None  # what the source last collected
        self._hidden_segments = 0
        self.models_seen = 0
        self.collector: Worker[None] | None = None
        self.closing = False  # exit() was called
        self._wake = threading.Event()
        self._panels: dict[str, GpuPanel] = {}
        self._host = host
        self._plot_state: tuple | None = None
        self._plots: Horizontal | None = None  # widget references, set on mount

    # -- layout ----------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TopBar(self.interval_s, self.readonly, self._host, id="top")
        with Vertical(id="body"):
            yield VerticalScroll(id="gpus")
            yield SegmentErrors(id="errors")
            yield Static(self._empty_text(), id="empty")
            table = PeersTable(id="peers")
            table.border_title = "peers"
            yield table
            with Horizontal(id="plots"):
                span = DashboardApp.history_s  # each plot's span_s follows it
                yield SharePlot("share %", id="plot-share").data_bind(span_s=span)
                yield SharePlot("busy %", id="plot-busy").data_bind(span_s=span)
                yield SharePlot(
                    ACHIEVED_TITLES,
                    id="plot-achieved",
                    empty=("no busy time reported yet", "no busy time yet"),
                    legend=ACHIEVED_LEGENDS,
                    mono_legend=ACHIEVED_MONO_LEGENDS,
                ).data_bind(span_s=span)
        yield Footer()

    def _empty_text(self, hidden: int = 0) -> str:
        which = f"/opencoti-gpu-{self.gpu_key}" if self.gpu_key else "/opencoti-gpu-* segments"
        if hidden:
            return f"{counted(hidden, 'segment')} with no live peers hidden: `e` shows them."
        if self.demo:
            return (
                f"Waiting for the demo's engines on {which} … they show at the first refresh.\n"
                "`l` launches one more (a synthetic engine), `?` lists every key."
            )
        key = f"--gpu-key {self.gpu_key} " if self.gpu_key else ""
        cpu_host = "" if self.gpu_key else " (on a host without an NVIDIA GPU, add --gpu-key KEY)"
        return (
            f"Waiting for {which} … none on this host yet.\n"
            f"Start engines with `gpushare-tui launch {key}--weight W -- llama-server -m MODEL`{cpu_host}, "
            "or try `gpushare-tui demo`."
        )

    def exit(self, *args: Any, **kwargs: Any) -> None:
        self.closing = True  # on_mount may still be to run, over a screen being taken down
        super().exit(*args, **kwargs)

    def on_mount(self) -> None:
        try:
            self._mount_parts()
        except NoMatches:
            if not self.closing:
                raise
            # exit() came during the start-up (a SIGINT/SIGTERM then: the demo's handler, `up`'s): the screen's
            # widgets are going; nothing is started, and the app ends as it was asked to

    def _mount_parts(self) -> None:
        for m in self.source.prime():
            self.history.add(m)
        self._top = self.query_one(TopBar)
        self._errors = self.query_one(SegmentErrors)
        self._empty = self.query_one("#empty", Static)
        self._table = self.query_one(PeersTable)
        self._gpus_box = self.query_one("#gpus", VerticalScroll)
        self._plots = self.query_one("#plots", Horizontal)
        self._plot_share, self._plot_busy, self._plot_achieved = (
            self.query_one(f"#plot-{n}", SharePlot) for n in ("share", "busy", "achieved")
        )
        self._table.focus()
        self._layout_plots(self.size.height)
        self.collector = self.run_worker(self._collect, "collector", group="collector", thread=True, exclusive=True)

    def on_unmount(self) -> None:
        self.stop_collector()

    def on_resize(self, event: events.Resize) -> None:
        # runs before App's own handler: self.size is still the old size
        self._layout_plots(event.size.height)

    def _layout_plots(self, height: int) -> None:
        """Short terminals: the table matters more than the plots (`p` overrides). With the plots
        or several GPUs on a short terminal, the GPU panels are tight (a top rule, no subtitle);
        their timelines always stay."""
        plots = self._plots
        if plots is None:
            return  # not mounted yet; on_mount lays out
        show = self.plots_wanted if self.plots_wanted is not None else height >= PLOTS_MIN_HEIGHT
        changed = plots.has_class("-hidden") == show
        plots.set_class(not show, "-hidden")
        self.set_class(not show, "-noplots")
        self.set_class(show and height < PLOTS_MIN_HEIGHT, "-compact")
        self.set_class(height < PLOTS_MIN_HEIGHT and (show or len(self._panels) > 1), "-tight")
        if changed:
            self.call_after_refresh(self._show_plots, True)

    def watch_plots_wanted(self) -> None:
        self._layout_plots(self.size.height)

    # -- refresh ---------------------------------------------------------

    def _collect(self) -> None:
        """The collector worker: one model per interval (at once after `refresh_now`), posted to
        the UI, until cancelled; then it closes the source, which no other thread collects from."""
        worker = get_current_worker()
        try:
            next_t = time.monotonic()
            while not worker.is_cancelled:
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
        finally:
            self.source.close()

    def stop_collector(self) -> None:
        """End the collector promptly (it may be waiting for the next interval)."""
        if self.collector is None:
            self.source.close()
            return
        self.collector.cancel()
        self._wake.set()

    def refresh_now(self) -> None:
        """Collect again now (any thread)."""
        self._wake.set()

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's notify, markup off by default: messages carry peer names and engine replies,
        untrusted text in which a `[` must not be read as markup (a stray `[/x]` raised)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def on_notify(self, message: Notify) -> None:
        """One toast at a time: a new notification replaces the shown one (they stacked over the
        plots). Runs before App's own handler, which then shows the new one."""
        self.clear_notifications()

    def on_model_ready(self, message: ModelReady) -> None:
        self.apply_model(message.model)

    def on_collect_failed(self, message: CollectFailed) -> None:
        self.notify(f"refresh failed: {message.error}", severity="error", timeout=5)

    def apply_model(self, model: DashboardModel) -> None:
        """Render one model; everything is updated in place."""
        if not self._table.is_attached:
            return  # a late model while the app shuts down
        self.collected = model
        self.models_seen += 1
        self.history.add(model)
        self._render_model()

    def watch_show_idle_segments(self) -> None:
        if self.collected is not None and self._table.is_attached:
            self._render_model()

    def action_toggle_idle_segments(self) -> None:
        self.show_idle_segments = not self.show_idle_segments

    def _render_model(self) -> None:
        model, hidden = self.collected, 0
        assert model is not None
        if not self.show_idle_segments and self.gpu_key is None:
            model, hidden = without_idle_segments(model)
        self.model = model
        if hidden != self._hidden_segments:
            self._hidden_segments = hidden
            self._empty.update(self._empty_text(hidden))
        self._top.show(model.now_us, len(model.gpus), sum(1 for r in model.rows() if r.peer.alive))
        self._show_panels(model)
        self._errors.show(model.errors, model.foreign_not_shown)
        self._empty.set_class(bool(model.gpus) or not (hidden or not model.errors), "-hidden")
        self._table.show(model.rows())
        self._select_gpu()
        self._show_plots()
        if isinstance(self.screen, EngineDetail):
            self._show_detail(self.screen)

    def _show_panels(self, model: DashboardModel) -> None:
        keys = [g.gpu_key for g in model.gpus]
        gone = [k for k in self._panels if k not in keys]
        for k in gone:
            self._panels.pop(k).remove()
        new = False
        for g in model.gpus:
            panel = self._panels.get(g.gpu_key)
            if panel is None:
                panel = self._panels[g.gpu_key] = GpuPanel(g, clock=self.clock)
                self._gpus_box.mount(panel)
                new = True
            else:
                panel.show(g)
        if gone or new:
            self._mark_selected_panel()
            self._layout_plots(self.size.height)

    def _select_gpu(self) -> None:
        row = self._table.selected_row
        gpu = row.gpu_key if row is not None else None
        if gpu is None and self.model is not None and self.model.gpus:
            gpu = self.model.gpus[0].gpu_key
        self.selected_gpu = gpu

    def watch_selected_gpu(self) -> None:
        self._mark_selected_panel()
        self._show_plots()

    def _mark_selected_panel(self) -> None:
        """With more than one GPU, the selected one's panel stands out."""
        for k, p in self._panels.items():
            p.set_class(k == self.selected_gpu and len(self._panels) > 1, "-selected")

    def watch_history_s(self) -> None:
        self._show_plots(force=True)  # new series; each plot's own span_s follows by data binding

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
        span = self.history_s
        column = int(now_s // (2 * span / buckets))
        view = self.model.gpu(gpu)
        shares = tuple((r.peer.slot, round(r.peer.window_pct or 0.0, 1)) for r in view.rows) if view else ()
        state = (gpu, column, buckets, span, shares)
        if state == self._plot_state and not force:
            return
        self._plot_state = state
        if gpu is None:
            for p in (share, busy, achieved):
                p.show(())
            return
        label = f"{gpu}" if len(self.model.gpus) > 1 else None
        share.show(self.history.series(gpu, "share", now_s, span, buckets), note=label)
        busy.show(self.history.series(gpu, "busy", now_s, span, buckets), note=label)
        a = self.history.series(gpu, "achieved", now_s, span, buckets)
        c = self.history.series(gpu, "configured", now_s, span, buckets)
        achieved.show(a, c, note=label)

    @on(PeersTable.Highlighted)
    def _row_highlighted(self, event: PeersTable.Highlighted) -> None:
        self._select_gpu()
        self._show_plots()  # a no-op unless the GPU or the plots' width changed since the last model

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
        row = self._table.selected_row
        if row is None:
            self.notify("no peer selected", severity="warning")
        return row

    def _refuse_unreachable(self, row: PeerRow, what: str) -> bool:
        """A dead row, or one whose engine did not answer at the last refresh: say why `what` ("stop it")
        cannot be done, instead of opening a dialog that cannot succeed. True when refused."""
        p = row.peer
        who = f"{p.name or 'pid'} (pid {p.pid})"
        if not p.alive:
            age = "" if p.heartbeat_age_ms is None else f" for {fmt_age(p.heartbeat_age_ms)}"
            self.notify(
                f"{who} is dead (no heartbeat{age}): cannot {what}; its row stays until a joining peer takes the slot",
                severity="warning",
            )
            return True
        e = row.engine
        if row.managed and e is not None and e.error:
            self.notify(
                f"{who} did not answer its control socket at the last refresh ({e.error}): cannot {what} now",
                severity="warning",
            )
            return True
        return False

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
        if row is None or self._refuse_unreachable(row, "re-weight it") or self._refuse_foreign(row):
            return

        def done(weight: float | None) -> None:
            if weight is not None:
                self.send_weight(row, weight)

        view = self.model.gpu(row.gpu_key) if self.model is not None else None
        self.push_screen(WeightModal(row, view), done)

    def action_nudge(self, direction: int) -> None:
        row = self._selected()
        if row is None or self._refuse_unreachable(row, "re-weight it") or self._refuse_foreign(row):
            return
        self.send_weight(row, nudged_weight(row.peer.weight or 1.0, direction))

    def send_weight(self, row: PeerRow, weight: float) -> None:
        name = row.peer.name or f"pid {row.peer.pid}"
        text = f"weight of {name} → {{weight:g}}"
        e = row.engine
        if e is not None and e.owner_config is not None and e.config_weight is not None:
            if to_f32(weight) != to_f32(e.config_weight):  # owned by `up`: live only, the file is not rewritten
                config = e.owner_config.replace("{", "{{").replace("}", "}}")
                text += f", applied live; differs from {config} (weight {e.config_weight:g} there)"
        self._control_call(row, "set_weight", text, weight=weight)

    def action_stop_engine(self) -> None:
        row = self._selected()
        if row is None or self._refuse_unreachable(row, "stop it") or self._refuse_foreign(row):
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._control_call(row, "stop", f"stopping {row.peer.name or row.peer.pid}")

        self.push_screen(ConfirmStop(row), done)

    def _control_call(self, row: PeerRow, cmd: str, ok_text: str, **args: object) -> None:
        """One control request on a worker thread; the outcome is a notification."""
        pid = row.peer.pid
        target = Target(slot=row.peer.slot, gpu_key=row.gpu_key)  # the row's engine, if the pid serves several

        def work() -> None:
            try:
                reply = self.control.request(pid, cmd, timeout_s=3.0, target=target, **args)
            except ControlError as e:
                self.call_from_thread(self.notify, str(e), title=cmd, severity="error", timeout=8)
                return
            self.source.forget_status(pid)
            self.refresh_now()
            self.call_from_thread(self.notify, ok_text.format(**{**args, **reply}), title=cmd)

        self.run_worker(work, thread=True, group="control", exit_on_error=False)

    def action_show_log(self) -> None:
        row = self._selected()
        if row is None or self._refuse_unreachable(row, "show its log (its control socket names it)"):
            return
        p = row.peer
        if not row.managed:
            self.notify(f"{p.name or 'pid'} (pid {p.pid}) is a foreign peer: no log to show", severity="warning")
            return

        def work() -> None:  # a control request and file reads: off the UI thread
            try:
                log = open_engine_log(self.control, row)
            except GpushareError as e:
                self.call_from_thread(self.notify, str(e), title="log", severity="warning", timeout=8, markup=False)
                return

            async def show() -> None:  # on the app's loop; returns once the pane is mounted
                await self.push_screen(LogPane(row, log))

            try:
                # mypy cannot solve call_from_thread's `T | Awaitable[T]` callback type for an async one (Never)
                self.call_from_thread(show)  # type: ignore[arg-type]
            except RuntimeError:  # the app is gone
                log.close()

        self.run_worker(work, thread=True, group="control", exit_on_error=False)

    def action_show_detail(self) -> None:
        row = self._selected()
        if row is None:
            return
        screen = EngineDetail(row, self._latency_series(row), self.history_s)
        self.push_screen(screen)

    def _latency_series(self, row: PeerRow) -> tuple[Series, ...]:
        p = row.peer
        now_s = self.model.plot_s if self.model is not None else 0.0
        return self.history.latency_series((row.gpu_key, p.slot, p.pid, p.boot_us), now_s, self.history_s, 200)

    def _show_detail(self, screen: EngineDetail) -> None:
        """The open detail view's engine, from the model just rendered (its last row if it is gone)."""
        row = next((r for r in self.model.rows() if r.key == screen.row.key), screen.row) if self.model else screen.row
        screen.show(row, self._latency_series(row), self.history_s)

    def action_launch(self) -> None:
        key = self.selected_gpu or self.gpu_key or ""
        if self.demo:  # no llama-server or model needed, and nothing outlives the demo
            note = "In the demo, engines launched here end with it."
            defaults = {"kind": SYNTHETIC.key, **self.launch_defaults}
            form = LaunchForm(key, runner=self.launch_runner, defaults=defaults, note=note)
        else:
            form = LaunchForm(key, runner=self.launch_runner, defaults=self.launch_defaults)
        self.push_screen(form, self._launched)

    def _launched(self, result: LaunchResult | None) -> None:
        if result is not None:
            self.notify(result.summary(), title="engine launched", timeout=15)
            self.refresh_now()

    def action_sort(self) -> None:
        column = self._table.cycle_sort()
        self.notify(f"sorted by {column}", timeout=2)

    def action_span(self) -> None:
        spans = HISTORY_SPANS_S
        self.history_s = next((s for s in spans if s > self.history_s), spans[0])
        self.notify(f"plots: last {self.history_s / 60:g} min", timeout=2)

    def action_toggle_plots(self) -> None:
        if self._plots is not None:
            self.plots_wanted = self._plots.has_class("-hidden")

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        rows = help_rows(self.BINDINGS, self.get_key_display, lambda action: action in ADMIN_ACTIONS)
        self.push_screen(HelpScreen(rows, self.readonly))

    async def action_quit(self) -> None:
        self.stop_collector()  # at once: unmount would too, but only once the app has shut down
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
    gpu_key: str | None = None,
    interval_s: float = 1.0,
    readonly: bool = False,
    history_s: float | None = None,
    remotes: Sequence[str] = (),
    local: bool = True,
    all_owners: bool = False,
) -> int:
    """The CLI's default command; with `remotes` (serve URLs) their hosts' segments too (read-only rows,
    fetched off the local path: each host's report is shown when it comes). Segments of other users
    beyond a cap are not shown unless `all_owners`. The exit status: 0, or non-zero after a crash (an
    exception in the App: Textual has printed it)."""
    control = LocalControl()
    source: DataSource = LiveSource(gpu_key, control=control, all_owners=all_owners)
    remote: RemoteSource | None = None
    if remotes:
        from .dashboard.remote import RemoteSource

        source = remote = RemoteSource(source if local else None, remotes, refresh_s=interval_s)
    app = DashboardApp(
        gpu_key=gpu_key, interval_s=interval_s, readonly=readonly, history_s=history_s, source=source, control=control
    )
    if remote is not None:
        remote.on_report = app.refresh_now  # a remote report shows at once, not at the next interval
    app.run()
    return app.return_code or 0
