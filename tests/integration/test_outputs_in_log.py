"""Outputs already in the output topic are not sent again (guarantee 4).

A worker that dies after an action's outputs were acked but before its emitted marker
was leaves an ActionDone not marked emitted. The test writes exactly that state before
any worker runs: for each input, the ActionDone the dead worker journaled and the
outputs it got into the output topic (each with its identity header), then starts a
worker on today's code and counts the outputs.

- ``all``: both outputs landed: nothing is sent again;
- ``part``: the first of two landed: only the second is sent;
- ``none``: none landed: it is sent once;
- ``old``: it landed when the action finished, two hours ago, longer ago than
  ``output_scan_window``: found by a read of the output topic around that time, not
  sent again (before the nineteenth round it was sent again);
- ``late``: an action of two hours ago whose output a recovery sent again just now: the
  read around its finish does not reach it, and it is sent once more (documented);
- ``fresh``: no journal: the action runs, its output is sent once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import pytest
from confluent_kafka import Producer

from agents_stream.durable.journal import ActionDone, ActionRef
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde.journal import default_journal_codec
from agents_stream.testing.topics import create_topics, produce, read_topic, wait_for_records

pytestmark = pytest.mark.broker

APP = "tests.apps.outputs_app:app"
ACTION = "Emitter.emit#0"
# input -> (outputs the action emitted, how many reached the output topic, finished ago s)
SCENARIOS = {
    "old": (1, 1, 7200),  # first: a real topic holds its output before the later ones
    "all": (2, 2, 5),
    "part": (2, 1, 5),
    "none": (1, 0, 5),
    "late": (1, 1, 7200),
}
# when each landed output was produced, if not as its action finished
SENT_NOW = {"late"}


def output(key: str, j: int) -> bytes:
    return json.dumps({"k": key, "j": j}, separators=(",", ":")).encode()


def test_outputs_found_in_the_output_topic_are_not_sent_again(
    broker, topic_factory, worker_factory
):
    app_id, source, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    create_topics(broker.bootstrap, [source, out], partitions=1)
    TopicAdmin(broker.bootstrap).ensure([compacted(f"{app_id}-action-state", 1)])
    produce(broker.bootstrap, source, [(k, {"n": n}) for k, (n, _, _) in SCENARIOS.items()])
    produce(broker.bootstrap, source, [("fresh", {"n": 1})])
    offsets = {r.key: r.offset for r in read_topic(broker.bootstrap, source)}

    codec = default_journal_codec()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    now_ms = int(time.time() * 1000)
    for key, (emitted, landed, ago) in SCENARIOS.items():
        ref = ActionRef(key, offsets[key], ACTION, 0, source)
        outputs = tuple(output(key, j) for j in range(emitted))
        done = ActionDone(ref, outputs=outputs, finished_ms=now_ms - ago * 1000, emitted=False)
        producer.produce(
            f"{app_id}-action-state", codec.encode(done), entry_key_bytes(done), partition=0
        )
        for j in range(landed):  # what the dead worker got into the output topic
            identity = f"{app_id}/{source}/0/{offsets[key]}/{ACTION}/{done.finished_ms}/{j}"
            stamp = now_ms if key in SENT_NOW else done.finished_ms + 20
            producer.produce(
                out,
                outputs[j],
                key.encode(),
                headers=[("x-agents-stream-output", identity)],
                timestamp=stamp,
            )
        assert producer.flush(30) == 0  # in this order in the topic

    worker = worker_factory(APP, {"AS_APP_ID": app_id, "AS_INPUT": source, "AS_OUTPUT": out})
    expected = Counter(
        {("all", 0): 1, ("all", 1): 1, ("part", 0): 1, ("part", 1): 1, ("none", 0): 1}
    )
    expected.update({("old", 0): 1, ("late", 0): 2, ("fresh", 0): 1})
    wait_for_records(broker.bootstrap, out, sum(expected.values()), timeout=60)
    time.sleep(3)  # anything sent twice would follow within this
    records = read_topic(broker.bootstrap, out)
    seen = Counter((r.json()["k"], r.json()["j"]) for r in records)
    assert seen == expected, worker.log()
    # Every output the worker sent names its action run, when it finished, and its index.
    [fresh] = [r for r in records if r.json()["k"] == "fresh"]
    head, _, tail = fresh.headers["x-agents-stream-output"].decode().rpartition("/")
    run, _, finished = head.rpartition("/")
    assert (run, tail) == (f"{app_id}/{source}/0/{offsets['fresh']}/{ACTION}", "0")
    assert abs(int(finished) - time.time() * 1000) < 120_000
    assert worker.terminate() == 0, worker.log()
    # all 2 + part 1 + old 1 found; part 1 + none 1 + late 1 sent (the stop line's counters)
    assert "outputs_found=4" in worker.log() and "outputs_resent=3" in worker.log()


def test_output_log_reads_again_only_when_it_may_have_missed_something(broker, topic_factory):
    """OutputLog against the broker: a question reads the output topic once; later ones
    read nothing until partitions are assigned (mark_stale), another input partition is
    asked about, or the question reaches further back in time."""
    from agents_stream.host.output_log import OutputLog

    out = topic_factory("out")
    create_topics(broker.bootstrap, [out], partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})

    def sent(done: ActionDone, j: int, stamp: int = 0, topic: str = out) -> None:
        ref = done.ref
        identity = f"app/{ref.topic}/{ref.partition}/{ref.seq}/{ref.action}/{done.finished_ms}/{j}"
        producer.produce(
            topic,
            b"{}",
            ref.key.encode(),
            headers=[("x-agents-stream-output", identity)],
            timestamp=stamp,
        )
        assert producer.flush(10) == 0

    now = int(time.time() * 1000)
    a = ActionDone(ActionRef("k", 5, ACTION, 0, "in"), finished_ms=now)
    b = ActionDone(ActionRef("k2", 9, ACTION, 1, "in"), finished_ms=now)
    found = OutputLog(broker.bootstrap, out, "app", window_s=600)
    try:
        sent(a, 0)
        assert found.landed(a, [0, 1]) == [0]
        sent(a, 1)
        assert found.landed(a, [0, 1]) == [0]  # nothing assigned since: not read
        found.mark_stale()
        assert found.landed(a, [0, 1]) == [0, 1]
        sent(b, 0)
        assert found.landed(b, [0]) == [0]  # another input partition: read again
        # the same input record run again later (a recreated topic reusing the offset)
        assert found.landed(dataclasses.replace(a, finished_ms=now + 1), [0, 1]) == []
        old = dataclasses.replace(a, finished_ms=now - 700_000)
        assert found.landed(old, [0, 1]) == []  # its outputs are not there

        other = OutputLog(broker.bootstrap, out, "other-app", window_s=600)
        assert other.landed(a, [0, 1]) == []  # another app's identities differ
        other.close()
    finally:
        found.close()

    # Older than the window: looked up around when it finished (its outputs were stamped
    # then, ahead of later ones in the partition), not from then to the end.
    old_out = topic_factory("old-out")
    create_topics(broker.bootstrap, [old_out], partitions=1)
    old = ActionDone(ActionRef("k", 6, ACTION, 0, "in"), finished_ms=now - 7_200_000)
    sent(old, 1, stamp=old.finished_ms + 5, topic=old_out)
    sent(b, 0, topic=old_out)  # stamped now: past the read's range
    aged = OutputLog(broker.bootstrap, old_out, "app", window_s=600)
    unbounded = OutputLog(broker.bootstrap, old_out, "app", window_s=600, delivery_timeout=None)
    try:
        assert aged.landed(old, [0, 1]) == [1]
        assert unbounded.landed(old, [0, 1]) == []  # no delivery timeout: no bound, no read
    finally:
        aged.close()
        unbounded.close()


@pytest.mark.kafka_only
def test_the_lookup_ends_while_exactly_once_writers_keep_a_transaction_open(broker, topic_factory):
    """Read ``read_committed``, an output partition's end is its last stable offset,
    which stays below the high watermark while a transaction is open there. Exactly-once
    workers always have one open; a lookup that chased the moving high watermark never
    ended, and after its timeout the outputs were sent again (2 duplicates in
    tests/fault/test_group_changes.py). Two transactional producers here keep a
    transaction open on the partition at every moment while the lookup runs: it ends,
    and finds the committed output."""
    import threading

    from agents_stream.host.output_log import OutputLog

    out = topic_factory("txn-out")
    create_topics(broker.bootstrap, [out], partitions=1)
    now = int(time.time() * 1000)
    done = ActionDone(ActionRef("k", 5, ACTION, 0, "in"), finished_ms=now)
    identity = f"app/in/0/5/{ACTION}/{now}/0"
    plain = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    plain.produce(out, b"{}", b"k", headers=[("x-agents-stream-output", identity)])
    assert plain.flush(10) == 0

    stop = threading.Event()
    settings = {"bootstrap.servers": broker.bootstrap, "log_level": 3}
    writers = [Producer({**settings, "transactional.id": f"{out}-{n}"}) for n in range(2)]
    for writer in writers:
        writer.init_transactions(30)
    opened = threading.Barrier(2)

    def keep_open(writer: Producer, first: bool) -> None:
        # Each one's transaction spans the moment the other commits: overlapping.
        opened.wait(10)
        if not first:
            time.sleep(0.15)
        while not stop.is_set():
            writer.begin_transaction()
            writer.produce(out, b"other", b"x")
            writer.flush(10)
            time.sleep(0.3)
            writer.commit_transaction(30)

    threads = [
        threading.Thread(target=keep_open, args=(w, n == 0), daemon=True)
        for n, w in enumerate(writers)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # both writing
    found = OutputLog(broker.bootstrap, out, "app", window_s=600, timeout=10)
    try:
        started = time.monotonic()
        assert found.landed(done, [0]) == [0]
        assert time.monotonic() - started < 5
    finally:
        found.close()
        stop.set()
        for thread in threads:
            thread.join(15)
