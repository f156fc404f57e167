"""Durable timers on a worker subprocess against the real broker."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from agents_stream.testing.topics import create_topics, read_topic, wait_for_records

pytestmark = pytest.mark.broker

APP = "tests.apps.timers_app:app"


def env_for(topic_factory):
    return {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }


def send(bootstrap: str, topic: str, key: str, value: dict, timestamp: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    kwargs = {} if timestamp is None else {"timestamp": timestamp}
    producer.produce(topic, key=key.encode(), value=json.dumps(value).encode(), **kwargs)
    assert producer.flush(30) == 0


def outputs(bootstrap: str, topic: str) -> list[dict]:
    return [r.json() for r in read_topic(bootstrap, topic)]


def fired(bootstrap: str, topic: str) -> list[dict]:
    return [v for v in outputs(bootstrap, topic) if "fired" in v]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.3)
    raise TimeoutError(what)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_processing_time_timer_fires_its_action(broker, topic_factory, worker_factory):
    env = env_for(topic_factory)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    worker = worker_factory(APP, env)
    ts = now_ms() + 1500
    send(broker.bootstrap, env["AS_INPUT"], "a", {"processing": ts})
    [firing] = wait_until(
        lambda: fired(broker.bootstrap, env["AS_OUTPUT"]), 60, "no firing: " + worker.log()
    )
    assert firing["key"] == "a" and firing["fired"] == "processing" and firing["ts"] == ts
    assert firing["at"] >= ts
    time.sleep(1.0)
    assert len(fired(broker.bootstrap, env["AS_OUTPUT"])) == 1  # fired once
    assert worker.terminate() == 0
    assert "timers_fired=1" in worker.log()


def test_event_time_timer_fires_only_after_the_watermark_passes(
    broker, topic_factory, worker_factory
):
    env = env_for(topic_factory)
    inp, out = env["AS_INPUT"], env["AS_OUTPUT"]
    create_topics(broker.bootstrap, [inp], partitions=1)
    worker = worker_factory(APP, env)
    t0 = 1_700_000_000_000
    send(broker.bootstrap, inp, "b", {"event": t0 + 5000}, timestamp=t0)
    send(broker.bootstrap, inp, "c", {"n": 1}, timestamp=t0 + 3000)
    wait_for_records(broker.bootstrap, out, 2, timeout=60)
    time.sleep(2.0)
    assert fired(broker.bootstrap, out) == [], worker.log()  # watermark t0+2999 < t0+5000
    # a later record moves the watermark to t0+5999 >= t0+5000
    send(broker.bootstrap, inp, "c", {"n": 2}, timestamp=t0 + 6000)
    [firing] = wait_until(lambda: fired(broker.bootstrap, out), 60, "no firing: " + worker.log())
    assert firing == {**firing, "key": "b", "fired": "event", "ts": t0 + 5000}


@pytest.mark.kafka_proof
def test_timer_registered_before_a_crash_fires_after_restart(broker, topic_factory, worker_factory):
    env = env_for(topic_factory)
    inp, out = env["AS_INPUT"], env["AS_OUTPUT"]
    create_topics(broker.bootstrap, [inp], partitions=2)
    first = worker_factory(APP, env)
    send(broker.bootstrap, inp, "warm-up", {"n": 0})
    wait_for_records(broker.bootstrap, out, 1, timeout=60)  # the worker is up
    ts = now_ms() + 5000
    send(broker.bootstrap, inp, "d", {"processing": ts})
    # the echo is emitted after the ActionDone (and the timer) were acknowledged
    wait_for_records(broker.bootstrap, out, 2, timeout=30)
    first.kill()
    assert fired(broker.bootstrap, out) == []
    second = worker_factory(APP, env)
    [firing] = wait_until(
        lambda: fired(broker.bootstrap, out), 90, "no firing after restart: " + second.log()
    )
    assert firing["ts"] == ts and firing["pid"] == second.proc.pid and firing["at"] >= ts
    time.sleep(1.5)
    assert len(fired(broker.bootstrap, out)) == 1
    # the firing completed: a third worker does not fire it again
    assert second.terminate() == 0
    third = worker_factory(APP, env)
    time.sleep(6)
    assert len(fired(broker.bootstrap, out)) == 1, third.log()
