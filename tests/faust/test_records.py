"""The Faust host's record policy without a broker: FaustRecordHandler on the in-memory
store with fake Faust events, and a DurableAgent inside Faust's own ``test_context``."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner
from agents_stream.durable.sink import Sink
from agents_stream.state.memory import InMemoryActionStateStore

faust = pytest.importorskip("faust")

from agents_stream.durable.values import encode_value  # noqa: E402
from agents_stream.faust import FaustRecordHandler, durable_agent, record_input, record_key  # noqa: E402
from agents_stream.host.registry_wait import RegistryWait  # noqa: E402
from agents_stream.serde.errors import SchemaRefused  # noqa: E402

EFFECTS: list[str] = []
FAIL_AFTER_FIRST: set[int] = set()


def charge(call_id: str, n: int) -> str:
    EFFECTS.append(call_id)
    return f"charged-{n}"


class Payments(Agent):
    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        if event.input.get("bad"):
            raise ValueError(f"bad {n}")
        receipt = ctx.execute(charge, n)
        if n in FAIL_AFTER_FIRST:
            FAIL_AFTER_FIRST.discard(n)
            raise ConnectionError("crash after the first call")
        ctx.short_term_memory.set("count", ctx.short_term_memory.get("count", 0) + 1)
        ctx.send_event(OutputEvent(output={"n": n, "receipt": receipt}))


@dataclass
class FakeMessage:
    topic: str = "orders"
    partition: int = 0
    offset: int = 0
    timestamp: float | None = 1700000000.5
    key: bytes | None = b"k"
    value: bytes | None = b"{}"
    headers: Any = field(default_factory=list)


class FakeEvent:
    def __init__(
        self,
        value: Any,
        *,
        key: Any = b"k",
        offset: int = 0,
        partition: int = 0,
        on_ack: Any = None,
    ) -> None:
        self.key = key
        self.value = value
        self.message = FakeMessage(partition=partition, offset=offset, key=key)
        self.acked = False
        self._on_ack = on_ack

    def ack(self) -> bool:
        if self._on_ack is not None:
            self._on_ack()
        self.acked = True
        return True


class ListSink(Sink):
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any]]] = []

    def send(self, key: str, values: Any, partition: int, *a: Any, **kw: Any) -> Future[None]:
        self.sent.append((key, list(values)))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


class ListDeadLetters:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str]] = []

    def send(self, msg: Any, stage: str, exc: BaseException) -> Future[None]:
        self.sent.append((msg.topic(), msg.offset(), stage))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


class Host:
    def __init__(self, on_error: Any = "dlq") -> None:
        EFFECTS.clear()
        self.store = InMemoryActionStateStore()
        self.sink = ListSink()
        self.dlq = ListDeadLetters()
        self.crashes: list[BaseException] = []
        self.owned = {0}
        self.on_error = on_error
        self.handler = self.new_handler()

    def new_handler(self) -> FaustRecordHandler:
        """A fresh host process on the same (durable) store."""
        runner = ActionRunner(Payments, self.store, ContextConfig("pay", "w1", JSON), self.sink)

        async def crash(exc: BaseException) -> None:
            self.crashes.append(exc)

        return FaustRecordHandler(
            runner,
            dead_letters=self.dlq,
            on_error=self.on_error,
            crash=crash,
            owns=self.owned.__contains__,
        )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_event_is_acked_only_after_outputs_are_durable():
    host = Host()
    event = FakeEvent({"n": 1}, on_ack=lambda: order.append("ack"))
    order: list[str] = []
    real_send = host.sink.send

    def send(key: str, values: Any, partition: int, *a: Any, **kw: Any) -> Future[None]:
        order.append("output")
        return real_send(key, values, partition)

    host.sink.send = send  # type: ignore[method-assign]
    assert run(host.handler.handle(event)) is True
    assert order == ["output", "ack"]
    assert host.sink.sent == [("k", [{"n": 1, "receipt": "charged-1"}])]


def test_unacked_record_re_run_replays_its_journaled_call():
    host = Host(on_error="fail")
    FAIL_AFTER_FIRST.add(7)
    first = FakeEvent({"n": 7}, offset=3)
    assert run(host.handler.handle(first)) is False  # raised after the call: not acked
    assert not first.acked and len(host.crashes) == 1
    handler = host.new_handler()  # "restart": same journal, record re-consumed
    again = FakeEvent({"n": 7}, offset=3)
    assert run(handler.handle(again)) is True
    assert len(EFFECTS) == 1  # executed once, replayed once
    assert handler.stats["calls_replayed"] == 1 and handler.stats["calls_executed"] == 0


def test_completed_record_re_consumed_is_skipped_without_second_output():
    host = Host()
    run(host.handler.handle(FakeEvent({"n": 2}, offset=5)))
    handler = host.new_handler()
    assert run(handler.handle(FakeEvent({"n": 2}, offset=5))) is True
    assert handler.stats["actions_skipped"] == 1
    assert len(EFFECTS) == 1 and len(host.sink.sent) == 1
    assert host.store.memory("k", 0).values == {"count": encode_value(1)}


def test_failing_action_is_dead_lettered_then_acked():
    host = Host()
    event = FakeEvent({"n": 1, "bad": True}, offset=9)
    assert run(host.handler.handle(event)) is True
    assert event.acked and host.dlq.sent == [("orders", 9, "action")]
    assert host.crashes == []


def test_on_error_fail_crashes_and_acks_nothing_after():
    host = Host(on_error="fail")
    bad, later = FakeEvent({"n": 1, "bad": True}, offset=0), FakeEvent({"n": 2}, offset=1)
    assert run(host.handler.handle(bad)) is False
    assert run(host.handler.handle(later)) is False
    assert not bad.acked and not later.acked
    assert host.dlq.sent == [] and EFFECTS == []  # the later record did not even run
    assert [type(e) for e in host.crashes] == [ValueError]


def test_record_of_a_revoked_partition_is_abandoned_unacked():
    host = Host()
    host.owned.clear()  # revoked while it ran: the store raises for it
    host.store.done = lambda ref: (_ for _ in ()).throw(KeyError("not assigned"))  # type: ignore[method-assign]
    event = FakeEvent({"n": 1})
    assert run(host.handler.handle(event)) is False
    assert not event.acked and host.dlq.sent == [] and host.crashes == []
    assert host.handler.stats["abandoned"] == 1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"user-1", "user-1"), ("user-2", "user-2"), (None, ""), (b"\xffx", "\\xffx"), (42, "42")],
)
def test_record_key(raw, expected):
    assert record_key(raw) == expected


def test_record_input_maps_offset_partition_timestamp_headers():
    event = FakeEvent({"n": 1}, offset=11, partition=1)
    event.message.headers = [("trace", b"t1"), ("none", None), ("s", "v")]
    record = record_input(event)
    assert (record.seq, record.partition, record.timestamp) == (11, 1, 1700000000500)
    assert record.headers == {"trace": b"t1", "s": b"v"}
    assert record.value == {"n": 1} and record.key == "k" and not record.keyless


def test_a_record_without_key_is_keyless_as_in_the_worker():
    """No shared memory or ordering between keyless records (KeylessRecordError on
    memory), whichever host runs them."""
    record = record_input(FakeEvent({"n": 1}, key=None))
    assert record.key == "" and record.keyless


def test_durable_agent_inside_faust_test_context(tmp_path):
    EFFECTS.clear()
    app = faust.App(
        "unit-faust", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path)
    )
    topic = app.topic("orders", value_serializer="json")
    sink = ListSink()
    store = InMemoryActionStateStore()
    durable = durable_agent(app, Payments, topic=topic, app_id="pay", store=store, sink=sink)

    async def main() -> None:
        async with durable.faust_agent.test_context() as agent:
            await agent.put({"n": 1}, key=b"c-1")
            await agent.put({"n": 2}, key=b"c-1")
            # put() returns once the stream took the value; wait for its actions.
            for _ in range(200):
                if durable.stats.get("records") == 2:
                    break
                await asyncio.sleep(0.01)

    run(main())
    assert sink.sent == [
        ("c-1", [{"n": 1, "receipt": "charged-1"}]),
        ("c-1", [{"n": 2, "receipt": "charged-2"}]),
    ]
    assert store.memory("c-1", 0).values == {"count": encode_value(2)}
    assert durable.stats["records"] == 2


def test_events_below_the_completed_through_marker_are_acked_without_running():
    """Guarantee 8: re-delivered after a group offset reset, a pruned (journal-less) event
    below the partition's marker is acked, never run or output again."""
    host = Host()
    host.handler.progress.through[(host.handler.runner.topic, 0)] = 10  # loaded on assignment
    below = FakeEvent({"n": 4}, offset=9)
    assert run(host.handler.handle(below)) is True
    assert below.acked and EFFECTS == [] and host.sink.sent == []
    assert host.handler.stats["skipped_completed"] == 1
    at = FakeEvent({"n": 4}, offset=10)
    assert run(host.handler.handle(at)) is True
    assert len(EFFECTS) == 1


