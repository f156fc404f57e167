"""The generated Avro codec against fastavro, the reference model.

Every value fastavro writes must come out of the compiled encoder byte for byte, and
every body fastavro writes must decode to what fastavro's reader returns (tuple shape of
record unions included); damaged bodies fail only with ValueDecodeError.
"""

from __future__ import annotations

import io
import math
import string

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.durable.journal import InputProgress, TimerEntry
from agents_stream.serde import default_journal_codec
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.compiled import compile_schema
from agents_stream.serde.errors import ValueDecodeError, ValueEncodeError
from agents_stream.serde.journal import to_datum
from agents_stream.serde.schemas import SchemaVersion

from .fixtures import _int, _long, _text, journal_entries, sample_entries

JOURNAL = default_journal_codec()
SCHEMA = JOURNAL.serde.writer
ENC, DEC = compile_schema(SCHEMA.parsed, record_names=True)
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

all_entries = st.one_of(
    journal_entries,
    st.builds(TimerEntry, key=_text, kind=_text, ts=_long, agent=_text, partition=_int),
    st.builds(
        InputProgress, topic=_text, partition=_int, offset=_long, at_ms=_long, worker_id=_text
    ),
)


def fa_write(parsed, datum) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parsed, datum)
    return out.getvalue()


def fa_read(parsed, data: bytes, record_names: bool):
    return schemaless_reader(
        io.BytesIO(data),
        parsed,
        None,
        return_record_name=record_names,
        return_record_name_override=record_names,
    )


