"""Errors of the serialization layer.

Journal records that cannot be decoded raise
:class:`agents_stream.durable.errors.JournalDecodeError` (it names the slot), entries that
cannot be encoded :class:`JournalEncodeError` (likewise); input and output values raise
:class:`ValueDecodeError`, which the worker routes to the DLQ.
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


class JournalEncodeError(ValueEncodeError):
    """A journal entry could not be encoded; names the slot (key, seq, action, call
    index) the way :class:`~agents_stream.durable.errors.JournalDecodeError` does for
    reads, and the schema in ``reason``.

    Raised for a value that fits no schema branch (fastavro's reason) and for a failure
    of the generated encoder itself (said as such); nothing is written in either case.
    """

    def __init__(
        self,
        reason: str,
        *,
        key: str | None = None,
        seq: int | None = None,
        action: str | None = None,
        index: int | None = None,
    ) -> None:
        where = f"key={key!r} seq={seq} action={action!r} call_index={index}"
        super().__init__(f"cannot encode journal record ({where}): {reason}")
        self.reason = reason
        self.key = key
        self.seq = seq
        self.action = action
        self.index = index


class RegistryError(SerdeError):
    """The schema registry could not give a schema or an id: a configuration or service
    problem, never a bad record. Hosts neither dead-letter nor commit a record over it
    (``host/policy.py``); at start-up the worker stops in one line with it.

    Attributes:
        subject: the registry subject (None for a lookup by id).
        version: what was being registered or looked up (``ActionState v6``, ``schema
            id 42``).
        reason: the server's own words (or the transport error), secrets scrubbed.
    """

    def __init__(self, message: str, *, subject: str | None, version: str, reason: str) -> None:
        super().__init__(message)
        self.subject = subject
        self.version = version
        self.reason = reason


class SchemaRefused(RegistryError):
    """The registry refused to register a schema (incompatible under the subject's
    compatibility level, invalid), or, with auto-registration off, does not hold it."""


class RegistryUnavailable(RegistryError):
    """The registry did not answer (connection refused, timeout, HTTP 5xx): transient."""