def replay_of(
    original: int, *, offset: int, partition: int = 0, topic: str = "orders"
) -> FakeEvent:
    """The dead letter of ``original`` produced back to its input by ``dlq replay``."""
    event = FakeEvent({"n": 1}, offset=offset, partition=partition)
    event.message.headers = [("x-replay-of", f"{topic}/{partition}/{original}".encode())]
    return event


def test_replayed_dead_letter_runs_under_its_original_offset():
    host = Host()
    FAIL_AFTER_FIRST.add(1)  # the charge is journaled, then the action raises
    first = FakeEvent({"n": 1}, offset=9)
    assert run(host.handler.handle(first)) is True
    assert host.dlq.sent == [("orders", 9, "action")] and len(EFFECTS) == 1
    replay = replay_of(9, offset=20)
    assert record_input(replay).seq == 9
    assert run(host.handler.handle(replay)) is True
    assert replay.acked
    assert len(EFFECTS) == 1  # the journaled charge was replayed, not executed again
    assert host.handler.stats["calls_replayed"] == 1
    assert host.sink.sent == [("k", [{"n": 1, "receipt": "charged-1"}])]
    # Neither journal may be pruned: the dead letter's nor the replay's.
    assert host.handler.kept.release(0, 9) and host.handler.kept.release(0, 20)
    assert not host.handler.kept.release(0, 20)  # asked once


