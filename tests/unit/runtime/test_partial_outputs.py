"""Outputs of one record that partly reach the log are never written twice (guarantee 4).

When some of a record's outputs land and others are lost (the broker refused them, or
they timed out), the record fails (dead letter) and its ActionDone is marked with the
outputs that landed (``ActionDone.emitted_outputs``); a replay of the record sends only
the others. Runs the real output sink and ``AckingProducer`` over a stand-in client that
loses chosen records, through the batch path (sync action) and the per-record path
(async action), for several rounds of replays with random losses.

Reference model: after the last replay, the log holds every output of every record
exactly once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.journal import ActionDone
from agents_stream.durable.lane import run_records
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput, RecordOutcome
from agents_stream.host.sink import KafkaOutputSink
from agents_stream.kafka.producer import AckingProducer
from agents_stream.serde.values import JsonValueCodec
from agents_stream.state.memory import InMemoryActionStateStore
from tests.unit.runtime.test_sink_batches import Msg


class LossyClient:
    """Stands in for confluent_kafka.Producer: reports records on ``poll``, losing the
    outputs named in ``lose`` (``(key, j)``) as a broker refusing them would."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.lose: set[tuple[str, int]] = set()
        self._pending: list[tuple[bytes, bytes, Any]] = []
        self._lock = threading.Lock()

    def produce(self, topic, value=None, key=None, partition=None, on_delivery=None, **kw):  # type: ignore[no-untyped-def]
        with self._lock:
            self._pending.append((key, value, on_delivery))

    def poll(self, timeout: float) -> int:
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            time.sleep(0.0005)
        for key, value, delivered in batch:
            output = json.loads(value)
            if (output["k"], output["j"]) in self.lose:
                delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Msg(key, value, -1))
            else:
                self.log.append((output["k"], output["j"]))
                delivered(None, Msg(key, value, len(self.log)))
        return len(batch)

    def __len__(self) -> int:
        return len(self._pending)


def _outputs(event: InputEvent, ctx: RunnerContext) -> None:
    for j in range(event.input):
        ctx.send_event(OutputEvent(output={"k": event.key, "j": j}))


class SyncEmitter(Agent):  # one sync listener: the batch path
    @action(InputEvent)
    @staticmethod
    def emit(event: InputEvent, ctx: RunnerContext) -> None:
        _outputs(event, ctx)


class AsyncEmitter(Agent):  # the per-record path
    @action(InputEvent)
    @staticmethod
    async def emit(event: InputEvent, ctx: RunnerContext) -> None:
        _outputs(event, ctx)


@contextmanager
def running(
    client: LossyClient, store: InMemoryActionStateStore, agent: type[Agent]
) -> Iterator[ActionRunner]:
    """A runner sending outputs through the real sink and producer over ``client``,
    whose reports a poll thread serves as in the worker."""
    producer = AckingProducer({"message.max.bytes": 1_000_000})
    producer._producer = client  # type: ignore[assignment]
    producer._thread = threading.Thread(target=producer._poll_loop, daemon=True)
    producer._thread.start()
    sink = KafkaOutputSink(producer, "out", JsonValueCodec())
    try:
        yield ActionRunner(agent, store, ContextConfig("app", "w", JSON), sink, topic="in")
    finally:
        producer._stop.set()
        producer._thread.join()


async def _round(runner: ActionRunner, records: list[RecordInput], batch: bool) -> list[int]:
    """Runs ``records`` once; the indexes of those that failed."""
    failed: list[int] = []
    if not batch:
        for index, record in enumerate(records):
            try:
                await runner.run(record)
            except Exception:
                failed.append(index)
        return failed

    def report(index: int, outcome: RecordOutcome | Exception) -> None:
        if isinstance(outcome, Exception):
            failed.append(index)

    await run_records(runner, records, report)
    return sorted(failed)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    batch=st.booleans(),
    data=st.data(),
)
def test_replays_of_partly_sent_records_write_each_output_once(
    counts: list[int], batch: bool, data: st.DataObject
) -> None:
    client, store = LossyClient(), InMemoryActionStateStore()
    records = [RecordInput(key=f"k{i}", seq=i, value=n) for i, n in enumerate(counts)]
    outputs = [(f"k{i}", j) for i, n in enumerate(counts) for j in range(n)]
    with running(client, store, SyncEmitter if batch else AsyncEmitter) as runner:
        pending = records
        for _ in range(3):  # replays while the log still loses some outputs
            client.lose = data.draw(st.sets(st.sampled_from(outputs)))
            pending = [pending[i] for i in asyncio.run(_round(runner, pending, batch))]
        client.lose = set()
        assert asyncio.run(_round(runner, pending, batch)) == []
    assert Counter(client.log) == Counter(outputs)  # every output once, none twice
    dones = [e for e in store.entries() if isinstance(e, ActionDone)]
    assert len(dones) == len(records) and all(d.emitted for d in dones)


def test_a_record_whose_outputs_partly_landed_is_marked_with_those_that_did() -> None:
    client, store = LossyClient(), InMemoryActionStateStore()
    client.lose = {("k1", 1)}
    with running(client, store, SyncEmitter) as runner:
        records = [RecordInput(key="k0", seq=0, value=2), RecordInput(key="k1", seq=1, value=3)]
        assert asyncio.run(_round(runner, records, True)) == [1]
        # The marker is noted once the sends settle; the failure is reported on the ack.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            marks = {e.ref.key: e for e in store.entries() if isinstance(e, ActionDone)}
            if marks["k1"].emitted_outputs and marks["k0"].emitted:
                break
            time.sleep(0.001)
    assert (marks["k0"].emitted, marks["k0"].emitted_outputs) == (True, ())
    assert (marks["k1"].emitted, marks["k1"].emitted_outputs) == (False, (0, 2))
