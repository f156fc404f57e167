"""``agents_stream.journal`` (compaction and decoding in the partition reader) gives the
rows of the shuffle path (Kafka source, ``compact``, ``decode_journal``), and
``journal_batch`` gives the rows of ``decode_record``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    MemorySnapshot,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.spark.frames.action_state import read_journal
from agents_stream.spark.frames.journal_rows import (
    JOURNAL_COLUMNS,
    decode_record,
    journal_batch,
)
from agents_stream.spark.source.errors import KafkaSourceOptionError
from tests.unit.serde.fixtures import journal_entries, sample_entries

CODEC = default_journal_codec()


def _reference_rows(records, include_raw=False):
    rows = []
    for partition, offset, ts, key, value in records:
        row = decode_record(CODEC, key, value, include_raw=include_raw)
        row.update(partition=partition, offset=offset, timestamp_ms=ts)
        rows.append({c: row.get(c) for c in JOURNAL_COLUMNS})
    return rows


@settings(max_examples=100, deadline=None)
@given(st.lists(journal_entries | st.binary(max_size=30), max_size=8), st.booleans())
def test_journal_batch_rows_equal_decode_record(items, include_raw):
    records = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):  # undecodable: random bytes under a call's key
            key = entry_key_bytes(sample_entries()[0])
            records.append((i % 3, i, 1000 + i, key, item))
        else:
            records.append((i % 3, i, 1000 + i, entry_key_bytes(item), CODEC.encode(item)))
    batch = journal_batch(
        CODEC,
        [r[3] for r in records],
        [r[4] for r in records],
        [r[0] for r in records],
        [r[1] for r in records],
        [r[2] for r in records],
        include_raw=include_raw,
    )
    assert batch.to_pylist() == _reference_rows(records, include_raw)


def test_partly_emitted_completions_name_the_outputs_sent():
    ref = ActionRef("k1", 7, "A.run#0", partition=0, topic="in")
    partly = ActionDone(ref, outputs=(b"1", b"2", b"3"), emitted=False, emitted_outputs=(0, 2))
    key, value = entry_key_bytes(partly), CODEC.encode(partly)
    (row,) = journal_batch(CODEC, [key], [value], [0], [0], [0]).to_pylist()
    assert (row["emitted"], row["emitted_outputs"]) == (False, [0, 2])
    assert decode_record(CODEC, key, value)["emitted_outputs"] == [0, 2]


def _entries() -> list:
    ref = ActionRef("k1", 7, "A.run#0", partition=0, topic="in")
    failed = ExceptionInfo("builtins.ValueError", "bad", "tb")
    return [
        CallEntry(ref, 0, "f", "d", CallStatus.PENDING, started_ms=5),
        CallEntry(ref, 0, "f", "d", CallStatus.SUCCEEDED, result=b'{"a":1}', started_ms=5),
        CallEntry(ref, 1, "g", "d", CallStatus.FAILED, exception=failed),
        ActionDone(ref, outputs=(b'{"o":1}', b"\x80"), calls=2, finished_ms=9),
        MemorySnapshot("k1", {"x": b"1"}, applied_seq=7, applied_ordinal=0),
    ]


@pytest.mark.broker
@pytest.mark.spark
def test_journal_source_equals_the_shuffle_path(spark, broker, kafka_topic, produce):
    topic = kafka_topic(2)
    records = []
    for partition in (0, 1):
        for entry in _entries():
            records.append((partition, entry_key_bytes(entry), CODEC.encode(entry), None, None))
    bad_key = entry_key_bytes(_entries()[2])
    records += [
        (0, bad_key, b"\xc3\x01garbage", None, None),  # undecodable, replaces call 1
        (1, entry_key_bytes(_entries()[4]), None, None, None),  # tombstone: snapshot gone
        (1, b"k-only-tombstoned", None, None, None),
    ]
    produce(topic, records)

    for include_raw in (False, True):
        fast = read_journal(spark, broker.bootstrap, topic, include_raw=include_raw)
        slow = read_journal(
            spark, broker.bootstrap, topic, include_raw=include_raw, maxRecordsPerPartition=2
        )
        assert "agents_stream.journal" in fast._jdf.queryExecution().toString()
        assert "agents_stream.journal" not in slow._jdf.queryExecution().toString()
        order = ["partition", "offset"]
        got = [r.asDict(recursive=True) for r in fast.orderBy(order).collect()]
        want = [r.asDict(recursive=True) for r in slow.orderBy(order).collect()]
        assert got == want
        # per partition 4 live keys (call 0 written twice); call 1 of partition 0 replaced
        # by garbage, the snapshot of partition 1 tombstoned
        assert len(got) == 7
        kinds = sorted(r["kind"] for r in got)
        assert kinds.count("undecodable") == 1 and kinds.count("memory") == 1


def test_splitting_options_are_refused_by_the_journal_source():
    from agents_stream.spark.frames.journal_source import _split

    with pytest.raises(KafkaSourceOptionError, match="maxRecordsPerPartition"):
        _split({"maxRecordsPerPartition": "10", "subscribe": "t"})


def test_the_audit_view_options_are_checked_by_name():
    from agents_stream.spark.frames.journal_audit import AUDIT_DDL
    from agents_stream.spark.frames.journal_source import JournalDataSource

    def source(**options: str) -> JournalDataSource:
        return JournalDataSource({"subscribe": "t", "kafka.bootstrap.servers": "x:1", **options})

    assert source(**{"journal.view": "AUDIT"}).schema() == AUDIT_DDL
    with pytest.raises(KafkaSourceOptionError, match=r"journal\.view: must be one of rows, audit"):
        source(**{"journal.view": "summary"}).schema()
    with pytest.raises(KafkaSourceOptionError, match=r"journal\.viewRowLimit"):
        source(**{"journal.view": "audit", "journal.viewRowLimit": "many"}).reader(None)
    reader = source(**{"journal.view": "audit", "journal.viewRowLimit": "500"}).reader(None)
    assert (reader.view, reader.view_row_limit) == ("audit", 500)


@pytest.mark.spark
def test_audit_state_counts_give_the_tables_of_action_states(spark):
    """The audit's light per-state counts give the same in_flight table and counts as
    the full ``action_states`` (truncation-only states included)."""
    from agents_stream.durable.journal import Truncation
    from agents_stream.spark.frames.journal_rows import JOURNAL_DDL
    from agents_stream.spark.jobs.audit import journal_tables, state_counts

    ref2 = ActionRef("k2", 8, "A.run#0", partition=1, topic="in")
    entries = [*_entries(), Truncation(ref2, 0, "f", "a", "g", "b", dropped=1)]
    batch = journal_batch(
        CODEC,
        [entry_key_bytes(e) for e in entries],
        [CODEC.encode(e) for e in entries],
        [0] * len(entries),
        list(range(len(entries))),
        [1] * len(entries),
    )
    journal = spark.createDataFrame(batch.to_pylist(), JOURNAL_DDL)
    full = journal_tables(journal, stuck_after_ms=0, now_ms=10)
    light = journal_tables(journal, stuck_after_ms=0, now_ms=10, states=state_counts(journal))
    assert light["in_flight"].collect() == full["in_flight"].collect()
    assert len(full["in_flight"].collect()) == 1  # the truncation-only state
    assert state_counts(journal).count() == 2
