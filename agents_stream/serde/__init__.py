"""Serialization: the journal codec, input/output value codecs, versioned Avro schemas."""

from .errors import SchemaError, SerdeError, ValueDecodeError, ValueEncodeError
from .journal import JournalCodec, default_journal_codec

__all__ = [
    "JournalCodec",
    "SchemaError",
    "SerdeError",
    "ValueDecodeError",
    "ValueEncodeError",
    "default_journal_codec",
]
