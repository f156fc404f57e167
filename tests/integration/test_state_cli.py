"""``agents-stream state show|stats`` against the embedded broker."""

from __future__ import annotations

import itertools

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from agents_stream.cli.main import main
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    MemorySnapshot,
    TwoPhase,
    TwoPhaseCall,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

pytestmark = pytest.mark.broker
_modules = itertools.count()


@pytest.fixture
def app_factory(broker, topic_factory, tmp_path, monkeypatch):
    """Writes an importable module holding an App; returns (spec, action-state topic)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(partitions: int = 2) -> tuple[str, str]:
        app_id = topic_factory("app")
        module = f"state_cli_app_{next(_modules)}"
        (tmp_path / f"{module}.py").write_text(
            f"from agents_stream import App\napp = App({app_id!r}, broker={broker.url!r})\n"
        )
        topic = f"{app_id}-action-state"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            future.result(timeout=30)
        return f"{module}:app", topic

    return make


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, partition in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def journal(entries, codec=None, partition: int = 0):
    codec = codec or default_journal_codec()
    return [(entry_key_bytes(e), codec.encode(e), partition) for e in entries]


def v1_codec() -> JournalCodec:
    versions = load_versions(JOURNAL_RECORD_TYPE)
    return JournalCodec(AvroSerde(versions, writer=versions[0]))


def test_show_and_stats(broker, app_factory, capsys):
    spec, topic = app_factory()
    ref = ActionRef("user-1", 7, "Scoring.process#0")
    other = ActionRef("user-2", 8, "Scoring.process#0", partition=1)
    error = ExceptionInfo("payments.CardDeclined", "card declined")
    records = journal(
        [
            CallEntry(ref, 0, "scoring.fetch", "a", CallStatus.SUCCEEDED, b'{"v":1}'),
            CallEntry(ref, 2, "payments.refund", "c", CallStatus.PENDING),
            ActionDone(ref, outputs=(b"{}",), calls=3),
            MemorySnapshot("user-1", {"score": b"0.5"}, applied_seq=7),
        ]
    )
    # An older deployment wrote this slot with schema v1 (no status).
    records += journal(
        [CallEntry(ref, 1, "payments.charge", "b", CallStatus.FAILED, None, error)], v1_codec()
    )
    stale = CallEntry(other, 0, "scoring.fetch", "z", CallStatus.SUCCEEDED, b"1")
    records += journal(
        [stale, CallEntry(other, 1, "scoring.fetch", "y", CallStatus.PENDING)], partition=1
    )
    records.append((entry_key_bytes(stale), None, 1))  # tombstone deletes the slot
    produce(broker.bootstrap, topic, records)

    assert main(["state", "show", "-A", spec, "--key", "user-1"]) == 0
    out = capsys.readouterr().out
    assert "seq 7  action Scoring.process#0  completed (3 calls, 1 outputs)" in out
    assert 'call 0  scoring.fetch  SUCCEEDED  result {"v":1}' in out
    assert "call 1  payments.charge  FAILED  exception payments.CardDeclined: card declined" in out
    assert "call 2  payments.refund  PENDING" in out
    assert "memory (after seq 7): score=0.5" in out
    assert "user-2" not in out
    assert out.index("call 0") < out.index("call 1") < out.index("call 2")

    assert main(["state", "stats", "-A", spec]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line.split() for line in lines if line.startswith("Scoring.process"))
    # PENDING, SUCCEEDED, FAILED, completed, truncations (the tombstoned slot is gone)
    assert row[1:] == ["2", "1", "1", "1", "0"]
    assert "keys with memory: 1" in lines


def test_show_unknown_key_and_empty_topic(app_factory, capsys):
    spec, _ = app_factory(partitions=3)
    assert main(["state", "show", "-A", spec, "--key", "nobody"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: no journal records of key 'nobody' in ")
    assert len(err.splitlines()) == 1


def test_undecodable_value_is_reported_not_fatal(broker, app_factory, capsys):
    spec, topic = app_factory(partitions=1)
    ref = ActionRef("k", 1, "A.run#0")
    good = CallEntry(ref, 0, "f", "d", CallStatus.SUCCEEDED, b"1")
    records = journal([good])
    records.append((b"c\x1fk\x1f1\x1fA.run#0\x1f1", b"\xc3\x01garbage!!", 0))
    produce(broker.bootstrap, topic, records)
    assert main(["state", "show", "-A", spec, "--key", "k"]) == 0
    captured = capsys.readouterr()
    assert "call 0  f  SUCCEEDED" in captured.out
    assert "key='k' seq=1 action='A.run#0' call_index=1" in captured.err


def test_two_phase_obligations_in_show_and_stats(broker, app_factory, capsys):
    """Issue 65: the obligation beside a call slot (its own ``x`` record) is read and
    shown with its phase; stats count obligations by phase."""
    spec, topic = app_factory(partitions=1)
    ref = ActionRef("order-1", 3, "Orders.pay#0", topic="orders")
    slot = CallEntry(ref, 0, "app.Charge", "d", CallStatus.SUCCEEDED, b'{"hold":"h-1"}')
    x = TwoPhaseCall(ref, 0, "app.Charge", "d", TwoPhase.ABORTING, b"\x01\x01{}",
                     b'{"hold":"h-1"}', attempts=1, last_error="psp.Down: 503")  # fmt: skip
    produce(broker.bootstrap, topic, journal([x, slot]))
    assert main(["state", "show", "-A", spec, "order-1"]) == 0
    out = capsys.readouterr().out
    assert "call 0  app.Charge  SUCCEEDED" in out
    assert "two-phase ABORTING  round 0  attempts 1  last error psp.Down: 503" in out
    assert main(["state", "stats", "-A", spec]) == 0
    out = capsys.readouterr().out
    assert "two-phase calls: 0 PREPARED, 0 COMMITTED, 1 ABORTING, 0 ABORTED (1 waiting)" in out


def test_no_broker_configured(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("AGENTS_STREAM_BROKER", raising=False)
    (tmp_path / "state_cli_nobroker.py").write_text(
        "from agents_stream import App\napp = App('nobroker')\n"
    )
    assert main(["state", "stats", "-A", "state_cli_nobroker:app"]) == 1
    assert "no broker configured" in capsys.readouterr().err
