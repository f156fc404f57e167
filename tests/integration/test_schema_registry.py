"""Registry-backed Avro end to end on Apache Kafka and a real registry (issue 52).

Apicurio Registry (Confluent API, BACKWARD global rule) runs once per session
(``schema_registry`` fixture); each test uses its own topics, hence its own subjects.
Workers are real subprocesses where the exit code and the last line matter.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from agents_stream import App
from agents_stream.durable.identity import args_digest, function_id
from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.registry import RegistryBinding, ensure_registered, registry_client
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, SchemaVersion, load_versions
from agents_stream.serde.values import value_codec
from agents_stream.testing import LiveWorker
from agents_stream.testing.launcher import free_ports
from agents_stream.testing.topics import create_topics, read_topic, wait_for_records
from tests.apps import registry_app

pytestmark = [pytest.mark.broker, pytest.mark.kafka_only]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.registry_app:app"


def _env(registry: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_STREAM_")}
    env["AGENTS_STREAM_SCHEMA_REGISTRY"] = registry
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents_stream", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        for _ in range(20):  # the group's coordinator may still be loading (NOT_COORDINATOR)
            try:
                found = consumer.committed(
                    [TopicPartition(topic, p) for p in range(partitions)], 10
                )
            except KafkaException:
                time.sleep(0.5)
                continue
            return [tp.offset for tp in found if tp.offset >= 0]
        raise AssertionError(f"no committed offsets of group {group} in 10 s")
    finally:
        consumer.close()


# -- start-up: a refused, unreachable or missing schema stops the worker in one line ---------


@pytest.mark.parametrize("case", ["refused", "unreachable", "missing"])
def test_worker_stops_at_startup_on_registry_errors(
    case: str, broker: Any, schema_registry: Any, topic_factory: Any, tmp_path: Path
) -> None:
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    url = schema_registry.url
    extra = {"AS_APP_ID": app_id, "AS_INPUT": inp, "AS_OUTPUT": out}
    create_topics(broker.bootstrap, [inp], partitions=2)
    orders = value_codec(registry_app.ORDER_V2, registry_url=url, topic=inp)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for i in range(5):
        producer.produce(inp, orders.encode({"order": f"o{i}", "amount": 1.5, "currency": "EUR"}))
    assert producer.flush(30) == 0
    if case == "refused":
        # The output subject holds a Receipt without `currency`; the app's Receipt adds it
        # without a default: BACKWARD refuses it (it cannot read the old records).
        old = dict(registry_app.RECEIPT, fields=registry_app.RECEIPT["fields"][:2])
        ensure_registered(url, f"{out}-value", SchemaVersion.from_raw(old))
        phrases = [f"{out}-value", "output schema Receipt of agent Billing", "refused", "HTTP 409"]
    elif case == "unreachable":
        url = f"http://127.0.0.1:{free_ports(1)[0]}/apis/ccompat/v7"
        phrases = [f"{app_id}-action-state-value", "unavailable", "ActionState v"]
    else:
        extra["AGENTS_STREAM_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER_SCHEMAS"] = "false"
        phrases = [f"{app_id}-action-state-value", "could not look up", "HTTP 404"]
    started = time.monotonic()
    proc = _cli(
        "worker", "-A", APP, "--broker", broker.url, "--data-dir", str(tmp_path / "data"),
        env=_env(url, **extra),
    )  # fmt: skip
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output, output
    assert sum("CRITICAL" in line for line in lines) == 1, output
    last = lines[-1]
    assert "CRITICAL" in last and "worker stopped: schema registry" in last, output
    for phrase in phrases:
        assert phrase in last, last
    assert took < 30, took
    # Before any partition was taken: nothing dead-lettered, nothing committed.
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    assert _committed(broker.bootstrap, app_id, inp, 2) == []


# -- the record path: evolution, upgrade of the journal schema, bad records, tail ------------


def _write_v5_journal(url: str, bootstrap: str, app_id: str, inp: str, offset: int) -> None:
    """What a deploy on ActionState v5 left for the input at ``offset`` (partition 0): the
    `to_cents` call journaled with a result the code would never compute, Confluent-framed
    with v5's id under the journal's subject."""
    versions = load_versions(JOURNAL_RECORD_TYPE)
    v5 = next(v for v in versions if v.version == 5)
    subject = f"{app_id}-action-state-value"
    codec = JournalCodec(AvroSerde(versions, writer=v5, registry=RegistryBinding(url, subject)))
    ref = ActionRef("k0", offset, "Billing.bill#0", 0, inp)
    amount = 1.0
    entry = CallEntry(
        ref,
        0,
        function_id(registry_app.to_cents),
        args_digest((amount,), {}),
        CallStatus.SUCCEEDED,
        json.dumps(4242).encode(),
        call_id=ref.call_id(app_id, 0),
    )
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    value = codec.encode(entry)
    assert value[:1] == b"\x00"
    producer.produce(f"{app_id}-action-state", key=entry_key_bytes(entry), value=value, partition=0)
    assert producer.flush(30) == 0


def test_v1_producer_v2_reader_journal_upgrade_and_bad_records(
    broker: Any, schema_registry: Any, topic_factory: Any, worker_factory: Any
) -> None:
    url = schema_registry.url
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    extra = {"AS_APP_ID": app_id, "AS_INPUT": inp, "AS_OUTPUT": out}
    create_topics(broker.bootstrap, [inp], partitions=1)
    TopicAdmin(broker.bootstrap).ensure([compacted(f"{app_id}-action-state", 1)])

    # v1 producer: the CLI, through the app's codec with the v1 reader schema.
    v1 = _cli(
        "produce", inp, "-A", APP, "--broker", broker.url, "--timeout", "30",
        'k0={"order": "o0", "amount": 1.0}', 'k1={"order": "o1", "amount": 2.5}',
        env=_env(url, AS_ORDER_VERSION="1", **extra),
    )  # fmt: skip
    assert v1.returncode == 0, v1.stderr
    # v2 producer (currency added with a default): BACKWARD accepts it.
    v2 = value_codec(registry_app.ORDER_V2, registry_url=url, topic=inp)
    v1_id = ensure_registered(url, f"{inp}-value", SchemaVersion.from_raw(registry_app.ORDER_V1))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    producer.produce(inp, v2.encode({"order": "o2", "amount": 3.0, "currency": "USD"}), key=b"k2")
    # Bad records: a schema id the registry does not know; a body cut short.
    producer.produce(inp, b"\x00" + (987654).to_bytes(4, "big") + b"\x02x", key=b"bad-id")
    producer.produce(inp, b"\x00" + v1_id.to_bytes(4, "big") + b"\x08o", key=b"bad-body")
    producer.produce(inp, v2.encode({"order": "o5", "amount": 1.0, "currency": "GBP"}), key=b"k5")
    assert producer.flush(30) == 0
    # The journal of input 0 as a v5 deploy left it: replayed, not executed.
    _write_v5_journal(url, broker.bootstrap, app_id, inp, offset=0)

    worker = worker_factory(APP, _env(url, **extra))
    outs = wait_for_records(broker.bootstrap, out, 4, timeout=90)
    # Another Confluent client reads the outputs: magic byte, id, Avro body.
    client = registry_client(url)
    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(out, MessageField.VALUE)
    receipts = {r.key: deserialize(r.value, ctx) for r in outs}
    assert receipts == {
        "k0": {"order": "o0", "amount_cents": 4242, "currency": "EUR"},  # v5 journal replayed
        "k1": {"order": "o1", "amount_cents": 250, "currency": "EUR"},  # v1 record, default
        "k2": {"order": "o2", "amount_cents": 300, "currency": "USD"},
        "k5": {"order": "o5", "amount_cents": 100, "currency": "GBP"},
    }, worker.log()
    dead = {r.key: r.headers for r in wait_for_records(broker.bootstrap, f"{inp}-dlq", 2)}
    assert sorted(dead) == ["bad-body", "bad-id"]
    assert b"schema id 987654 not found" in dead["bad-id"]["x-error-message"]
    assert b"corrupt" in dead["bad-body"]["x-error-message"]
    assert {h["x-error-stage"] for h in dead.values()} == {b"decode"}
    assert worker.alive, worker.log()
    # The journal topic holds both versions' records, each framed with its registry id.
    journal = [r.value for r in read_topic(broker.bootstrap, f"{app_id}-action-state") if r.value]
    ids = {int.from_bytes(v[1:5], "big") for v in journal}
    assert all(v[:1] == b"\x00" for v in journal) and len(ids) == 2, ids

    # tail without -A decodes registry-framed values by their writer's id.
    tail = _cli(
        "tail", out, "--broker", broker.url, "--max", "4", "--timeout", "30", "--json",
        env=_env(url),
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    shown = sorted(json.loads(line)["value"]["amount_cents"] for line in tail.stdout.splitlines())
    assert shown == [100, 250, 300, 4242]
    assert worker.terminate() == 0, worker.log()


# -- a refusal mid-run pauses the partition and retries; never a dead letter -----------------


def _waiting_worker(
    app: App, bootstrap: str, records: list[tuple[bytes, bytes]], data_dir: Path
) -> LiveWorker:
    """``records`` (key, value) to the app's one input from an idempotent producer, then
    its in-process worker, returned once it has retried a refused record 3 times (a
    backoff of at most 1 s: the test waits for seconds, not minutes), still running."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    for key, value in records:
        producer.produce(app.agents[0].input, value, key=key)
    assert producer.flush(30) == 0
    live = LiveWorker(app, broker=f"kafka://{bootstrap}", data_dir=data_dir).start()
    worker = live.worker
    assert worker is not None
    worker.registry_wait.most = 1.0
    deadline = time.monotonic() + 60
    while worker.stats["registry_retries"] < 3:
        assert worker.fatal is None, worker.fatal
        assert time.monotonic() < deadline, "no retries"
        time.sleep(0.1)
    assert worker.registry_wait.paused == 1
    return live


