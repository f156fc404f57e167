"""One future for a group of sends (``AckingProducer.send_all``), resolved by the poll
thread's dispatch: after every record of the group is acked, or at its first failure;
the ack hooks (the RocksDB cache) still see each record before the future resolves."""

from __future__ import annotations

from confluent_kafka import KafkaError

from agents_stream.errors import KafkaIOError
from agents_stream.kafka.producer import Ack, AckingProducer


class Recording:
    """Stands in for confluent_kafka.Producer: keeps each record's delivery callback."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def produce(self, topic, value=None, key=None, partition=None, on_delivery=None, **kw):  # type: ignore[no-untyped-def]
        self.callbacks.append((topic, key, value, on_delivery))


class Msg:
    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


def producer() -> tuple[AckingProducer, Recording, list[list[Ack]]]:
    acking = AckingProducer({})
    fake = Recording()
    acking._producer = fake  # type: ignore[assignment]
    hooked: list[list[Ack]] = []
    acking.on_acked("t", lambda acks: hooked.append([a for a in acks]))
    return acking, fake, hooked


def test_the_group_future_resolves_once_every_record_is_acked() -> None:
    acking, fake, hooked = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], partition=0)
    for offset, (topic, _, _, delivered) in enumerate(fake.callbacks[:2]):
        delivered(None, Msg(topic, offset))
    acking._dispatch()
    assert not fut.done() and [a.key for a in hooked[0]] == [b"a", b"b"]
    fake.callbacks[2][3](None, Msg("t", 2))
    acking._dispatch()
    assert fut.done() and fut.exception() is None
    assert [a.value for batch in hooked for a in batch] == [b"1", b"2", b"3"]


def test_the_first_failure_fails_the_group_and_later_acks_are_ignored() -> None:
    acking, fake, _ = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2")])
    fake.callbacks[0][3](KafkaError(KafkaError._MSG_TIMED_OUT), Msg("t", 0))
    acking._dispatch()
    assert isinstance(fut.exception(), KafkaIOError)
    fake.callbacks[1][3](None, Msg("t", 1))
    acking._dispatch()  # no second resolution of the group's future
    assert isinstance(fut.exception(), KafkaIOError)


def test_an_empty_group_is_acked_at_once() -> None:
    acking, _, _ = producer()
    assert acking.send_all("t", []).done()


def test_an_untracked_group_reports_once_and_the_hook_sees_every_record() -> None:
    """Markers and tombstones: only the last record has a delivery report (one GIL
    round trip per group instead of one per record); the cache hook still gets all."""
    acking, fake, hooked = producer()
    fut = acking.send_untracked("t", [(b"a", b"1"), (b"b", None), (b"c", b"3")], 0)
    assert [cb is None for *_, cb in fake.callbacks] == [True, True, False]
    fake.callbacks[2][3](None, Msg("t", 7))
    acking._dispatch()
    assert fut.done() and fut.exception() is None
    assert [(a.key, a.value, a.offset) for a in hooked[0]] == [
        (b"a", b"1", 7),
        (b"b", None, 7),
        (b"c", b"3", 7),
    ]


def test_a_failed_untracked_group_applies_nothing() -> None:
    acking, fake, hooked = producer()
    fut = acking.send_untracked("t", [(b"a", b"1"), (b"b", b"2")], 0)
    fake.callbacks[1][3](KafkaError(KafkaError._MSG_TIMED_OUT), Msg("t", 3))
    acking._dispatch()
    assert isinstance(fut.exception(), KafkaIOError) and hooked == []
