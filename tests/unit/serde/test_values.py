"""Value codecs of input/output topics."""

from __future__ import annotations

import json

import pytest

from agents_stream.errors import AgentsStreamError
from agents_stream.serde.errors import SchemaError, ValueDecodeError, ValueEncodeError
from agents_stream.serde.values import value_codec

SCHEMA = {
    "type": "record",
    "name": "UserEvent",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}
VALUE = {"user": "u1", "amount": 2.5, "tags": ["a"]}


def test_json_default():
    codec = value_codec(None)
    assert codec.decode(codec.encode({"a": [1, "é"]})) == {"a": [1, "é"]}
    with pytest.raises(ValueDecodeError, match="not JSON"):
        codec.decode(b"{nope")
    with pytest.raises(ValueDecodeError, match="UTF-8"):
        codec.decode(b"\xff\xfe")
    with pytest.raises(ValueEncodeError):
        codec.encode(object())
    assert issubclass(ValueDecodeError, AgentsStreamError)


@pytest.mark.parametrize("form", ["dict", "json", "path", "str-path"])
def test_avro_schema_forms(form, tmp_path):
    path = tmp_path / "user.avsc"
    path.write_text(json.dumps(SCHEMA))
    schema = {"dict": SCHEMA, "json": json.dumps(SCHEMA), "path": path, "str-path": str(path)}
    codec = value_codec(schema[form])
    data = codec.encode(VALUE)
    assert data[:2] == b"\xc3\x01"
    assert codec.decode(data) == VALUE


def test_avro_rejects_foreign_and_corrupt_values():
    codec = value_codec(SCHEMA)
    with pytest.raises(ValueDecodeError, match="unknown framing"):
        codec.decode(json.dumps(VALUE).encode())
    with pytest.raises(ValueDecodeError):
        codec.decode(codec.encode(VALUE)[:-2])
    other = value_codec({**SCHEMA, "name": "Other"})
    with pytest.raises(ValueDecodeError, match="fingerprint"):
        codec.decode(other.encode(VALUE))
    with pytest.raises(ValueEncodeError):
        codec.encode({"user": "u1", "amount": "not a number"})


def test_bad_schemas():
    with pytest.raises(SchemaError):
        value_codec({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(SchemaError, match="cannot read"):
        value_codec("/nonexistent/x.avsc")


def test_avro_with_registry_resolves_other_versions():
    url = "mock://values-test"
    old_schema = {**SCHEMA, "fields": SCHEMA["fields"][:2]}
    old = value_codec(old_schema, registry_url=url, subject="events-value")
    new = value_codec(SCHEMA, registry_url=url, subject="events-value")
    data = old.encode({"user": "u1", "amount": 1.0})
    assert data[:1] == b"\x00"
    assert new.decode(data) == {"user": "u1", "amount": 1.0, "tags": []}