def same(a, b) -> bool:
    """Equality where NaN equals NaN (floats round-trip their bits)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@PROPS
@given(all_entries)
def test_journal_entries_match_fastavro(entry):
    datum = {"entry": to_datum(entry)}
    reference = fa_write(SCHEMA.parsed, datum)
    assert ENC(b"", datum) == reference
    value, end = DEC(reference, 0)
    assert end == len(reference)
    assert same(value, fa_read(SCHEMA.parsed, reference, True))
    assert JOURNAL.decode(b"", JOURNAL.encode(entry)) == entry


@pytest.mark.parametrize("entry", sample_entries(), ids=lambda e: type(e).__name__)
def test_serde_uses_compiled_bytes(entry):
    datum = {"entry": to_datum(entry)}
    assert JOURNAL.serde.encode(datum) == JOURNAL.serde.header() + fa_write(SCHEMA.parsed, datum)


# -- random schemas and data ---------------------------------------------------------------
_names = iter(f"T{i}" for i in range(10**9))
_PRIMS = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]


def _schemas(depth: int):
    leaf = (
        st.sampled_from(_PRIMS[1:])
        | st.builds(
            lambda syms: {"type": "enum", "name": next(_names), "symbols": syms},
            st.lists(
                st.sampled_from(list(string.ascii_uppercase)), min_size=1, max_size=4, unique=True
            ),
        )
        | st.builds(
            lambda size: {"type": "fixed", "name": next(_names), "size": size}, st.integers(0, 5)
        )
    )
    if depth == 0:
        return leaf
    inner = _schemas(depth - 1)
    record = st.builds(
        lambda types: {
            "type": "record",
            "name": next(_names),
            "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)],
        },
        st.lists(inner, max_size=4),
    )
    union = st.lists(
        st.sampled_from(_PRIMS)
        | record
        | st.builds(lambda s: {"type": "array", "items": s}, inner),
        min_size=1,
        max_size=4,
    ).filter(_valid_union)
    return (
        leaf
        | record
        | union
        | st.builds(lambda s: {"type": "array", "items": s}, inner)
        | st.builds(lambda s: {"type": "map", "values": s}, inner)
    )


def _valid_union(branches) -> bool:
    kinds = [b if isinstance(b, str) else b["type"] for b in branches]
    unnamed = [k for k in kinds if k not in ("record", "enum", "fixed")]
    return len(unnamed) == len(set(unnamed)) and "union" not in kinds


def _data(s, draw, record_names: bool):
    if isinstance(s, list):
        i = draw(st.integers(0, len(s) - 1))
        value = _data(s[i], draw, record_names)
        named = isinstance(s[i], dict) and s[i]["type"] == "record"
        if named and draw(st.booleans()):
            return (s[i]["name"], value)
        return value
    t = s if isinstance(s, str) else s["type"]
    simple = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": _int,
        "long": _long,
        "float": st.floats(width=32),
        "double": st.floats(),
        "bytes": st.binary(max_size=20),
        "string": st.text(max_size=10),
    }
    if t in simple:
        return draw(simple[t])
    if t == "enum":
        return draw(st.sampled_from(s["symbols"]))
    if t == "fixed":
        return draw(st.binary(min_size=s["size"], max_size=s["size"]))
    if t == "array":
        return [_data(s["items"], draw, record_names) for _ in range(draw(st.integers(0, 3)))]
    if t == "map":
        keys = draw(st.lists(st.text(max_size=5), max_size=3, unique=True))
        return {k: _data(s["values"], draw, record_names) for k in keys}
    return {f["name"]: _data(f["type"], draw, record_names) for f in s["fields"]}


@st.composite
def schema_and_datum(draw):
    raw = draw(_schemas(3))
    return raw, _data(raw, draw, True), draw(st.booleans())


@PROPS
@given(schema_and_datum())
def test_random_schemas_match_fastavro(case):
    raw, datum, record_names = case
    parsed = parse_schema(raw, named_schemas={})
    compiled = compile_schema(parsed, record_names=record_names)
    assert compiled is not None
    enc, dec = compiled
    try:
        reference = fa_write(parsed, datum)
    except Exception:
        # fastavro rejects it (e.g. a union value it cannot place): the serde must too.
        with pytest.raises(ValueEncodeError):
            AvroSerde([SchemaVersion.from_raw(raw)], record_names=record_names).encode(datum)
        return
    try:
        mine = enc(b"", datum)
    except Exception:
        mine = None  # declined: the serde falls back to fastavro
    assert mine is None or mine == reference
    value, end = dec(reference, 0)
    assert end == len(reference)
    assert same(value, fa_read(parsed, reference, record_names))
    serde = AvroSerde([SchemaVersion.from_raw(raw)], record_names=record_names)
    assert serde.encode(datum) == serde.header() + reference


@st.composite
def damaged(draw):
    entry = draw(all_entries)
    data = bytearray(JOURNAL.serde.encode({"entry": to_datum(entry)}))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data) - 1))]
    else:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(10, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


@PROPS
@given(damaged())
def test_damaged_bodies_raise_value_decode_error(data):
    try:
        JOURNAL.serde.decode(data)
    except ValueDecodeError:
        pass


def test_misfit_datums_raise_value_encode_error_naming_the_schema():
    datum = {"entry": to_datum(sample_entries()[0])}
    datum["entry"][1]["index"] = "three"
    with pytest.raises(ValueEncodeError, match=r"ActionState v\d+"):
        JOURNAL.serde.encode(datum)
    with pytest.raises(ValueEncodeError, match=r"ActionState v\d+"):
        JOURNAL.serde.encode({"entry": ("agents_stream.journal.Nope", {})})


def test_trailing_bytes_are_reported():
    data = JOURNAL.encode(sample_entries()[0]) + b"\x00"
    with pytest.raises(ValueDecodeError, match="1 trailing bytes"):
        JOURNAL.serde.decode(data)


def test_logical_types_are_left_to_fastavro():
    raw = {
        "type": "record",
        "name": "L",
        "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    assert compile_schema(parse_schema(raw, named_schemas={}), record_names=False) is None


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_buffers_decode_like_bytes(wrap):
    entry = sample_entries()[0]
    assert JOURNAL.decode(b"", wrap(JOURNAL.encode(entry))) == entry
