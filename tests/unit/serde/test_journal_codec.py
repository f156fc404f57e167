"""The journal codec: exact round trips, older writers, framings, error identity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from agents_stream.durable.errors import JournalDecodeError
from agents_stream.durable.journal import CallEntry, CallStatus, ExceptionInfo
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

from .fixtures import REF, journal_entries, sample_entries


def codec_writing(version: int) -> JournalCodec:
    versions = load_versions(JOURNAL_RECORD_TYPE)
    return JournalCodec(AvroSerde(versions, writer=versions[version - 1]))


@pytest.mark.parametrize("entry", sample_entries(), ids=lambda e: type(e).__name__)
def test_round_trip_is_exact(entry):
    codec = default_journal_codec()
    data = codec.encode(entry)
    assert data[:2] == b"\xc3\x01"
    decoded = codec.decode(entry_key_bytes(entry), data)
    assert decoded == entry
    assert type(decoded) is type(entry)


@settings(max_examples=200, deadline=None)
@given(journal_entries)
def test_round_trip_any_entry(entry):
    codec = default_journal_codec()
    assert codec.decode(entry_key_bytes(entry), codec.encode(entry)) == entry


def test_v1_writer_has_no_status_and_reads_with_seed_rule():
    old = codec_writing(1)
    new = default_journal_codec()
    failed = CallEntry(REF, 0, "f", "d", CallStatus.FAILED, exception=ExceptionInfo("m.E", "x"))
    ok = CallEntry(REF, 1, "f", "d", CallStatus.SUCCEEDED, result=b"1")
    got_failed = new.decode(entry_key_bytes(failed), old.encode(failed))
    got_ok = new.decode(entry_key_bytes(ok), old.encode(ok))
    assert got_failed.status is CallStatus.FAILED and got_failed.exception == failed.exception
    assert got_ok.status is CallStatus.SUCCEEDED and got_ok.result == b"1"
    # v1 had no partition or audit fields: reader defaults fill them.
    assert got_ok.ref.partition == 0 and got_ok.attempts == 1 and got_ok.call_id == ""


def test_v2_writer_keeps_pending_status():
    pending = CallEntry(REF, 0, "f", "d", CallStatus.PENDING, worker_id="w")
    got = default_journal_codec().decode(entry_key_bytes(pending), codec_writing(2).encode(pending))
    assert got.status is CallStatus.PENDING and got.worker_id == ""


def test_reader_missing_the_writer_version_says_so():
    """Single-object records name their writer only by fingerprint: an older deployment
    cannot fetch a newer schema, so it must fail loudly rather than guess."""
    versions = load_versions(JOURNAL_RECORD_TYPE)
    v1_reader = JournalCodec(AvroSerde(versions[:1]))
    entry = sample_entries()[1]
    with pytest.raises(JournalDecodeError, match="unknown schema fingerprint"):
        v1_reader.decode(entry_key_bytes(entry), default_journal_codec().encode(entry))


def test_undecodable_value_names_the_slot():
    entry = sample_entries()[1]
    with pytest.raises(JournalDecodeError) as info:
        default_journal_codec().decode(entry_key_bytes(entry), b"\xc3\x01garbage!")
    err = info.value
    assert (err.key, err.seq, err.action, err.index) == ("user-1", 42, "Scoring.process#1", 1)
    assert "call_index=1" in str(err)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "empty"),
        (b"\xc3\x01\x00", "truncated single-object"),
        (b"\x7bjson", "unknown framing"),
        (b"\x00\x00\x00\x00\x01\x02", "no schema registry"),
    ],
)
def test_bad_values(value, reason):
    with pytest.raises(JournalDecodeError, match=reason):
        default_journal_codec().decode(b"m\x1fuser-1", value)


def test_truncated_and_trailing_bodies():
    codec = default_journal_codec()
    entry = sample_entries()[3]
    data = codec.encode(entry)
    key = entry_key_bytes(entry)
    with pytest.raises(JournalDecodeError):
        codec.decode(key, data[:-3])
    with pytest.raises(JournalDecodeError, match="trailing"):
        codec.decode(key, data + b"\x00")


def test_confluent_framing_through_mock_registry():
    url = "mock://journal-codec-test"
    writer = default_journal_codec(url, topic="app-action-state")
    reader = default_journal_codec(url, topic="app-action-state")
    entry = sample_entries()[1]
    data = writer.encode(entry)
    assert data[:1] == b"\x00"
    assert reader.decode(entry_key_bytes(entry), data) == entry
    # A registry-configured reader still reads single-object records (topic migration).
    plain = default_journal_codec().encode(entry)
    assert reader.decode(entry_key_bytes(entry), plain) == entry
    with pytest.raises(JournalDecodeError, match="schema id"):
        reader.decode(entry_key_bytes(entry), b"\x00\x00\x00\x30\x39" + data[5:])
