"""KafkaOutputSink.send_batch: the outputs of many input records sent together. When
some do not reach the log, the failure names exactly the input records with an output
missing (``PartialSendError.failed``); the others' outputs are all durable. Refused
outputs are sent again record by record (the broker refuses a whole batch for one
output too large). Reference model: a too-large output is refused every time; a record
fails iff one of its own outputs never reached the log."""

from __future__ import annotations

from collections import Counter
from typing import Any

from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.durable.sink import SinkItem
from agents_stream.errors import PartialSendError, RecordRefusedError
from agents_stream.host.sink import KafkaOutputSink
from agents_stream.kafka.producer import AckingProducer
from agents_stream.serde.values import JsonValueCodec


class Recording:
    """Stands in for confluent_kafka.Producer: keeps each record's delivery callback."""

    def __init__(self) -> None:
        self.produced: list[tuple[bytes, bytes, Any]] = []

    def produce(self, topic, value=None, key=None, partition=None, on_delivery=None, **kw):  # type: ignore[no-untyped-def]
        self.produced.append((key, value, on_delivery))


class Msg:
    def __init__(self, key: bytes, value: bytes, offset: int) -> None:
        self._key, self._value, self._offset = key, value, offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "out"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


def sink(max_bytes: int = 1_000_000) -> tuple[KafkaOutputSink, AckingProducer, Recording]:
    acking = AckingProducer({"message.max.bytes": max_bytes})
    fake = Recording()
    acking._producer = fake  # type: ignore[assignment]
    return KafkaOutputSink(acking, "out", JsonValueCodec()), acking, fake


# Outputs per input record: small values, repeated ones included (two outputs of one
# record, or of two records of different keys, may be equal).
batches = st.lists(
    st.lists(st.sampled_from(["a", "b", 1, [2]]), min_size=1, max_size=3), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(batches, st.data())
def test_a_failure_names_exactly_the_records_with_an_output_missing(
    outputs: list[list[Any]], data: st.DataObject
) -> None:
    send, acking, fake = sink()
    fut = send.send_batch(
        [SinkItem(f"k{i}", values, 0, None, None) for i, values in enumerate(outputs)]
    )
    owners = [i for i, values in enumerate(outputs) for _ in values]
    assert len(fake.produced) == len(owners)
    lost = data.draw(st.sets(st.integers(0, len(owners) - 1)))
    # The broker refuses a too-large output every time; the sink sends the refused
    # records' outputs again one record at a time (a refusal may be a neighbour's in the
    # same batch), and only those refused again fail.
    too_big = {fake.produced[n][:2] for n in lost}
    ok: Counter[tuple[bytes, bytes]] = Counter()  # (key, value) in the log, by count
    for n, (key, value, delivered) in enumerate(fake.produced):
        if n in lost:
            delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Msg(key, value, -1))
        else:
            ok[(key, value)] += 1
            delivered(None, Msg(key, value, n))
    seen = len(fake.produced)
    acking._dispatch()  # a retry is sent from the callback of the failure it follows
    while not fut.done():
        retried = fake.produced[seen:]
        assert retried, "a retry is pending but nothing was sent"
        seen = len(fake.produced)
        for key, value, delivered in retried:
            if (key, value) in too_big:
                delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Msg(key, value, -1))
            else:
                ok[(key, value)] += 1
                delivered(None, Msg(key, value, seen))
        acking._dispatch()
    # Reference model: a record fails iff one of its outputs never reached the log.
    wanted = [
        Counter(
            (f"k{p}".encode(), v)
            for v in (e[1] for e in fake.produced[: len(owners)] if e[0] == f"k{p}".encode())
        )
        for p in range(len(outputs))
    ]
    failing = {p for p, mine in enumerate(wanted) if mine - ok}
    if not failing:
        assert fut.exception() is None
        return
    exc = fut.exception()
    assert isinstance(exc, PartialSendError)
    assert set(exc.failed) == failing
    assert all(isinstance(e, RecordRefusedError) for e in exc.failed.values())
    # ``landed``: which of a failed record's outputs are in the log (equal values are
    # interchangeable): a replay sends exactly the others.
    for position in exc.failed:
        values = [v for k, v, _ in fake.produced[: len(owners)] if k == f"k{position}".encode()]
        landed = exc.landed.get(position, ())
        in_log = wanted[position] & ok
        assert sorted(values[i] for i in landed) == sorted(v for _, v in in_log.elements())


def test_a_record_refused_before_sending_fails_alone_and_the_others_are_sent() -> None:
    """One output over message.max.bytes: the client would refuse the whole group before
    producing any of it; each record's outputs go out on their own instead, in order."""
    send, acking, fake = sink(max_bytes=100)
    fut = send.send_batch(
        [
            SinkItem("k0", ["a"], 0, None, None),
            SinkItem("k1", ["x" * 200, "b"], 0, None, None),
            SinkItem("k2", ["c"], 0, None, None),
        ]
    )
    assert [(k, v) for k, v, _ in fake.produced] == [(b"k0", b'"a"'), (b"k2", b'"c"')]
    for n, (key, value, delivered) in enumerate(fake.produced):
        delivered(None, Msg(key, value, n))
    acking._dispatch()
    exc = fut.exception()
    assert isinstance(exc, PartialSendError) and set(exc.failed) == {1}
    assert isinstance(exc.failed[1], RecordRefusedError) and exc.landed == {}
    assert "message.max.bytes" in str(exc.failed[1])


def test_a_batch_sent_whole_resolves_once_every_output_is_acked() -> None:
    send, acking, fake = sink()
    fut = send.send_batch(
        [SinkItem("k0", ["a", "b"], 0, None, None), SinkItem("k1", ["c"], 0, None, None)]
    )
    for n, (key, value, delivered) in enumerate(fake.produced[:2]):
        delivered(None, Msg(key, value, n))
    acking._dispatch()
    assert not fut.done()
    key, value, delivered = fake.produced[2]
    delivered(None, Msg(key, value, 2))
    acking._dispatch()
    assert fut.done() and fut.exception() is None


def test_a_failure_that_names_no_records_fails_them_all_with_its_own_error() -> None:
    from concurrent.futures import Future

    from agents_stream.errors import KafkaIOError
    from agents_stream.host.sink import _blamed

    sent: Future[None] = Future()
    blamed = _blamed(sent, [(b"k0", [b"1"]), (b"k1", [b"2"])])
    error = KafkaIOError("broker unreachable")  # lost: unknown
    sent.set_exception(error)
    assert blamed.exception() is error


def test_one_records_send_names_its_outputs_that_landed() -> None:
    send, acking, fake = sink()
    fut = send.send("k0", ["a", "b", "c"], 0)
    for n, (key, value, delivered) in enumerate(fake.produced):
        if n == 1:
            delivered(KafkaError(KafkaError._MSG_TIMED_OUT), Msg(key, value, -1))
        else:
            delivered(None, Msg(key, value, n))
    acking._dispatch()
    exc = fut.exception()
    assert isinstance(exc, PartialSendError)
    assert exc.landed == {0: (0, 2)} and type(exc.failed[0]).__name__ == "KafkaIOError"
