"""Decoders never raise anything but their typed errors, whatever the bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.durable.errors import JournalDecodeError
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.serde.errors import ValueDecodeError
from agents_stream.serde.values import value_codec

from .fixtures import journal_entries

JOURNAL = default_journal_codec()
VALUE_SCHEMA = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "n", "type": ["null", "long"]},
        {"name": "tags", "type": {"type": "map", "values": "bytes"}},
    ],
}
AVRO_VALUES = value_codec(VALUE_SCHEMA)
JSON_VALUES = value_codec(None)
FUZZ = settings(max_examples=300, deadline=None)


def journal_decodes_or_raises_typed(key: bytes, data: bytes) -> None:
    try:
        JOURNAL.decode(key, data)
    except JournalDecodeError:
        pass


@st.composite
def damaged(draw):
    """A valid journal value truncated, bit-flipped or extended."""
    entry = draw(journal_entries)
    data = bytearray(JOURNAL.encode(entry))
    how = draw(st.sampled_from(["truncate", "flip", "append"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
    else:
        data += draw(st.binary(min_size=1, max_size=8))
    return entry_key_bytes(entry), bytes(data)


@FUZZ
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_journal_random_bytes(key, data):
    journal_decodes_or_raises_typed(key, data)


@FUZZ
@given(st.binary(max_size=64))
def test_journal_random_body_after_valid_header(body):
    journal_decodes_or_raises_typed(b"c\x1fk\x1f1\x1fA#0\x1f0", JOURNAL.serde.header() + body)


@FUZZ
@given(damaged())
def test_journal_damaged_values(case):
    journal_decodes_or_raises_typed(*case)


@FUZZ
@given(st.binary(max_size=64), st.booleans())
def test_value_codecs_random_bytes(body, framed):
    data = AVRO_VALUES.encode({"user": "", "n": None, "tags": {}})[:10] + body if framed else body
    for codec in (AVRO_VALUES, JSON_VALUES):
        try:
            codec.decode(data)
        except ValueDecodeError:
            pass
