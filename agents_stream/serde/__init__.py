"""Serialization: the journal codec, input/output value codecs, versioned Avro schemas."""

from .errors import (
    JournalEncodeError,
    SchemaError,
    SerdeError,
    ValueDecodeError,
    ValueEncodeError,
)
from .journal import JournalCodec, default_journal_codec

__all__ = [
    "JournalCodec",
    "JournalEncodeError",
    "SchemaError",
    "SerdeError",
    "ValueDecodeError",
    "ValueEncodeError",
    "default_journal_codec",
]
