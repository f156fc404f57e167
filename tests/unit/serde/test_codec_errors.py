"""Codec errors raise with the record named; nothing falls back silently (issue 41).

The one fallback left is documented and narrow: a value the generated encoder declines
with ``Misfit`` (outside its fast shape) is encoded by fastavro, counted and logged once.
Every other failure of generated code raises, naming key, seq, action and call index for
journal records (or the schema for plain Avro values); fastavro's bytes never stand in.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback

import pytest
from fastavro import parse_schema
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.durable.errors import JournalDecodeError
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    MemorySnapshot,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import JournalEncodeError, SchemaError, ValueEncodeError
from agents_stream.serde import journal as journal_module
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.compiled import (
    ObjectBinding,
    compile_object_codec,
    compile_projection,
    compile_schema,
)
from agents_stream.serde.journal import CALL, JournalCodec, default_journal_codec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, SchemaVersion, load_versions

from .test_object_codec import calls, dones

REF = ActionRef("user-7", 42, "Scoring.process#1", partition=3, topic="in")
CALL_ENTRY = CallEntry(REF, 5, "mod.fetch", "d1", CallStatus.SUCCEEDED, result=b"{}")
SLOT = ("user-7", 42, "Scoring.process#1", 5)
NAMED = ("key='user-7'", "seq=42", "action='Scoring.process#1'", "call_index=5")
VERSIONS = load_versions(JOURNAL_RECORD_TYPE)
LABEL = VERSIONS[-1].label  # "ActionState v7"
REFERENCE = JournalCodec(AvroSerde(VERSIONS, compiled=False))


def _names_the_slot(err: JournalEncodeError | JournalDecodeError, *, index: bool = True) -> None:
    assert (err.key, err.seq, err.action) == SLOT[:3]
    for part in NAMED if index else NAMED[:3]:
        assert part in str(err)
    if index:
        assert err.index == SLOT[3]


# -- decoding: a corrupt or garbage value --------------------------------------------------
@pytest.mark.parametrize(
    "damage",
    [
        lambda v: b"garbage, not a journal value",  # no framing at all
        lambda v: v[:11] + b"\xff" * 9,  # frame + branch, then a body that is not one
        lambda v: v[:-4],  # cut short
        lambda v: v + b"\x00",  # trailing bytes
    ],
    ids=["garbage", "corrupt-body", "truncated", "trailing"],
)
def test_a_corrupt_journal_value_raises_naming_the_slot(damage):
    codec = default_journal_codec()
    value = damage(codec.encode(CALL_ENTRY))
    with pytest.raises(JournalDecodeError) as info:
        codec.decode(entry_key_bytes(CALL_ENTRY), value)
    _names_the_slot(info.value)


@pytest.mark.parametrize("how", ["corrupt-body", "trailing"])
def test_a_corrupt_body_names_the_schema_and_what_failed(how):
    codec = default_journal_codec()
    value = codec.encode(CALL_ENTRY)
    value = value[:11] + b"\xff" * 9 if how == "corrupt-body" else value + b"\x00"
    with pytest.raises(JournalDecodeError) as info:
        codec.decode(entry_key_bytes(CALL_ENTRY), value)
    assert LABEL in info.value.reason
    if how == "corrupt-body":
        assert "corrupt body" in info.value.reason
    else:
        assert "1 trailing bytes" in info.value.reason


def test_a_generated_decoder_failure_raises_naming_the_slot(monkeypatch):
    """A decoder whose generated code fails (here: a binding that builds the entry
    wrongly) raises JournalDecodeError with the slot and the Python error, not None and
    not a retry through fastavro."""
    bindings = journal_module._bindings()
    call = bindings[CALL]
    broken = dataclasses.replace(call, build=lambda local: "_CallEntry(no_such_field=1)")
    monkeypatch.setattr(journal_module, "_bindings", lambda: {**bindings, CALL: broken})
    codec = JournalCodec(AvroSerde(VERSIONS))
    value = REFERENCE.encode(CALL_ENTRY)
    with pytest.raises(JournalDecodeError) as info:
        codec.decode(entry_key_bytes(CALL_ENTRY), value)
    _names_the_slot(info.value)
    assert "TypeError" in info.value.reason and LABEL in info.value.reason


# -- encoding: a value of a wrong type -------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"function_id": 5}, "must be string on field function_id"),
        ({"function_id": "\ud800"}, "surrogates not allowed"),
        ({"index": "three"}, "an integer is required on field index"),
        ({"result": "text"}, "on field result"),
        ({"status": "SUCCEEDED"}, "AttributeError"),
    ],
)
def test_a_wrong_type_raises_naming_the_slot_and_the_field(change, said):
    entry = dataclasses.replace(CALL_ENTRY, **change)
    with pytest.raises(JournalEncodeError) as info:
        default_journal_codec().encode(entry)
    err = info.value
    assert isinstance(err, ValueEncodeError)  # what callers caught before
    _names_the_slot(err, index="index" not in change)
    assert said in err.reason and LABEL in err.reason
    with pytest.raises(JournalEncodeError):  # fastavro refuses it too: same verdict
        REFERENCE.encode(entry)


def test_a_wrong_type_in_a_general_path_entry_names_the_key():
    values = {"n": "not bytes"}
    snapshot = MemorySnapshot(key="user-7", values=values, applied_seq=1)  # type: ignore[arg-type]
    with pytest.raises(JournalEncodeError) as info:
        default_journal_codec().encode(snapshot)
    assert info.value.key == "user-7" and "key='user-7'" in str(info.value)
    assert LABEL in info.value.reason


def test_a_misfit_is_encoded_by_fastavro_counted_and_logged_once(caplog):
    """The documented fallback: a value outside the fast shape (a list where the
    dataclass has a tuple is fine; a bytearray result is not) goes to fastavro."""
    codec = default_journal_codec()
    entry = dataclasses.replace(CALL_ENTRY, result=bytearray(b"{}"))
    with caplog.at_level(logging.WARNING, logger="agents_stream.serde"):
        assert codec.encode(entry) == REFERENCE.encode(entry) == codec.encode(CALL_ENTRY)
        assert codec.encode(entry) == REFERENCE.encode(entry)
    assert codec.misfits == {"CallEntry": 2}
    logged = [r.getMessage() for r in caplog.records if "fast shape" in r.getMessage()]
    assert len(logged) == 1
    for part in NAMED:
        assert part in logged[0]
    assert "CallResult.result" in logged[0] and LABEL in logged[0]


def test_a_misfit_that_fastavro_refuses_raises_naming_the_slot():
    done = ActionDone(REF, outputs=("text, not bytes",))  # type: ignore[arg-type]
    codec = default_journal_codec()
    with pytest.raises(JournalEncodeError) as info:
        codec.encode(done)
    _names_the_slot(info.value, index=False)
    assert "on field outputs" in info.value.reason
    assert codec.misfits == {"ActionDone": 1}


# -- encoding: the generated code itself fails ----------------------------------------------
def _codec_with_call_binding(monkeypatch: pytest.MonkeyPatch, **change: object) -> JournalCodec:
    bindings = journal_module._bindings()
    broken = dataclasses.replace(bindings[CALL], **change)
    monkeypatch.setattr(journal_module, "_bindings", lambda: {**bindings, CALL: broken})
    return JournalCodec(AvroSerde(VERSIONS))


def test_a_generated_encoder_failure_raises_and_is_not_replaced_by_fastavro(monkeypatch):
    """Generated code that reads a field that is not there (a codec bug) raises; the
    entry fits the schema (fastavro would write it), which the message says."""
    get = {**journal_module._REF_GET, "status": "{o}.status.value", "index": "{o}.no_index"}
    codec = _codec_with_call_binding(monkeypatch, get=get)
    with pytest.raises(JournalEncodeError) as info:
        codec.encode(CALL_ENTRY)
    err = info.value
    _names_the_slot(err)
    assert "AttributeError" in err.reason and "no_index" in err.reason
    assert "a bug of agents_stream.serde.compiled" in err.reason and LABEL in err.reason
    assert codec.misfits == {}
    # The traceback runs through the generated source, line shown (linecache).
    shown = "".join(traceback.format_exception(err.__cause__))
    assert "<avro encode #" in shown and "o.no_index" in shown


def test_a_generated_code_compile_failure_raises_at_construction_naming_the_schema(monkeypatch):
    with pytest.raises(SchemaError, match=r"CallResult.*SyntaxError"):
        _codec_with_call_binding(monkeypatch, build=lambda local: "((( not python")


def test_compile_schema_raises_on_a_broken_schema_and_declines_logical_types(caplog):
    broken = {"type": "record", "name": "Broken"}  # no fields: not a schema fastavro parses
    with pytest.raises(SchemaError, match=r"'Broken'.*KeyError"):
        compile_schema(broken, record_names=False)
    raw = {
        "type": "record",
        "name": "Stamped",
        "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    with caplog.at_level(logging.INFO, logger="agents_stream.serde"):
        assert compile_schema(parse_schema(raw, named_schemas={}), record_names=False) is None
    assert any("'Stamped'" in r.getMessage() for r in caplog.records)


def test_object_codec_and_projection_raise_on_a_bug_and_decline_an_unknown_field():
    record = next(b for b in VERSIONS[-1].parsed["fields"][0]["type"] if b.get("name") == CALL)
    bindings = journal_module._bindings()
    wrong = {**bindings, CALL: ObjectBinding(CallEntry, build=lambda local: "(((")}
    with pytest.raises(SchemaError, match="CallResult"):
        compile_object_codec(record, wrong)
    with pytest.raises(SchemaError, match="CallResult"):
        compile_projection(record, ("key", "status"), wrong)
    assert compile_projection(record, ("no_such_field",), bindings) is None


def test_the_dict_encoder_failing_raises_value_encode_error_naming_the_schema(monkeypatch):
    serde = AvroSerde(VERSIONS)
    datum = {"entry": journal_module.to_datum(CALL_ENTRY)}
    expected = serde.encode(datum)

    def broken(head: bytes, value: object) -> bytes:
        raise ZeroDivisionError("generated code went wrong")

    assert serde._enc is not None
    monkeypatch.setattr(serde, "_enc", (broken, serde._enc[1]))
    with pytest.raises(ValueEncodeError, match=f"ZeroDivisionError.*fits {LABEL}.*a bug"):
        serde.encode(datum)
    assert serde.encode_fastavro(datum) == expected  # the reference still writes it


def test_the_dict_encoder_leaves_a_missing_field_to_fastavro():
    """A record field missing from the dict is a Misfit (fastavro writes its default)."""
    raw = {
        "type": "record",
        "name": "WithDefault",
        "fields": [
            {"name": "a", "type": "long"},
            {"name": "b", "type": "string", "default": "x"},
        ],
    }
    version = SchemaVersion.from_raw(raw, record_type="WithDefault", version=1)
    serde = AvroSerde([version], record_names=False)
    reference = AvroSerde([version], record_names=False, compiled=False)
    assert serde.encode({"a": 3}) == reference.encode({"a": 3})
    assert serde.misfits == 1
    with pytest.raises(ValueEncodeError, match="WithDefault"):
        serde.encode({"a": "three", "b": "y"})


# -- property: compiled and fastavro agree, also on values of the wrong type ----------------
_any = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.lists(st.binary(max_size=2), max_size=2)
    | st.tuples(st.binary(max_size=2))
)
_CALL_FIELDS = [f.name for f in dataclasses.fields(CallEntry) if f.name not in ("ref",)]
_DONE_FIELDS = [f.name for f in dataclasses.fields(ActionDone) if f.name not in ("ref",)]


@st.composite
def mistyped(draw: st.DrawFn) -> object:
    entry = draw(calls | dones)
    names = _CALL_FIELDS if isinstance(entry, CallEntry) else _DONE_FIELDS
    name = draw(st.sampled_from(names))
    return dataclasses.replace(entry, **{name: draw(_any)})


@settings(max_examples=400, deadline=None)
@given(mistyped())
def test_compiled_and_fastavro_agree_on_any_value(entry):
    """Same bytes, or both refuse with an error naming the slot: the compiled path
    never writes what fastavro would not, and never fails where fastavro writes."""
    fast = default_journal_codec()
    try:
        expected = REFERENCE.encode(entry)
    except JournalEncodeError as reference:
        with pytest.raises(JournalEncodeError) as info:
            fast.encode(entry)
        assert (info.value.key, info.value.seq) == (reference.key, reference.seq)
        assert "a bug of" not in info.value.reason
        return
    assert fast.encode(entry) == expected
