"""End offsets (issue 67, item 2): the embedded broker's ListOffsets(latest) is short after
a batched produce, so ``tail --from end`` printed old records again and the console showed
lag -1. Both read a partition's end where a fetch finds it, on either broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from agents_stream import Agent, App, InputEvent, action
from agents_stream.console.cluster import read_overview
from agents_stream.testing.topics import create_topics

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "agents_stream"]


def _batch(broker, topic: str, count: int) -> None:
    """``count`` records to partition 0 in one produce (one batch)."""
    records = [f'k{i}={{"n": {i}}}' for i in range(count)]
    done = subprocess.run(
        [*CLI, "produce", topic, *records, "--partition", "0", "-b", broker.url],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.broker
def test_tail_from_end_prints_only_new_records_after_a_batch(broker, topic_factory):
    topic = topic_factory("ends")
    create_topics(broker.bootstrap, [topic], partitions=2)
    _batch(broker, topic, 5)
    tail = subprocess.Popen(
        [*CLI, "tail", topic, "--from", "end", "--max", "1", "--timeout", "30", "-b", broker.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert tail.stderr is not None
        assert "reading" in tail.stderr.readline()  # assigned at the ends it found
        _batch(broker, topic, 1)
        out, err = tail.communicate(timeout=40)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    assert out.splitlines() == [f'{topic}[0]@5 key=k0 {{"n": 0}}']


class _Idle(Agent):
    @action(InputEvent)
    @staticmethod
    def handle(event, ctx):
        pass


@pytest.mark.broker
def test_console_lag_is_zero_for_a_group_at_the_end_of_a_batch(broker, topic_factory):
    topic = topic_factory("lag")
    create_topics(broker.bootstrap, [topic, f"{topic}-dlq"], partitions=1)
    _batch(broker, topic, 4)
    _batch(broker, f"{topic}-dlq", 3)
    app = App(topic_factory("lagapp"))
    app.agent(_Idle, input=topic, output=topic_factory("out"))
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": app.id})
    try:
        group.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        group.close()
    overview = read_overview(app, broker.bootstrap)
    assert [(p.committed, p.end, p.lag) for p in overview.partitions] == [(4, 4, 0)]
    assert overview.dead_letters == {f"{topic}-dlq": 3}
