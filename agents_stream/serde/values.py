"""Codecs of input and output topic values: JSON by default, Avro when a schema is given.

A value that cannot be decoded raises :class:`ValueDecodeError`; the worker sends such a
record to the DLQ instead of stopping the partition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from ..durable import jsontext
from ..durable.values import plain_bytes
from ..errors import ConfigurationError
from .avro import AvroSerde
from .errors import SchemaError, ValueDecodeError, ValueEncodeError
from .framing import CONFLUENT_MAGIC
from .registry import RegistryBinding, schema_by_id
from .schemas import SchemaVersion
from .subjects import value_subject


class ValueCodec(Protocol):
    """Turns topic values into Python data and back."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # built once


class JsonValueCodec:
    """UTF-8 JSON (the default when no schema is configured)."""

    def encode(self, value: Any) -> bytes:
        """Raises ValueEncodeError: ``value`` is not JSON-serializable."""
        plain = plain_bytes(value)  # a plain tree: as its journaled bytes are written
        if plain is not None:
            return plain
        try:
            return _JSON.encode(value).encode()
        except (TypeError, ValueError) as exc:
            raise ValueEncodeError(f"value is not JSON-serializable: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        """Raises ValueDecodeError: ``data`` is not UTF-8 JSON."""
        try:
            # UTF-8 only (json.loads(bytes) would also guess UTF-16/32); see jsontext.
            return jsontext.loads(data)
        except UnicodeDecodeError as exc:
            raise ValueDecodeError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from exc
        except ValueError as exc:
            raise ValueDecodeError(f"not JSON ({exc})") from exc


class AvroValueCodec:
    """Avro values of one schema, single-object framed (Confluent with a registry).

    Decoding accepts either framing; with a registry, records written by other
    compatible versions of the subject are resolved onto this codec's schema.
    """

    def __init__(self, schema: SchemaVersion, registry: RegistryBinding | None = None) -> None:
        self.schema = schema
        self._serde = AvroSerde([schema], registry=registry, record_names=False)

    def encode(self, value: Any) -> bytes:
        """Raises ValueEncodeError: ``value`` does not fit the schema."""
        return self._serde.encode(value)

    def decode(self, data: bytes) -> Any:
        """Raises ValueDecodeError: wrong framing, unknown writer, corrupt body."""
        return self._serde.decode(data)


class RegistryValueReader:
    """Decodes registry-framed values of any schema by the writer schema their id names
    (what ``agents-stream tail`` shows without an App schema); other values as JSON.

    Raises ValueEncodeError on :meth:`encode`: writing needs a schema (``App.agent``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._json = JsonValueCodec()

    def encode(self, value: Any) -> bytes:
        raise ValueEncodeError(
            "no value schema for this topic: producing Avro through the registry needs "
            "-A with an agent whose input_schema/output_schema covers it"
        )

    def decode(self, data: bytes) -> Any:
        """Raises ValueDecodeError: unknown schema id, corrupt body, or not JSON."""
        if data[:1] != CONFLUENT_MAGIC or len(data) < 5:
            return self._json.decode(data)
        schema_id = int.from_bytes(data[1:5], "big")
        try:
            writer = schema_by_id(self.url, schema_id)
        except SchemaError as exc:
            raise ValueDecodeError(str(exc)) from exc
        return AvroSerde(
            [writer], registry=RegistryBinding(self.url, "-"), record_names=False
        ).decode(data)


def value_codec(
    schema: str | Path | dict[str, Any] | None,
    *,
    registry_url: str | None = None,
    subject: str | None = None,
    topic: str | None = None,
    strategy: str = "topic",
) -> ValueCodec:
    """Build the codec of a topic's values.

    Args:
        schema: ``None`` for JSON; else an Avro schema as a dict, a JSON string, or the
            path of an ``.avsc`` file.
        registry_url: Schema Registry URL: switches Avro to the Confluent wire format.
        subject: registry subject; with a registry, it or ``topic`` is required.
        topic: the topic, whose subject ``strategy`` names (``serde/subjects.py``).
        strategy: ``topic`` (``<topic>-value``), ``record`` or ``topic_record``.

    Raises:
        ConfigurationError: a registry without a subject or topic.
        SchemaError: the schema cannot be read or is not valid Avro.
    """
    if schema is None:
        return JsonValueCodec()
    parsed = SchemaVersion.from_raw(_load_schema(schema), record_type="value")
    registry = None
    if registry_url:
        if not subject and topic:
            subject = value_subject(topic, parsed.raw, strategy)
        if not subject:
            raise ConfigurationError("an Avro value codec with a registry needs a subject")
        registry = RegistryBinding(registry_url, subject)
    return AvroValueCodec(parsed, registry)


def load_value_schema(schema: str | Path | dict[str, Any]) -> SchemaVersion:
    """A value schema given as on ``App.agent`` (dict, JSON text or ``.avsc`` path)."""
    return SchemaVersion.from_raw(_load_schema(schema), record_type="value")


def _load_schema(schema: str | Path | dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        return schema
    text = str(schema)
    if isinstance(schema, str) and text.lstrip()[:1] in ("{", "[", '"'):
        source = "inline schema"
    else:
        path = Path(schema)
        source = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SchemaError(f"cannot read schema file {path}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"{source} is not JSON: {exc}") from exc
