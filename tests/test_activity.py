"""EngineActivity: when a supervised engine last decoded (pure, clock passed in)."""

from __future__ import annotations

from gpushare_tui.core.engines.activity import EngineActivity
from gpushare_tui.core.registry import abi

S = 1_000_000  # µs


def test_request_in_flight_dates_activity_at_the_probe() -> None:
    a = EngineActivity()
    a.on_probe(10 * S, 5, 0)
    assert not a.is_active(10 * S)
    a.on_probe(10 * S + 50_000, 5, 1)
    assert a.last_us == 10 * S + 50_000 and a.is_active(10 * S + 50_000)


def test_a_rise_without_a_request_is_dated_at_the_previous_probe() -> None:
    a = EngineActivity()
    a.on_probe(10 * S, 100, 1)
    a.on_probe(11 * S, 140, 0)  # decoded since 10 s, finished by 11 s
    assert a.last_us == 10 * S
    assert not a.is_active(10 * S + abi.ACTIVITY_WINDOW_US + 1)


def test_first_probe_and_flat_counters_raise_nothing() -> None:
    a = EngineActivity()
    a.on_probe(10 * S, 100, 0)
    a.on_probe(11 * S, 100, 0)
    assert a.last_us is None and not a.is_active(11 * S)


def test_cpu_time_carries_but_never_raises() -> None:
    a = EngineActivity()
    a.on_cpu(10 * S, busy=True, active=False)
    assert not a.is_active(10 * S)
    a.on_probe(11 * S, 0, 1)
    a.on_cpu(12 * S, busy=True, active=True)
    a.on_cpu(13 * S, busy=False, active=True)
    assert a.last_us == 12 * S
    assert a.is_active(12 * S + abi.ACTIVITY_WINDOW_US) and not a.is_active(12 * S + abi.ACTIVITY_WINDOW_US + 1)


def test_a_later_probe_never_moves_activity_back() -> None:
    a = EngineActivity()
    a.on_probe(10 * S, 0, 0)
    a.on_cpu(10 * S + 900_000, busy=True, active=True)
    a.on_probe(11 * S, 30, 0)
    assert a.last_us == 10 * S + 900_000


def test_probe_cadence_follows_active_as_it_is_now() -> None:
    a = EngineActivity(idle_probe_us=50_000, active_probe_us=S)
    assert a.probe_due(10 * S, active=False)
    a.probe_sent(10 * S)
    a.on_probe(10 * S, 0, 1)
    assert not a.probe_due(10 * S + 49_000, active=False)
    assert a.probe_due(10 * S + 50_000, active=False)
    assert not a.probe_due(10 * S + 500_000, active=True)
    # the flag dropped meanwhile (by anyone): the idle cadence applies at once
    assert a.probe_due(10 * S + 500_000, active=False)


def test_an_unanswered_probe_still_sets_the_cadence() -> None:
    a = EngineActivity(idle_probe_us=50_000, active_probe_us=S)
    a.probe_sent(10 * S)  # timed out: no on_probe
    assert not a.probe_due(10 * S + 500_000, active=True)
    assert a.probe_due(11 * S, active=True)