def _pause_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "paused, retrying" in r.getMessage()]


def test_refusal_mid_run_pauses_the_partition_until_the_registry_accepts(
    broker: Any,
    schema_registry: Any,
    topic_factory: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What issue 52 found: the journal's subject at FULL holding v1-v3 (v6 is not FULL-
    compatible with them), a worker that registers nothing at start-up (the in-process
    Worker) meets the refusal on its first journal write, as a worker would whose subject's
    rule changed under it. Before: every record dead-lettered, then the worker stopped.
    Now: one WARNING, the partition waits and retries with backoff (counted), nothing is
    dead-lettered or committed; once the rule is changed back every record is processed,
    each once, and the worker never stopped."""
    url = schema_registry.url
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    subject = f"{app_id}-action-state-value"
    client = registry_client(url)
    client.set_compatibility(subject, "FULL")
    for version in load_versions(JOURNAL_RECORD_TYPE)[:3]:
        ensure_registered(url, subject, version)
    app = App(app_id, schema_registry_url=url, commit_interval=0.2)
    app.agent(registry_app.Billing, input=inp, output=out)
    create_topics(broker.bootstrap, [inp], partitions=1)
    records = [(b"k", json.dumps({"order": f"o{i}", "amount": i}).encode()) for i in range(8)]
    caplog.set_level(logging.INFO, logger="agents_stream")
    live = _waiting_worker(app, broker.bootstrap, records, tmp_path / "data")
    try:
        worker = live.worker
        assert worker is not None and live._thread is not None and live._thread.is_alive()
        assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
        assert read_topic(broker.bootstrap, out) == []
        assert _committed(broker.bootstrap, app_id, inp, 1) in ([], [0])
        warned = _pause_warnings(caplog)
        assert len(warned) == 1, warned
        line = warned[0]
        for phrase in (subject, "refused", "HTTP 409", f"{inp}[0]", "not dead-lettered"):
            assert phrase in line, line

        client.set_compatibility(subject, "NONE")  # the rule changed back under it
        receipts = {r.value: r for r in wait_for_records(broker.bootstrap, out, 8, timeout=60)}
        deadline = time.monotonic() + 30
        while _committed(broker.bootstrap, app_id, inp, 1) != [8]:
            assert time.monotonic() < deadline, "offset 8 not committed"
            time.sleep(0.3)
        assert worker.registry_wait.paused == 0
        assert worker.fatal is None and live._thread.is_alive()
    finally:
        live.stop()
    assert len(read_topic(broker.bootstrap, out)) == len(receipts) == 8  # each once
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    assert any("resumed" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


class _Gate:
    """A TCP forwarder to the registry that is closed (connections refused) until
    :meth:`open`: the registry unreachable from the worker, as in a network outage, while
    the test still reaches it directly."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_ports(1)[0]
        self._server: socket.socket | None = None

    def open(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_registry_unreachable_mid_run_pauses_decoding_until_it_answers(
    broker: Any,
    schema_registry: Any,
    topic_factory: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Inputs framed with a writer id the worker has not fetched yet, and the registry
    unreachable from the worker: each record waits (one WARNING, the partition paused),
    none is dead-lettered as undecodable; once the registry answers, every record runs
    once."""
    url = schema_registry.url
    gate = _Gate((schema_registry.host, schema_registry.port))
    gated = url.replace(f":{schema_registry.port}/", f":{gate.port}/")
    app_id, inp, out = topic_factory("app"), topic_factory("in"), topic_factory("out")
    app = App(app_id, schema_registry_url=gated, commit_interval=0.2)
    app.agent(registry_app.Billing, input=inp, output=out, input_schema=registry_app.ORDER_V2)
    create_topics(broker.bootstrap, [inp], partitions=1)
    orders = value_codec(registry_app.ORDER_V2, registry_url=url, topic=inp)
    records = [
        (f"k{i % 3}".encode(), orders.encode({"order": f"o{i}", "amount": i, "currency": "EUR"}))
        for i in range(6)
    ]
    caplog.set_level(logging.INFO, logger="agents_stream")
    live = _waiting_worker(app, broker.bootstrap, records, tmp_path / "data")
    try:
        worker = live.worker
        assert worker is not None
        assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
        warned = _pause_warnings(caplog)
        assert len(warned) == 1 and "unavailable" in warned[0], warned
        gate.open()
        outs = wait_for_records(broker.bootstrap, out, 6, timeout=60)
        assert sorted(json.loads(r.value)["order"] for r in outs) == [f"o{i}" for i in range(6)]
        assert worker.fatal is None and live._thread is not None and live._thread.is_alive()
    finally:
        live.stop()
        gate.close()
    assert len(read_topic(broker.bootstrap, out)) == 6
    assert read_topic(broker.bootstrap, f"{inp}-dlq") == []
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    # Records decoded while it was down and run after it answered are asked again at
    # once: no second wait, no second WARNING.
    assert len(_pause_warnings(caplog)) == 1
