"""Untrusted text (peer names, segment keys, engine replies) is never read as Textual markup:
a name such as `[/x]` or `[link=...]` is shown as written, in toasts and dialogs, and never raises."""

from __future__ import annotations

import asyncio

import pytest
from slots import NOW, slot, snap
from textual.widgets._toast import Toast

from gpushare_tui.app import DashboardApp
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.widgets.confirm_stop import ConfirmStop
from gpushare_tui.widgets.weight_modal import WeightModal

pytestmark = pytest.mark.slow

HOSTILE = "[/x]a[b]c[link=x]"


def _model(managed: bool) -> DashboardModel:
    s = snap([slot(0, 1.0, name=HOSTILE), slot(1, 1.0, name="other")])
    engine = EngineInfo(state="running", kind="synth", model=HOSTILE) if managed else None
    rows = tuple(PeerRow("k", p, managed, None, engine if p.slot == 0 else None) for p in s.peers)
    return DashboardModel(NOW, (GpuView(s, None, rows, achieved_shares(rows)),))


def _texts(screen) -> str:
    return "\n".join(str(w.render()) for w in screen.query("Label, Static"))


def test_a_foreign_peer_named_like_markup_is_toasted_as_written():
    async def main():
        app = DashboardApp(FixedSource([_model(False)]), interval_s=3600)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await pilot.pause(0.2)
            await pilot.press("w")
            await pilot.pause(0.2)
            notes = [n.message for n in app._notifications]
            assert len(notes) == 1 and HOSTILE in notes[0], notes
            await pilot.pause(0.3)
            toasts = [str(t.render()) for t in app.screen.query(Toast)]
            assert len(toasts) == 1 and HOSTILE in toasts[0], toasts
            assert app.is_running

    asyncio.run(main())


def test_dialogs_show_a_markup_name_as_written():
    async def main():
        app = DashboardApp(FixedSource([_model(True)]), interval_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.2)
            for key, screen in (("w", WeightModal), ("s", ConfirmStop)):
                await pilot.press(key)
                await pilot.pause(0.2)
                assert isinstance(app.screen, screen)
                assert HOSTILE in _texts(app.screen)
                await pilot.press("escape")
                await pilot.pause(0.1)
            assert app.is_running

    asyncio.run(main())
