"""One exception base: every error reported to a user is a GpushareError (usage errors a UsageError)."""

from __future__ import annotations

import pytest

from gpushare_tui.core.engines.declaration import DeclarationError
from gpushare_tui.core.engines.synthetic import StatusFileError
from gpushare_tui.core.host.errors import ControlError, EngineError, GpushareError, UsageError
from gpushare_tui.core.observe.gpu import GpuKeyError
from gpushare_tui.core.registry.abi import BadKeyError, BadWeightError
from gpushare_tui.core.registry.membership import RegistryFullError
from gpushare_tui.core.registry.segment import SegmentError, UnknownGroupError
from gpushare_tui.demo import DemoError

USAGE = [BadKeyError, BadWeightError, DeclarationError, UnknownGroupError]
RUNTIME = [ControlError, EngineError, StatusFileError, GpuKeyError, RegistryFullError, SegmentError, DemoError]


@pytest.mark.parametrize("cls", USAGE + RUNTIME, ids=lambda c: c.__name__)
def test_every_error_is_a_gpushare_error(cls: type) -> None:
    assert issubclass(cls, GpushareError)
    assert issubclass(cls, UsageError) == (cls in USAGE)


@pytest.mark.parametrize("cls", USAGE, ids=lambda c: c.__name__)
def test_invalid_input_is_still_a_value_error(cls: type) -> None:
    assert issubclass(cls, ValueError)


def test_only_engine_errors_carry_a_log_tail() -> None:
    assert GpushareError("x").log_tail == "" and ControlError("x").log_tail == ""
    assert EngineError("exited", "last line").log_tail == "last line"
