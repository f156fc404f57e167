"""One future for a group of sends (``AckingProducer.send_all``), resolved by the poll
thread's dispatch once every record of the group is reported: failed if any record
failed; the ack hooks (the RocksDB cache) see the group's records, as one Ack, before
the future resolves."""

from __future__ import annotations

import random
import sys
import threading
import time

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
    def __init__(self, topic: str, offset: int, key: bytes | None = None, value=None) -> None:  # type: ignore[no-untyped-def]
        self._topic, self._offset, self._key, self._value = topic, offset, key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

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


def records_of(batch: list[Ack]) -> list[tuple[bytes | None, bytes | None, int]]:
    """What a hook call applies: (key, value, the Ack's offset) per record."""
    return [
        (k, v, a.offset)
        for a in batch
        for k, v in (a.records if a.records is not None else [(a.key, a.value)])
    ]


def test_the_group_future_resolves_once_every_record_is_acked() -> None:
    acking, fake, hooked = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], partition=0)
    for offset, (topic, _, _, delivered) in enumerate(fake.callbacks[:2]):
        delivered(None, Msg(topic, offset))
    acking._dispatch()
    assert not fut.done() and hooked == []
    fake.callbacks[2][3](None, Msg("t", 2))
    acking._dispatch()
    assert fut.done() and fut.exception() is None
    # One Ack for the group, at its last record's offset (the cache's checkpoint).
    assert [len(batch) for batch in hooked] == [1]
    assert records_of(hooked[0]) == [(b"a", b"1", 2), (b"b", b"2", 2), (b"c", b"3", 2)]


def test_a_failure_fails_the_group_and_what_reached_the_log_is_still_applied() -> None:
    acking, fake, hooked = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], partition=0)
    fake.callbacks[0][3](None, Msg("t", 0))
    fake.callbacks[1][3](KafkaError(KafkaError._MSG_TIMED_OUT), Msg("t", -1, b"b", b"2"))
    acking._dispatch()
    assert not fut.done()  # settled once every record is reported
    fake.callbacks[2][3](None, Msg("t", 1))
    acking._dispatch()
    assert isinstance(fut.exception(), KafkaIOError)
    assert fut.exception().lost == [(b"b", b"2")]  # what a sender may blame
    # a and c are in the log: the cache has them, without moving its checkpoint.
    assert records_of(hooked[0]) == [(b"a", b"1", -1), (b"c", b"3", -1)]


def test_keyed_records_of_a_hooked_topic_are_reported_one_by_one() -> None:
    """Without a partition the records may land anywhere: the hook needs each one's."""
    acking, fake, hooked = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2")])
    fake.callbacks[0][3](None, Msg("t", 5))
    acking._dispatch()
    assert not fut.done() and records_of(hooked[0]) == [(b"a", b"1", 5)]
    fake.callbacks[1][3](None, Msg("t", 9))
    acking._dispatch()
    assert fut.done() and fut.exception() is None


def test_the_first_failure_fails_a_keyed_group_and_later_acks_are_ignored() -> None:
    acking, fake, _ = producer()
    fut = acking.send_all("t", [(b"a", b"1"), (b"b", b"2")])
    fake.callbacks[0][3](KafkaError(KafkaError._MSG_TIMED_OUT), Msg("t", 0))
    acking._dispatch()
    assert isinstance(fut.exception(), KafkaIOError)
    fake.callbacks[1][3](None, Msg("t", 1))
    acking._dispatch()  # no second resolution of the group's future
    assert isinstance(fut.exception(), KafkaIOError)


