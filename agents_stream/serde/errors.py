"""Errors of the serialization layer.

Journal records that cannot be decoded raise
:class:`agents_stream.durable.errors.JournalDecodeError` (it names the slot); input and
output values raise :class:`ValueDecodeError`, which the worker routes to the DLQ.
"""

from __future__ import annotations

from ..errors import AgentsStreamError


class SerdeError(AgentsStreamError):
    """Base of serialization errors."""


class SchemaError(SerdeError):
    """A schema file is missing, unparsable, or breaks the promised compatibility."""


class ValueDecodeError(SerdeError):
    """An input or output value could not be decoded.

    Attributes:
        reason: why, in words an operator can act on (framing, unknown schema, ...).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot decode value: {reason}")
        self.reason = reason


class ValueEncodeError(SerdeError):
    """A value does not fit the configured schema (or is not JSON-serializable)."""
