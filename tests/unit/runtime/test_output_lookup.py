"""A completed action replayed without its emitted marker: its outputs are looked up in
the output topic before they are sent again (host/output_log.py), and a lookup that
fails is answered by the processing guarantee.

At-least-once sends them again (a duplicate at worst). Exactly-once must not: the
ActionDone can commit in one transaction and its outputs in the next while the input's
offset commits in neither (a record before it still in flight), so after a lost
partition the outputs may be committed already; sent again they would be read twice.
The cluster fault test found it (2026-11-29, consumer protocol: 2 outputs read twice
after "Leader epoch is newer than broker epoch" failed the lookup during a rolling
restart). So under exactly-once the lookup is retried while the partition is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.ackfuture import resolved
from agents_stream.durable import runner as runner_module
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.journal import ActionDone
from agents_stream.durable.ownership import Ownership, OwnershipLost
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.durable.sink import Sink
from agents_stream.errors import KafkaIOError
from agents_stream.state.memory import InMemoryActionStateStore


class Emitter(Agent):
    @action(InputEvent)
    @staticmethod
    async def emit(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output={"k": event.key, "j": 0}))


class LookupSink(Sink):
    """Records every send; ``landed`` fails ``failures`` times, then finds everything
    sent so far (as the topic would show it)."""

    finds_outputs = True

    def __init__(self, failures: int) -> None:
        self.sent: list[Any] = []
        self.failures = failures
        self.lookups = 0
        self.on_lookup: Any = None

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        self.sent.extend(values)
        return resolved()

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        self.lookups += 1
        if self.on_lookup is not None:
            self.on_lookup()
        if self.lookups <= self.failures:
            raise KafkaIOError("Failed to get offsets: Leader epoch is newer than broker epoch")
        return list(indexes) if self.sent else []


def replay(transactional: bool, failures: int, release: bool = False) -> LookupSink:
    """Runs a record, then runs it again as the next owner would after a lost partition:
    its ActionDone is in the journal, not marked emitted."""
    store = InMemoryActionStateStore()
    ownership = Ownership()
    ownership.acquire("in", 0)
    sink = LookupSink(failures)
    config = ContextConfig("app", "w", JSON, ownership=ownership)
    record = RecordInput(key="k", seq=7, value=1, partition=0)

    def runner() -> ActionRunner:
        return ActionRunner(
            Emitter, store, config, sink, topic="in", transactional=transactional,
        )  # fmt: skip

    asyncio.run(runner().run(record))
    assert len(sink.sent) == 1
    # As a member that lost the partition before the emitted marker was written (or,
    # exactly-once, whose outputs' transaction is not the ActionDone's) leaves it.
    (done,) = [e for e in store._entries.values() if isinstance(e, ActionDone)]
    store.append([replace(done, emitted=False)], 0)
    if release:
        sink.on_lookup = lambda: ownership.release("in", 0)
    asyncio.run(runner().run(record))
    return sink


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "LOOKUP_RETRY_FIRST", 0.01)


def test_at_least_once_sends_again_when_the_lookup_fails() -> None:
    sink = replay(transactional=False, failures=1)
    assert sink.lookups == 1
    assert len(sink.sent) == 2  # a duplicate, as at-least-once allows


def test_exactly_once_retries_the_lookup_and_sends_nothing_twice() -> None:
    sink = replay(transactional=True, failures=3)
    assert sink.lookups == 4
    assert len(sink.sent) == 1


def test_exactly_once_gives_the_record_up_when_the_partition_goes() -> None:
    with pytest.raises(OwnershipLost):
        replay(transactional=True, failures=10, release=True)
