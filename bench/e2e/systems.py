"""One process per system under test: drain ``--input`` into ``--output`` until killed.

Every system does the same per-record work: decode the JSON value, add a field, encode,
produce to the output topic with the input's key. ``bench_e2e.py`` starts one of these,
counts outputs and kills it. Kept in one file so that a reader sees every peer's
program side by side, each written the way its own documentation suggests.

    python bench/e2e/systems.py SYSTEM --bootstrap H:P --input T --output T [--state-topic T]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

RETENTION_MS = str(24 * 3600 * 1000)  # Quix asks for an explicit retention


def enrich(value: dict[str, Any]) -> dict[str, Any]:
    return {**value, "seen": True}


def _consumer_conf(bootstrap: str, group: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1500,
        "log_level": 3,
    }


def _producer_conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3}


def raw(args: argparse.Namespace) -> None:
    """The floor: consume, transform, produce; no state, no acks awaited."""
    from confluent_kafka import Consumer, Producer

    consumer = Consumer(_consumer_conf(args.bootstrap, f"raw-{uuid.uuid4().hex[:6]}"))
    producer = Producer(_producer_conf(args.bootstrap))
    consumer.subscribe([args.input])
    while True:
        for msg in consumer.consume(1000, 0.2):
            if msg.error():
                continue
            out = json.dumps(enrich(json.loads(msg.value()))).encode()
            producer.produce(args.output, out, msg.key())
        producer.poll(0)


def raw_journal(args: argparse.Namespace) -> None:
    """The journal's physical limit: one acked append per record to a compacted topic,
    the output produced from that append's delivery callback (records pipelined)."""
    from confluent_kafka import Consumer, Producer

    consumer = Consumer(_consumer_conf(args.bootstrap, f"rawj-{uuid.uuid4().hex[:6]}"))
    conf = _producer_conf(args.bootstrap)
    conf.update({"enable.idempotence": True, "acks": "all", "linger.ms": 2})
    producer = Producer(conf)
    consumer.subscribe([args.input])

    def after_journal(key: bytes, out: bytes) -> Callable[[Any, Any], None]:
        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                producer.produce(args.output, out, key)

        return delivered

    while True:
        for msg in consumer.consume(1000, 0.2):
            if msg.error():
                continue
            out = json.dumps(enrich(json.loads(msg.value()))).encode()
            slot = f"{msg.partition()}:{msg.offset()}".encode()
            producer.produce(
                args.state_topic,
                out,
                slot,
                msg.partition(),
                on_delivery=after_journal(msg.key(), out),
            )
        producer.poll(0)


def _quix(args: argparse.Namespace, stateful: bool) -> None:
    from quixstreams import Application
    from quixstreams.models import TopicConfig

    state_dir = tempfile.mkdtemp(prefix="quix-bench-")
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=f"quix-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        state_dir=state_dir,
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1500},
        loglevel="WARNING",
    )
    config = TopicConfig(
        num_partitions=4, replication_factor=1, extra_config={"retention.ms": RETENTION_MS}
    )
    source = app.topic(args.input, value_deserializer="json", config=config)
    sink = app.topic(args.output, value_serializer="json", config=config)
    sdf = app.dataframe(source)
    if stateful:

        def count(value: dict[str, Any], state: Any) -> dict[str, Any]:
            seen = state.get("seen", 0) + 1
            state.set("seen", seen)
            return {**enrich(value), "n": seen}

        sdf = sdf.apply(count, stateful=True)
    else:
        sdf = sdf.apply(enrich)
    sdf.to_topic(sink)
    app.run()


def quix(args: argparse.Namespace) -> None:
    _quix(args, stateful=False)


def quix_state(args: argparse.Namespace) -> None:
    _quix(args, stateful=True)