def test_replay_above_the_completed_through_marker_is_not_skipped():
    host = Host()
    host.handler.progress.through[(host.handler.runner.topic, 0)] = 15  # 9 is below it
    assert run(host.handler.handle(replay_of(9, offset=20))) is True
    assert host.handler.stats["records"] == 1 and len(EFFECTS) == 1


@pytest.mark.parametrize(
    ("topic", "partition"), [("payments", 0), ("orders", 1)], ids=["other-topic", "other-partition"]
)
def test_foreign_replay_header_runs_as_a_new_record(topic, partition, caplog):
    event = replay_of(9, offset=20, topic=topic)
    event.message.headers = [("x-replay-of", f"{topic}/{partition}/9".encode())]
    with caplog.at_level(logging.WARNING, logger="agents_stream.faust"):
        assert record_input(event).seq == 20
    assert "ignoring x-replay-of" in caplog.text


REFUSALS = {"left": 0}


class RefusedTwice(Agent):
    """Its journal write refused by the schema registry twice (as a rule changed under a
    running app would), after a call that was journaled."""

    @action(InputEvent)
    @staticmethod
    async def process(event: InputEvent, ctx: RunnerContext) -> None:
        receipt = ctx.execute(charge, event.input["n"])
        if REFUSALS["left"]:
            REFUSALS["left"] -= 1
            raise SchemaRefused(
                "schema registry refused ActionState v6 under subject 'pay-action-state-value'",
                subject="pay-action-state-value",
                version="ActionState v6",
                reason="incompatible (HTTP 409)",
            )
        ctx.send_event(OutputEvent(output={"n": event.input["n"], "receipt": receipt}))


def test_a_registry_refusal_mid_run_waits_and_runs_again_without_a_dead_letter(caplog):
    host = Host()
    runner = ActionRunner(RefusedTwice, host.store, ContextConfig("pay", "w1", JSON), host.sink)
    stats: dict[str, int] = {}

    async def crash(exc: BaseException) -> None:
        host.crashes.append(exc)

    handler = FaustRecordHandler(
        runner,
        dead_letters=host.dlq,
        on_error="dlq",
        crash=crash,
        owns=host.owned.__contains__,
        registry_wait=RegistryWait(stats, first=0.01),
    )
    REFUSALS["left"] = 2
    event = FakeEvent({"n": 5})
    caplog.set_level(logging.INFO, logger="agents_stream")
    assert run(handler.handle(event)) is True and event.acked
    assert host.dlq.sent == [] and host.crashes == []
    assert len(EFFECTS) == 1  # the journaled call was replayed by each run, not repeated
    assert [v for _, values in host.sink.sent for v in values] == [{"n": 5, "receipt": "charged-5"}]
    assert stats["registry_retries"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused ActionState v6" in warnings[0], warnings
    assert "orders[0] paused" in warnings[0], warnings
