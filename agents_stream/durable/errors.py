"""Errors of the durable core; each carries the structured identity of the slot involved."""

from __future__ import annotations

from ..errors import AgentsStreamError


class DurableError(AgentsStreamError):
    """Base of durable-execution errors."""


class CodeBlockViolation(DurableError):
    """Memory or events were touched inside a code block, where they cannot be journaled."""


class KeylessRecordError(DurableError):
    """An action of a record without a key touched short-term memory or timers (per key).

    Keyless records are independent of each other: no shared order, no shared memory.
    """

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"record {topic}[{partition}]@{offset} has no key: short-term memory is per key; "
            "key your records or keep state elsewhere"
        )


class DurableCallError(DurableError):
    """A journaled exception whose original type cannot be rebuilt here.

    Raised on replay instead of the original exception when its class is not loaded in
    this process (classes are never imported on behalf of journal data).
    """

    def __init__(self, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.original_message = message
        self.original_traceback = traceback


class PayloadError(DurableError):
    """A result or argument could not be encoded by the configured payload codec."""


class UnsupportedValueError(PayloadError, TypeError):
    """A call argument, result or exception argument is outside the journaled value
    domain (see :mod:`agents_stream.durable.values`); names the type and where it is.

    Raised when the call is made (arguments: before PENDING and before the function
    runs) or before the result is journaled, never at replay.
    """


class ResultTooLargeError(PayloadError):
    """A call's encoded result does not fit in one journal record.

    Checked before the result is produced, so the failure is journaled (and replayed)
    like any other instead of surfacing as a broker error after the call ran.
    """


class JournalDecodeError(DurableError):
    """A journal record could not be decoded; names the slot so operators can find it."""

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
        super().__init__(f"cannot decode journal record ({where}): {reason}")
        self.reason = reason
        self.key = key
        self.seq = seq
        self.action = action
        self.index = index


class NonDeterminismError(DurableError):
    """Strict mode: a replayed action called something other than what was journaled."""

    def __init__(
        self,
        *,
        key: str,
        seq: int,
        action: str,
        index: int,
        expected: tuple[str, str],
        recorded: tuple[str, str],
    ) -> None:
        super().__init__(
            f"non-deterministic replay of key={key!r} seq={seq} action={action!r} "
            f"call_index={index}: the action now calls {expected[0]} (args {expected[1]}) "
            f"but the journal recorded {recorded[0]} (args {recorded[1]}). Keep the call "
            "order of in-flight actions stable across deploys, or disable strict mode to "
            "truncate and re-execute."
        )
        self.key, self.seq, self.action, self.index = key, seq, action, index
        self.expected, self.recorded = expected, recorded


# Errors no host may skip past: the journal cannot be trusted (or, in strict mode, no
# longer matches the code), so the record stays uncommitted and the host stops.
FATAL_ERRORS: tuple[type[DurableError], ...] = (JournalDecodeError, NonDeterminismError)
