"""Shared helpers for the async I/O operator tests: a recorder of everything the operator outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agents_stream.aio import AsyncWaitOperator, Element


@dataclass
class Recorder:
    """Collects the operator's callbacks in one log, in the order they were delivered."""

    log: list[tuple[str, Any, Any]] = field(default_factory=list)

    def emit(self, element: Element, outputs: list[Any]) -> None:
        self.log.append(("emit", element.value, outputs))

    def fail(self, element: Element, exc: BaseException) -> None:
        self.log.append(("fail", element.value, exc))

    def watermark(self, timestamp: int) -> None:
        self.log.append(("wm", timestamp, None))

    @property
    def values(self) -> list[Any]:
        """Input values of settled elements, in delivery order."""
        return [value for kind, value, _ in self.log if kind != "wm"]

    @property
    def outputs(self) -> dict[Any, Any]:
        return {value: out for kind, value, out in self.log if kind == "emit"}

    @property
    def failures(self) -> dict[Any, BaseException]:
        return {value: out for kind, value, out in self.log if kind == "fail"}


@pytest.fixture
def operator_factory() -> Callable[..., tuple[AsyncWaitOperator, Recorder]]:
    """Builds an operator wired to a fresh Recorder; keyword arguments go to the operator."""

    def make(fn: Any, **options: Any) -> tuple[AsyncWaitOperator, Recorder]:
        recorder = Recorder()
        options.setdefault("emit", recorder.emit)
        options.setdefault("fail", recorder.fail)
        options.setdefault("emit_watermark", recorder.watermark)
        return AsyncWaitOperator(fn, **options), recorder

    return make


def sleeper(delays: dict[Any, float]) -> Callable[[Any], Any]:
    """An async fn returning ``value * 10`` after ``delays[value]`` seconds."""

    async def fn(value: Any) -> Any:
        await asyncio.sleep(delays.get(value, 0.0))
        return value * 10

    return fn
