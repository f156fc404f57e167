"""``AckingProducer.serve_on``: delivery reports served by an event loop's thread (as the
worker does) instead of a poll thread, against the real broker.

What must hold: every send is acked and its future resolved; ack hooks still see a
poll's acks before the futures resolve; a blocking ``result()`` on the loop's thread
does not deadlock (nobody else would serve the report it waits for); a send while the
loop idles wakes it; ``close()`` from another thread, as the worker's shutdown calls it,
delivers everything; a poll thread already running hands over."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agents_stream.durable.acks import acked
from agents_stream.kafka.config import producer_config
from agents_stream.kafka.producer import Ack, AckingProducer
from agents_stream.testing.topics import create_topics, read_topic

pytestmark = pytest.mark.broker


def test_a_loop_serves_reports_and_blocking_waits_on_it_do_not_deadlock(broker, topic_factory):
    topic = topic_factory("served")
    create_topics(broker.bootstrap, [topic], partitions=2)
    producer = AckingProducer(producer_config(broker.bootstrap))
    hooked: list[int] = []
    resolved_before_hook: list[bool] = []
    futures = []

    def hook(acks: list[Ack]) -> None:
        hooked.extend(a.offset for a in acks)
        resolved_before_hook.extend(a.future.done() for a in acks)

    producer.on_acked(topic, hook)

    async def main() -> None:
        producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
        for n in range(200):
            futures.append(producer.send(topic, b"%d" % n, key=b"k%d" % (n % 7), partition=n % 2))
        await asyncio.gather(*(acked(f) for f in futures))
        assert threading.current_thread() is producer._server  # no poll thread started
        assert producer._thread is None
        # A blocking wait on the serving thread serves the report itself.
        producer.wait(producer.send(topic, b"blocking", partition=0), timeout=30)
        # Idle (nothing in flight): the loop sleeps until a send kicks it.
        await asyncio.sleep(0.2)
        assert producer._idle
        kicked = producer.send(topic, b"after idle", partition=1)
        assert not producer._idle  # the send woke the serving task
        await acked(kicked)
        # Shutdown as the worker does it: close() on another thread, the loop running.
        last = producer.send(topic, b"last", partition=0)
        await asyncio.get_running_loop().run_in_executor(None, producer.close)
        assert last.done() and last.exception() is None

    asyncio.run(main())
    assert all(f.exception() is None for f in futures)
    assert not any(resolved_before_hook)  # hooks ran first, as with the poll thread
    assert len(read_topic(broker.bootstrap, topic)) == 203


def test_a_running_poll_thread_hands_over_to_the_loop(broker, topic_factory):
    topic = topic_factory("handover")
    create_topics(broker.bootstrap, [topic], partitions=1)
    producer = AckingProducer(producer_config(broker.bootstrap))
    producer.send(topic, b"before", partition=0).result(timeout=30)  # poll thread serves
    poller = producer._thread
    assert poller is not None and poller.is_alive()

    async def main() -> None:
        producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
        assert not poller.is_alive()
        await acked(producer.send(topic, b"after", partition=0))
        await asyncio.get_running_loop().run_in_executor(None, producer.close)

    asyncio.run(main())
    assert [r.value for r in read_topic(broker.bootstrap, topic)] == [b"before", b"after"]


def test_a_long_synchronous_stretch_of_the_loop_serves_due_reports_in_order(broker, topic_factory):
    """A batch starting hundreds of actions holds the loop for milliseconds: ``serve_due``
    between its pieces resolves the acks that came back meanwhile (before, every ack of
    the stretch waited for its end). Never from inside a round: a callback calling it
    must not resolve later acks before the earlier ones being resolved."""
    import time

    topic = topic_factory("due")
    create_topics(broker.bootstrap, [topic], partitions=1)
    producer = AckingProducer(producer_config(broker.bootstrap))
    order: list[int] = []
    nested: list[int] = []

    async def main() -> None:
        producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
        await acked(producer.send(topic, b"warm-up", partition=0))
        futures = []
        for n in range(50):
            fut = producer.send(topic, b"%d" % n, partition=0)

            def noted(_: object, n: int = n) -> None:
                order.append(n)
                before = len(order)
                producer.serve_due()  # from inside a round: must not serve another one
                nested.append(len(order) - before)

            fut.add_done_callback(noted)
            futures.append(fut)
        # The loop never yields here: only serve_due() can resolve anything.
        deadline = time.monotonic() + 30
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.0005)
            producer.serve_due()
        assert all(f.done() for f in futures), "acks waited for the stretch to end"
        await asyncio.get_running_loop().run_in_executor(None, producer.close)

    asyncio.run(main())
    assert order == list(range(50))
    assert set(nested) == {0}
    producer.serve_due()  # closed: a no-op


def test_serve_due_does_nothing_on_a_thread_that_serves_no_reports(broker, topic_factory):
    topic = topic_factory("due-elsewhere")
    create_topics(broker.bootstrap, [topic], partitions=1)
    producer = AckingProducer(producer_config(broker.bootstrap))
    served: list[int] = []
    real = producer._serve_once

    def counted(timeout: float = 0.0) -> int:
        served.append(threading.get_ident())
        return real(timeout)

    producer._serve_once = counted  # type: ignore[method-assign]

    async def main() -> None:
        producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
        fut = producer.send(topic, b"x", partition=0)
        other = threading.Thread(target=producer.serve_due)
        other.start()
        other.join()
        await acked(fut)
        await asyncio.get_running_loop().run_in_executor(None, producer.close)

    asyncio.run(main())
    assert served and set(served) == {threading.get_ident()}