def test_reports_from_two_threads_settle_each_group_exactly_once() -> None:
    """A sender whose queue is full polls too, so reports of one group may arrive on
    two threads at once: every group must get exactly one Ack, carrying its failure."""
    acking, fake, hooked = producer()
    futures = [
        acking.send_all("t", [(bytes([g, i]), b"v") for i in range(8)], partition=0)
        for g in range(200)
    ]
    reports = list(fake.callbacks)
    random.Random(7).shuffle(reports)
    failing = {bytes([g, 3]) for g in range(0, 200, 5)}  # every fifth group loses one

    def deliver(part: list) -> None:  # type: ignore[type-arg]
        for topic, key, value, delivered in part:
            if key in failing:
                delivered(KafkaError(KafkaError._MSG_TIMED_OUT), Msg(topic, -1, key, value))
            else:
                delivered(None, Msg(topic, 1))

    threads = [threading.Thread(target=deliver, args=(reports[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acking._dispatch()
    for g, fut in enumerate(futures):
        assert fut.done()
        assert (fut.exception() is not None) == (g % 5 == 0)
    applied = records_of([a for batch in hooked for a in batch])
    assert len(applied) == 200 * 8 - len(failing)


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
    assert records_of(hooked[0]) == [(b"a", b"1", 7), (b"b", None, 7), (b"c", b"3", 7)]


def test_a_failed_untracked_group_applies_nothing() -> None:
    acking, fake, hooked = producer()
    fut = acking.send_untracked("t", [(b"a", b"1"), (b"b", b"2")], 0)
    fake.callbacks[1][3](KafkaError(KafkaError._MSG_TIMED_OUT), Msg("t", 3))
    acking._dispatch()
    assert isinstance(fut.exception(), KafkaIOError) and hooked == []


def test_groups_sent_from_two_threads_stay_contiguous() -> None:
    """A group reaches the cache with its last report, so no later record of its
    partition may be reported first: a hooked topic's groups are produced whole, one
    at a time, whatever thread sends them (the loop sends ActionDones while the poll
    thread sends emitted markers and the Kafka thread pruning tombstones)."""
    acking, fake, _ = producer()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:

        def send(tag: int) -> None:
            for g in range(20):
                records = [(bytes([tag, g, i]), b"v") for i in range(200)]
                if g % 2:
                    acking.send_untracked("t", records, 0)
                else:
                    acking.send_all("t", records, partition=0)

        threads = [threading.Thread(target=send, args=(tag,)) for tag in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    groups = [key[:2] for _, key, _, _ in fake.callbacks]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(runs)) == 60  # each group in one piece


def test_a_group_with_a_record_over_message_max_bytes_is_refused_before_any_is_produced() -> None:
    """The client refuses an oversized record in ``produce()``; midway through a group
    that left its first records in flight under a group that never completes."""
    import pytest

    from agents_stream.errors import RecordRefusedError

    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": 1000})
    recording = Recording()
    producer._producer = recording  # type: ignore[assignment]
    with pytest.raises(RecordRefusedError) as refused:
        producer.send_all("t", [(b"a", b"x" * 10), (b"b", b"x" * 2000)], partition=0)
    assert refused.value.code == KafkaError.MSG_SIZE_TOO_LARGE
    assert "message.max.bytes (1000)" in str(refused.value)
    assert recording.callbacks == []
    producer.send_all("t", [(b"a", b"x" * 10), (b"b", None)], partition=0)
    assert len(recording.callbacks) == 2


class QueueFull:
    """Stands in for confluent_kafka.Producer: the first produces find the local queue
    full; notes which threads serve delivery reports (poll/flush)."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.servers: set[str] = set()
        self.produced = 0

    def produce(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.produced += 1

    def poll(self, timeout: float) -> int:
        self.servers.add(threading.current_thread().name)
        time.sleep(0.001)
        return 0

    def flush(self, timeout: float) -> int:
        self.servers.add(threading.current_thread().name)
        return 0

    def __len__(self) -> int:
        return 0


def test_only_the_poll_thread_serves_delivery_reports_while_it_runs() -> None:
    """A sender whose queue is full waits for the poll thread instead of polling, and
    flush/close wait for its rounds: a group completed on another thread while the poll
    thread dispatched a later group of the same partition moved the cache checkpoint
    past the first group's records."""
    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:9"})
    fake = QueueFull(full=3)
    producer._producer = fake  # type: ignore[assignment]
    producer._thread = threading.Thread(
        target=producer._poll_loop, name="agents-stream-producer", daemon=True
    )
    producer._thread.start()
    producer.send("t", b"v", key=b"k", partition=0)
    producer.send_all("t", [(b"a", b"1"), (b"b", b"2")], partition=0)
    assert fake.produced == 3
    assert producer.flush(5) == 0
    producer.close(5)
    assert fake.servers == {"agents-stream-producer"}


def test_an_output_group_with_an_oversized_record_sends_none_of_it() -> None:
    """Outputs of a batch's records go as one group (no partition: keyed): one output
    over message.max.bytes refuses the group before any output is produced, so the
    records dead-lettered for it have sent nothing (a replay sends each output once)."""
    import pytest

    from agents_stream.errors import RecordRefusedError

    producer = AckingProducer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": 100})
    recording = Recording()
    producer._producer = recording  # type: ignore[assignment]
    producer.on_acked("hooked", lambda acks: None)
    for topic in ("out", "hooked"):
        with pytest.raises(RecordRefusedError):
            producer.send_all(topic, [(b"a", b"1"), (b"b", b"x" * 200), (b"c", b"2")])
    assert recording.callbacks == []


def test_a_delivery_without_an_offset_is_acked_at_offset_minus_one() -> None:
    """A record the broker acked without saying where (a retried batch acked as a
    duplicate after a leader change: confluent-kafka's offset() is None) is durable:
    its group resolves and the hook sees it at -1, which moves no checkpoint. Before,
    the store's hook took the max of None and an offset, failed, and every record of the
    poll failed with "ack hook failed" (three dead letters on the cluster test)."""
    acking, fake, _ = producer()
    offsets: list[int] = []
    acking.on_acked("t", lambda acks: offsets.append(max(a.offset for a in acks) + 1))
    group = acking.send_all("t", [(b"a", b"1"), (b"b", b"2")], partition=0)
    single = acking.send("t", b"3", key=b"c", partition=0)
    for topic, key, value, delivered in fake.callbacks:
        if delivered is not None:
            delivered(None, Msg(topic, None, key, value))  # type: ignore[arg-type]
    acking._dispatch()
    assert group.exception() is None and single.exception() is None
    assert offsets == [0]
