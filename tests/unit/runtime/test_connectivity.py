"""The connectivity watch (runtime/connectivity.py) on a real producer whose broker never
answers (nothing listens on its address): a write outstanding without an answer stalls
new code blocks, a longer silence suspends every hold; and what a stall does to a code
block about to start (Ownership.admit)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agents_stream.durable.ownership import Ownership, OwnershipLost
from agents_stream.kafka.producer import AckingProducer
from agents_stream.runtime.connectivity import STALL_MIN, ConnectivityWatch
from agents_stream.runtime.group_protocol import choose_group_protocol

TOPIC = "orders"


def _silent_address() -> str:
    """A loopback port nobody listens on: connections are refused, nothing answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def producer():
    p = AckingProducer({"bootstrap.servers": _silent_address(), "log_level": 0})
    yield p
    p.close(timeout=0)


def _tick_for(watch: ConnectivityWatch, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.tick()
        time.sleep(0.01)


def test_nothing_outstanding_is_no_silence(producer):
    own = Ownership(freeze_after=0.3)
    own.acquire(TOPIC, 0)
    watch = ConnectivityWatch(own, producer, lost_after=0.3)
    _tick_for(watch, 0.5)  # the producer was never used
    assert not own.stalled and own.suspended is None and watch.cuts == 0


def test_an_unanswered_write_stalls_then_suspends_every_hold(producer):
    own = Ownership(freeze_after=0.4)
    lease = own.acquire(TOPIC, 0)
    watch = ConnectivityWatch(own, producer, lost_after=0.4)
    producer.send("journal", b"v", key=b"k", partition=0)
    _tick_for(watch, STALL_MIN * 3)
    assert own.stalled and own.suspended is None and own.valid(TOPIC, 0, lease)
    _tick_for(watch, 0.5)
    assert own.suspended is not None and "no answer from the broker" in own.suspended
    assert not own.valid(TOPIC, 0, lease) and watch.cuts == 1
    own.release(TOPIC, 0)  # what the worker does next (after_freeze)
    own.resume()
    _tick_for(watch, 0.5)
    assert watch.cuts == 1  # nothing held: nothing more to suspend while the silence lasts


def test_a_code_block_waits_out_a_stall_and_starts_when_it_ends():
    own = Ownership()
    lease = own.acquire(TOPIC, 0)
    own.stalled = True
    started = threading.Event()
    t = threading.Thread(target=lambda: (own.admit(TOPIC, 0, lease), started.set()))
    t.start()
    assert not started.wait(0.2)
    own.stalled = False
    assert started.wait(2)
    t.join()


def test_a_code_block_waiting_on_a_stall_is_refused_once_the_hold_is_suspended():
    own = Ownership()
    lease = own.acquire(TOPIC, 0)
    own.stalled = True
    refused: list[BaseException] = []

    def start() -> None:
        try:
            own.admit(TOPIC, 0, lease)
        except OwnershipLost as exc:
            refused.append(exc)

    t = threading.Thread(target=start)
    t.start()
    time.sleep(0.1)
    own.suspend("cut off")
    t.join(2)
    assert refused and "cut off" in str(refused[0])


def test_a_coroutine_code_block_waits_on_the_loop_without_blocking_it():
    """Coroutine code blocks start on the event loop's thread, which also serves the acks
    that end a stall: they wait by yielding, and are refused once the hold is gone."""
    import asyncio

    own = Ownership()
    lease = own.acquire(TOPIC, 0)
    own.stalled = True

    async def scenario() -> list[str]:
        seen: list[str] = []
        waiting = asyncio.create_task(own.admit_async(TOPIC, 0, lease))
        for _ in range(5):  # the loop keeps running other work meanwhile
            await asyncio.sleep(0.02)
            seen.append("loop ran")
        assert not waiting.done()
        own.stalled = False
        await asyncio.wait_for(waiting, 2)
        seen.append("started")
        own.stalled = True
        refused = asyncio.create_task(own.admit_async(TOPIC, 0, lease))
        await asyncio.sleep(0.05)
        own.suspend("cut off")
        with pytest.raises(OwnershipLost, match="cut off"):
            await asyncio.wait_for(refused, 2)
        return seen

    assert asyncio.run(scenario()) == ["loop ran"] * 5 + ["started"]


class _Admin:
    """A cluster's answer to DescribeConfigs of a broker (the decision is what is tested;
    the call itself runs on Apache Kafka in tests/fault/test_partition.py)."""

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config

    def broker_config(self) -> dict[str, str]:
        return self.config


CLIENT = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1500}


def test_the_consumer_protocol_takes_the_session_from_the_broker():
    conf = dict(CLIENT, **{"partition.assignment.strategy": "cooperative-sticky"})
    broker = {
        "group.coordinator.rebalance.protocols": "classic,consumer",
        "group.consumer.session.timeout.ms": "45000",
        "group.consumer.heartbeat.interval.ms": "5000",
    }
    chosen = choose_group_protocol(_Admin(broker), "consumer", conf)  # type: ignore[arg-type]
    assert chosen.name == "consumer" and chosen.session_ms == 45000
    assert conf == {"group.protocol": "consumer"}  # librdkafka refuses the others


def test_classic_unless_consumer_is_asked_for():
    # KIP-848 is an opt-in (runtime/group_protocol.py says why), even where supported.
    conf = dict(CLIENT)
    broker = {"group.coordinator.rebalance.protocols": "classic,consumer"}
    chosen = choose_group_protocol(_Admin(broker), None, conf)  # type: ignore[arg-type]
    assert chosen.name == "classic" and chosen.session_ms == 6000 and conf == CLIENT


def test_classic_where_the_cluster_has_no_consumer_protocol():
    conf = dict(CLIENT)
    admin = _Admin({"group.coordinator.rebalance.protocols": "classic"})
    chosen = choose_group_protocol(admin, None, conf)  # type: ignore[arg-type]
    assert chosen.name == "classic" and chosen.session_ms == 6000 and conf == CLIENT
    with pytest.raises(Exception, match="does not support it"):
        choose_group_protocol(admin, "consumer", dict(CLIENT))  # type: ignore[arg-type]
    chosen = choose_group_protocol(_Admin({}), "classic", conf)  # type: ignore[arg-type]
    assert chosen.name == "classic" and conf["group.protocol"] == "classic"
