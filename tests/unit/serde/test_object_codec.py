"""The journal's object codecs (dataclass <-> bytes, no dicts) against fastavro.

The reference is the same codec on fastavro alone (``AvroSerde(compiled=False)``), which
goes through ``to_datum``/``from_datum`` and fastavro's writer and reader: the fast path
must write the same bytes, read the same dataclasses, and fail on the same values.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.durable.errors import JournalDecodeError
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    CompletionGroup,
    ExceptionInfo,
    MemoryUpdate,
    SentEvent,
    TimerUpdate,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import ValueEncodeError, default_journal_codec
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.compiled import _varint
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

from .fixtures import sample_entries

FAST = default_journal_codec()
REFERENCE = JournalCodec(AvroSerde(load_versions(JOURNAL_RECORD_TYPE), compiled=False))
# The dict path over the schema-compiled serde: stricter than fastavro on corrupt bodies
# (a boolean byte other than 0/1 is an error), which the fast path must stay.
GENERAL = JournalCodec(AvroSerde(load_versions(JOURNAL_RECORD_TYPE)))
GENERAL._fast_enc, GENERAL._fast_dec = {}, {}
PROPS = settings(max_examples=300, deadline=None)

_text = st.text(max_size=12)  # any code point: multi-byte UTF-8 lengths too
_blob = st.binary(max_size=24)
# Edges of every varint width, not just small values.
_long = st.integers(-(2**63), 2**63 - 1) | st.sampled_from(
    [0, -1, 63, -64, 64, 8191, 8192, 2**20, 1_700_000_000_000, 2**62, -(2**63), 2**63 - 1]
)
_int = st.integers(-(2**31), 2**31 - 1)
refs = st.builds(ActionRef, _text, _long, _text, _int, _text)
exceptions = st.builds(ExceptionInfo, _text, _text, _text, st.none() | _blob)
calls = st.builds(
    CallEntry,
    ref=refs,
    index=_int,
    function_id=_text,
    args_digest=_text,
    status=st.sampled_from(CallStatus),
    result=st.none() | _blob,
    exception=st.none() | exceptions,
    call_id=_text,
    started_ms=_long,
    finished_ms=_long,
    attempts=_int,
    worker_id=_text,
)
dones = st.builds(
    ActionDone,
    ref=refs,
    memory_updates=st.lists(st.builds(MemoryUpdate, _text, st.none() | _blob), max_size=3).map(
        tuple
    ),
    outputs=st.lists(_blob, max_size=3).map(tuple),
    events=st.lists(st.builds(SentEvent, _text, _blob), max_size=3).map(tuple),
    calls=_int,
    finished_ms=_long,
    emitted=st.booleans(),
    timers=st.lists(
        st.builds(TimerUpdate, st.sampled_from(["event", "processing"]), _long, st.booleans()),
        max_size=2,
    ).map(tuple),
    memory_version=_long,
    emitted_outputs=st.lists(st.integers(0, 2**31 - 1), max_size=3).map(tuple),
)
groups = st.builds(
    CompletionGroup,
    topic=_text,
    partition=_int,
    group=_text,
    dones=st.lists(dones, max_size=4).map(tuple),
    at_ms=_long,
)
entries = calls | dones | groups


def _same_types(a: object, b: object) -> None:
    assert type(a) is type(b)
    if isinstance(a, tuple | list):
        assert isinstance(b, tuple | list)
        for x, y in zip(a, b, strict=True):
            _same_types(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:  # type: ignore[attr-defined]
            _same_types(getattr(a, name), getattr(b, name))


def test_calls_and_completions_take_the_fast_path():
    assert set(FAST._fast_enc) == {CallEntry, ActionDone, CompletionGroup}
    assert len(FAST._fast_dec) == 3
    assert not REFERENCE._fast_enc and not REFERENCE._fast_dec


@PROPS
@given(entries)
def test_same_bytes_and_entries_as_fastavro(entry):
    key = entry_key_bytes(entry)
    data = FAST.encode(entry)
    assert data == REFERENCE.encode(entry)
    decoded = FAST.decode(key, data)
    reference = REFERENCE.decode(key, data)
    assert decoded == reference == entry
    _same_types(decoded, reference)
    assert decoded.__dict__ == reference.__dict__  # built without __init__: same fields


@pytest.mark.parametrize(
    "entry", [e for e in sample_entries() if isinstance(e, CallEntry | ActionDone)]
)
def test_decoding_does_not_go_through_dicts(entry, monkeypatch):
    data = FAST.encode(entry)

    def no_dicts(*_):
        raise AssertionError("general path taken")

    monkeypatch.setattr(FAST.serde, "decode", no_dicts)
    monkeypatch.setattr(FAST.serde, "encode", no_dicts)
    assert FAST.encode(entry) == data
    assert FAST.decode(entry_key_bytes(entry), data) == entry


@st.composite
def damaged(draw, of=entries):
    """A valid value damaged after its head (frame + branch): what the fast path sees."""
    entry = draw(of)
    value = bytearray(FAST.encode(entry))
    how = draw(st.sampled_from(["truncate", "flip", "append", "replace"]))
    if how == "truncate":
        value = value[: draw(st.integers(11, len(value) - 1))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(11, len(value) - 1))
            value[pos] ^= 1 << draw(st.integers(0, 7))
    elif how == "append":
        value += draw(st.binary(min_size=1, max_size=8))
    else:
        value = value[:11] + draw(st.binary(max_size=60))
    return entry, bytes(value)


@PROPS
@given(damaged())
def test_damaged_values_fail_like_fastavro(case):
    """Decodes to what the dict path reads (fastavro's values, see
    test_compiled.py), or fails naming the slot where it fails, never otherwise."""
    entry, value = case
    key = entry_key_bytes(entry)
    try:
        expected = GENERAL.decode(key, value)
    except JournalDecodeError as general:
        with pytest.raises(JournalDecodeError) as info:
            FAST.decode(key, value)
        for where in ("key", "seq", "action", "index"):
            assert getattr(info.value, where) == getattr(general, where)
        return
    assert FAST.decode(key, value) == expected


def test_non_canonical_varints_read_like_fastavro():
    """Padded varints (never written, but valid Avro) read as fastavro reads them."""
    entry = sample_entries()[1]
    canonical = FAST.encode(entry)
    seq = _varint(entry.ref.seq << 1)
    padded = bytearray(seq)
    padded[-1] |= 0x80
    padded += b"\x00"
    # The body starts with key, then seq: pad the seq varint by one byte.
    start = 11 + 1 + len(entry.ref.key.encode())
    assert canonical[start : start + len(seq)] == seq
    value = canonical[:start] + bytes(padded) + canonical[start + len(seq) :]
    key = entry_key_bytes(entry)
    assert FAST.decode(key, value) == REFERENCE.decode(key, value) == entry


@pytest.mark.parametrize(
    "entry",
    [
        CallEntry(ActionRef("k", 1, "a"), 2**31, "f", "d", CallStatus.SUCCEEDED),
        CallEntry(ActionRef("k", 2**63, "a"), 0, "f", "d", CallStatus.SUCCEEDED),
        CallEntry(ActionRef("k", 1, "a"), 0, "f", "d", CallStatus.SUCCEEDED, result="text"),  # type: ignore[arg-type]
        ActionDone(ActionRef("k", 1, "a"), outputs=("text",)),  # type: ignore[arg-type]
        ActionDone(ActionRef("k", 1, "a"), memory_version=-(2**63) - 1),
    ],
)
def test_values_the_fast_path_declines_encode_like_fastavro(entry):
    """Out of range or of the wrong type: fastavro decides (writes it, or says why not)."""
    try:
        expected = REFERENCE.encode(entry)
    except ValueEncodeError:
        with pytest.raises(ValueEncodeError):
            FAST.encode(entry)
    else:
        assert FAST.encode(entry) == expected


def test_subclasses_take_the_general_path():
    class Tagged(CallEntry):
        pass

    entry = Tagged(ActionRef("k", 1, "a"), 0, "f", "d", CallStatus.SUCCEEDED)
    assert FAST.encode(entry) == REFERENCE.encode(entry)


def test_buffers_other_than_bytes_decode_alike():
    entry = sample_entries()[3]
    data = FAST.encode(entry)
    key = entry_key_bytes(entry)
    assert FAST.decode(key, bytearray(data)) == FAST.decode(key, memoryview(data)) == entry


@PROPS
@given(dones, st.sampled_from([FAST, GENERAL, REFERENCE]))
def test_the_emitted_marker_is_the_entry_encoded_with_emitted_set(done, codec):
    """The marker flips one byte of the bytes its ActionDone was written with; it must
    be what encoding the marked entry from scratch gives."""
    from agents_stream.durable.runner import _emitted

    done = dataclasses.replace(done, emitted=False)
    assert codec.encode(done) == REFERENCE.encode(dataclasses.replace(done, emitted=False))
    marked = _emitted(done)
    expected = REFERENCE.encode(dataclasses.replace(done, emitted=True))
    assert codec.encode(marked) == expected
    assert FAST.encode(_emitted(done)) == expected  # another codec's bytes are not used
    assert FAST.decode(entry_key_bytes(marked), expected) == marked


def test_the_marker_of_a_plain_completion_is_not_encoded_again(monkeypatch):
    from agents_stream.durable.runner import _emitted

    codec = default_journal_codec()
    done = ActionDone(ActionRef("k", 3, "A.f#0", 1, "orders"), outputs=(b"{}",), emitted=False)
    codec.encode(done)
    monkeypatch.setattr(codec, "_encode", lambda entry: pytest.fail("encoded again"))
    assert codec.decode(b"", codec.encode(_emitted(done))).emitted


# -- projections: a few fields of every record, for the audit -------------------------------
_ALL_FIELDS = {
    CallEntry: ("key", "seq", "action", "index", "function_id", "args_digest", "result",
                "exception", "status", "partition", "call_id", "started_ms", "finished_ms",
                "attempts", "worker_id", "topic"),
    ActionDone: ("key", "seq", "action", "partition", "calls", "finished_ms", "emitted",
                 "memory_version", "topic"),
}  # fmt: skip
_REF_FIELDS = ("key", "seq", "action", "partition", "topic")


def _field(entry, name):
    """An entry's Avro field as the projection reads it (a status is its enum symbol)."""
    if name in _REF_FIELDS:
        return getattr(entry.ref, name)
    value = getattr(entry, name)
    return value.value if isinstance(value, CallStatus) else value


