"""The journal's record model: what an action's durable state is made of.

An *ActionState* is identified by ``(key, seq, action)``: the record key, the input
record's sequence number (its offset in the input partition, so re-consuming the same
record after a crash finds the same state) and the action id (``Agent.method#ordinal``,
the ordinal being the position of that action run within the record's processing).

The store appends one :class:`CallEntry` per call slot (not the whole state per call, so
bytes written grow linearly with calls), one :class:`ActionDone` when the action
finishes, one :class:`MemorySnapshot` per key after each completed action, and a
:class:`Truncation` whenever a replay diverged. Entries are immutable values; the
encoding lives behind :mod:`agents_stream.serde.journal`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class CallStatus(str, Enum):  # noqa: UP042 - str values are the wire format
    """Lifecycle of one call slot. PENDING exists only for reconcilable calls."""

    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self is not CallStatus.PENDING


@dataclass(frozen=True)
class ActionRef:
    """Identity of one action run: the ActionState key."""

    key: str
    seq: int
    action: str
    partition: int = 0

    def call_id(self, app_id: str, index: int) -> str:
        """Stable idempotency key of call ``index`` (same after any number of replays)."""
        return f"{app_id}:{self.key}:{self.seq}:{self.action}:{index}"


@dataclass(frozen=True)
class ExceptionInfo:
    """A journaled exception: enough to re-raise an equivalent one without pickle."""

    type: str  # "module.QualName"
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class CallEntry:
    """One call slot of an action: identity of the call plus its outcome."""

    ref: ActionRef
    index: int
    function_id: str
    args_digest: str
    status: CallStatus
    result: bytes | None = None  # payload-codec bytes, SUCCEEDED only
    exception: ExceptionInfo | None = None  # FAILED only
    call_id: str = ""
    started_ms: int = 0
    finished_ms: int = 0
    attempts: int = 1
    worker_id: str = ""


@dataclass(frozen=True)
class SentEvent:
    """An event an action sent: replayed to re-trigger downstream actions after a crash."""

    type: str  # registered event type name
    payload: bytes  # JSON of the event's fields


@dataclass(frozen=True)
class MemoryUpdate:
    name: str
    value: bytes | None  # JSON; None deletes the entry


@dataclass(frozen=True)
class ActionDone:
    """An action finished: what it changed, kept so recovery can apply it exactly once."""

    ref: ActionRef
    memory_updates: tuple[MemoryUpdate, ...] = ()
    outputs: tuple[bytes, ...] = ()  # encoded output values, in send order
    events: tuple[SentEvent, ...] = ()
    calls: int = 0
    finished_ms: int = 0
    emitted: bool = True  # outputs acknowledged by the output topic

    @property
    def ordinal(self) -> int:
        return action_ordinal(self.ref.action)


@dataclass(frozen=True)
class MemorySnapshot:
    """Short-term memory of one key after the action named by ``applied_seq/action``.

    ``applied`` orders memory versions: an ActionDone whose (seq, ordinal) is not greater
    than it was already applied and must not be applied again.
    """

    key: str
    values: dict[str, bytes] = field(default_factory=dict)
    applied_seq: int = -1
    applied_ordinal: int = -1
    partition: int = 0


@dataclass(frozen=True)
class Truncation:
    """Evidence of non-determinism: slot ``index`` onward was dropped and re-executed."""

    ref: ActionRef
    index: int
    expected_function_id: str
    expected_args_digest: str
    recorded_function_id: str
    recorded_args_digest: str
    dropped: int
    at_ms: int = 0


JournalEntry = CallEntry | ActionDone | MemorySnapshot | Truncation


def action_ordinal(action: str) -> int:
    """The ordinal part of an action id ``Agent.method#3`` (0 when absent)."""
    _, _, ordinal = action.rpartition("#")
    return int(ordinal) if ordinal.isdigit() else 0


def entry_key(entry: JournalEntry) -> tuple[Any, ...]:
    """The compaction identity of an entry (one live value per identity)."""
    if isinstance(entry, CallEntry):
        return ("c", entry.ref.key, entry.ref.seq, entry.ref.action, entry.index)
    if isinstance(entry, ActionDone):
        return ("a", entry.ref.key, entry.ref.seq, entry.ref.action)
    if isinstance(entry, MemorySnapshot):
        return ("m", entry.key)
    return ("t", entry.ref.key, entry.ref.seq, entry.ref.action, entry.index)
