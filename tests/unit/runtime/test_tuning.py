"""The interpreter settings a worker runs records under (runtime/tuning.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agents_stream.errors import ConfigurationError
from agents_stream.runtime.tuning import (
    DEFAULT_SWITCH_US,
    LOOP_ENV,
    SWITCH_ENV,
    loop_factory,
    record_processing,
    run_loop,
    switch_interval,
)


def test_default_switch_interval_applies_and_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    before = sys.getswitchinterval()
    with record_processing():
        assert sys.getswitchinterval() == pytest.approx(min(before, DEFAULT_SWITCH_US / 1e6))
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(("raw", "seconds"), [("50", 50e-6), (" 1000 ", 1e-3), ("12.5", 12.5e-6)])
def test_the_variable_sets_the_interval_exactly(
    monkeypatch: pytest.MonkeyPatch, raw: str, seconds: float
) -> None:
    monkeypatch.setenv(SWITCH_ENV, raw)
    assert switch_interval() == pytest.approx(seconds)
    with record_processing():
        assert sys.getswitchinterval() == pytest.approx(seconds, abs=1e-6)  # whole us


@pytest.mark.parametrize("raw", ["fast", "0", "5", "nan", "inf", "200000", "-50", "200us"])
def test_a_malformed_interval_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(SWITCH_ENV, raw)
    with pytest.raises(ConfigurationError, match=SWITCH_ENV):
        switch_interval()
    before = sys.getswitchinterval()
    with pytest.raises(ConfigurationError), record_processing():
        pass
    assert sys.getswitchinterval() == before


async def _loop_class() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_runs_the_worker_loop_unless_asked_for_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert run_loop(_loop_class()).startswith("uvloop")
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert loop_factory() is None
    assert run_loop(_loop_class()).startswith("asyncio")


def test_an_unknown_event_loop_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOOP_ENV, "trio")
    with pytest.raises(ConfigurationError, match=LOOP_ENV):
        loop_factory()