@st.composite
def _wanted(draw, kind):
    names = _ALL_FIELDS[kind]
    return tuple(draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))))


@PROPS
@given(st.data())
def test_a_projection_reads_the_fields_the_full_decode_reads(data):
    entry = data.draw(calls | dones)  # projections are of calls and completions
    fields = data.draw(_wanted(type(entry)))
    head, project = FAST.projection(type(entry), fields)
    value = FAST.encode(entry)
    assert value[:11] == head
    got, end = project(value, 11)
    assert end == len(value)
    assert got == tuple(_field(entry, name) for name in fields)


@PROPS
@given(damaged(calls | dones), st.data())
def test_a_projection_fails_on_the_bodies_the_full_decode_fails_on(case, data):
    entry, value = case
    fields = data.draw(_wanted(type(entry)))
    _, project = FAST.projection(type(entry), fields)
    try:
        got, end = project(value, 11)
    except Exception:
        failed = True
    else:
        failed = end != len(value)
    try:
        decoded = FAST.decode(entry_key_bytes(entry), value)
    except JournalDecodeError:
        assert failed
        return
    assert not failed
    assert type(decoded) is type(entry)  # the head names the kind
    assert got == tuple(_field(decoded, name) for name in fields)


def test_projections_need_the_compiled_path_and_a_known_kind():
    assert REFERENCE.projection(CallEntry, ("key",)) is None
    assert FAST.projection(CallEntry, ("no_such_field",)) is None
    assert FAST.projection(ActionRef, ("key",)) is None  # type: ignore[arg-type]
    assert FAST.projection(CallEntry, ("key",)) is FAST.projection(CallEntry, ("key",))


def test_recurring_strings_encode_alike_past_the_table_limit_and_fail_alike(monkeypatch):
    """Topics, actions, function and worker ids are encoded once per distinct value
    (``ObjectBinding.recurring``): the same bytes for a value seen before, for one seen
    after the table is full, and the same error for a value that is not a string."""
    from agents_stream.serde import compiled

    monkeypatch.setattr(compiled, "RECURRING_LIMIT", 3)
    codec = default_journal_codec()  # a table of its own
    for n in range(8):
        ref = ActionRef("k", n, f"Agent.act#{n % 5}", 0, f"topic-{n}-\u00e9")
        entry = CallEntry(ref, 0, f"mod.f{n}", "d", CallStatus.SUCCEEDED, worker_id="w")
        for _ in range(2):  # a miss, then (while the table has room) a hit
            assert codec.encode(entry) == REFERENCE.encode(entry)
    wrong = CallEntry(ActionRef("k", 1, "a#0", 0, 7), 0, "f", "d", CallStatus.SUCCEEDED)  # type: ignore[arg-type]
    with pytest.raises(ValueEncodeError) as fast:
        codec.encode(wrong)
    assert "topic" in str(fast.value)