def _bytewax(args: argparse.Namespace, stateful: bool) -> None:
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.run import cli_main

    flow = Dataflow("bench")
    source = KafkaSource(
        [args.bootstrap], [args.input], add_config={"session.timeout.ms": "6000"}, batch_size=1000
    )
    msgs = op.input("in", flow, source)

    if stateful:
        keyed = op.map("key", msgs, lambda m: ((m.key or b"").decode(), m.value))

        def count(seen: int | None, raw_value: bytes) -> tuple[int, bytes]:
            seen = (seen or 0) + 1
            out = {**enrich(json.loads(raw_value)), "n": seen}
            return seen, json.dumps(out).encode()

        counted = op.stateful_map("count", keyed, count)
        out = op.map("out", counted, lambda kv: KafkaSinkMessage(kv[0].encode(), kv[1]))
    else:
        out = op.map(
            "out",
            msgs,
            lambda m: KafkaSinkMessage(m.key, json.dumps(enrich(json.loads(m.value))).encode()),
        )
    op.output("sink", out, KafkaSink([args.bootstrap], args.output))
    recovery = None
    if stateful:
        db_dir = tempfile.mkdtemp(prefix="bytewax-bench-")
        init_db_dir(db_dir, 1)
        recovery = RecoveryConfig(db_dir)
    from datetime import timedelta

    cli_main(flow, epoch_interval=timedelta(seconds=1), recovery_config=recovery)


def bytewax(args: argparse.Namespace) -> None:
    _bytewax(args, stateful=False)


def bytewax_state(args: argparse.Namespace) -> None:
    _bytewax(args, stateful=True)


def _faust(args: argparse.Namespace, table: bool) -> None:
    import faust

    app = faust.App(
        f"faust-{uuid.uuid4().hex[:6]}",
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        topic_partitions=4,
        web_enabled=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.5,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(args.input, value_serializer="json", key_serializer="raw")
    sink = app.topic(args.output, value_serializer="json", key_serializer="raw")
    counts = app.Table("counts", default=int) if table else None

    @app.agent(source)
    async def process(stream: Any) -> None:
        async for key, value in stream.items():
            out = enrich(value)
            if counts is not None:
                counts[key] += 1
                out["n"] = counts[key]
            await sink.send(key=key, value=out)

    sys.argv = ["faust", "worker", "-l", "warn"]
    app.main()


def faust_plain(args: argparse.Namespace) -> None:
    _faust(args, table=False)


def faust_table(args: argparse.Namespace) -> None:
    _faust(args, table=True)


def faust_durable(args: argparse.Namespace) -> None:
    """agents_stream's Faust host (``durable_agent``): a sync action with one journaled
    call of ``AS_BENCH_CALL_MS`` ms; ``AS_BENCH_CONCURRENCY`` records in flight."""
    import time

    import faust

    from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
    from agents_stream.faust import durable_agent

    call_s = float(os.environ.get("AS_BENCH_CALL_MS", "0")) / 1000

    def lookup(key: str) -> int:
        time.sleep(call_s)
        return len(key)

    class FaustBench(Agent):
        @action(InputEvent)
        @staticmethod
        def process(event: InputEvent, ctx: RunnerContext) -> None:
            n = ctx.execute(lookup, event.key)
            ctx.send_event(OutputEvent(output={**enrich(event.input), "n": n}))

    app = faust.App(
        f"faust-durable-{uuid.uuid4().hex[:6]}",
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        topic_partitions=4,
        web_enabled=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.5,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(args.input, value_serializer="json")
    concurrency = int(os.environ.get("AS_BENCH_CONCURRENCY", "1"))
    durable_agent(app, FaustBench, topic=source, output=args.output, concurrency=concurrency)
    sys.argv = ["faust", "worker", "-l", "warn"]
    app.main()


SYSTEMS: dict[str, Callable[[argparse.Namespace], None]] = {
    "raw": raw,
    "raw-journal": raw_journal,
    "quix": quix,
    "quix-state": quix_state,
    "bytewax": bytewax,
    "bytewax-state": bytewax_state,
    "faust": faust_plain,
    "faust-table": faust_table,
    "faust-durable": faust_durable,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("system", choices=sorted(SYSTEMS))
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--state-topic", default="")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    SYSTEMS[args.system](args)


if __name__ == "__main__":
    main()
