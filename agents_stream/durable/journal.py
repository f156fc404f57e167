"""The journal's record model: what an action's durable state is made of.

An *ActionState* is identified by ``(topic, key, seq, action)``: the input topic (v5;
``""`` for entries written before, see :func:`ref_identity`), the record key, the input
record's sequence number (its offset in the input partition, so re-consuming the same
record after a crash finds the same state) and the action id (``Agent.method#ordinal``,
the ordinal being the position of that action run within the record's processing).

The store appends one :class:`CallEntry` per call slot (not the whole state per call, so
bytes written grow linearly with calls), one :class:`ActionDone` when the action
finishes, one :class:`MemorySnapshot` per key after each completed action, and a
:class:`Truncation` whenever a replay diverged. Entries are immutable values; the
encoding lives behind :mod:`agents_stream.serde.journal`.

Timers (schema v4): a registered timer is one live :class:`TimerEntry` per
``(key, kind, ts, agent)``, written with the registering action's ActionDone and
tombstoned once its firing completed. A firing runs like an input record whose sequence
number is ``-(ts + 1)`` (never an input offset) and whose action ids carry the timer kind
(``Agent.method#e0`` / ``#p0``).

Completion groups (schema v7): the ActionDones of several records of one input
partition that finished together (a lane round, a host's group commit) are one
:class:`CompletionGroup` record, one produce and one delivery report instead of one per
record, and one tombstone once every record of the group is committed. A reader sees
the same ActionDones either way (:func:`expand`): each keeps its own ref, so what a
group holds is found under the record's identity as a standalone ActionDone would be.

Two-phase calls (schema v8): a call of a ``TwoPhaseCommitCallable`` journals its
``prepare()`` result as an ordinary SUCCEEDED slot and, before it, a
:class:`TwoPhaseCall`: the obligation to commit or abort that preparation, keyed
``x key seq topic action index`` beside the slot. It is not a per-record entry: pruning
a record leaves it, and a record with an open obligation (PREPARED or ABORTING) is not
pruned at all until the obligation is settled, so the evidence of its completion (its
ActionDone) outlives the decision (``durable/twophase.py``).

Key-state version: an action that changed memory or timers bumps the key's
``MemorySnapshot.version`` and records it as ``ActionDone.memory_version``. The snapshot
is appended *after* the ActionDone and the timer records, so a durable snapshot of that
version proves every effect of the action is durable (per-partition order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

TimerKind = Literal["event", "processing"]
TIMER_KINDS: tuple[TimerKind, ...] = ("event", "processing")


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
    topic: str = ""  # input topic; "" only for entries written before v5 (see durable.keys)

    def call_id(self, app_id: str, index: int) -> str:
        """Stable idempotency key of call ``index`` (same after any number of replays).

        Includes the input topic, so equal offsets of two topics never share an id. A
        legacy ref (``topic == ""``, an action run journaled before v5) keeps the old
        form: external systems already hold the ids handed out for its calls.
        """
        if self.topic:
            return f"{app_id}:{self.topic}:{self.key}:{self.seq}:{self.action}:{index}"
        return f"{app_id}:{self.key}:{self.seq}:{self.action}:{index}"


@dataclass(frozen=True)
class ExceptionInfo:
    """A journaled exception: enough to re-raise an equivalent one without pickle."""

    type: str  # "module.QualName"
    message: str
    traceback: str = ""
    args: bytes | None = None  # exc.args in the journal value encoding; None before v5


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
class TimerUpdate:
    """A timer an action registered (``deleted=False``) or deleted."""

    kind: str  # TimerKind
    ts: int  # epoch ms
    deleted: bool = False


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
    timers: tuple[TimerUpdate, ...] = ()
    memory_version: int = -1  # key-state version this action produced; -1: none / pre-v4
    # While not ``emitted``: indexes of the outputs known to be in the log (a send that
    # partly failed); a replay sends only the others. Empty before v6.
    emitted_outputs: tuple[int, ...] = ()

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
    version: int = -1  # key-state version (see module docstring); -1 before v4


@dataclass(frozen=True)
class TimerEntry:
    """A registered, not yet completed timer of ``key`` for the actions of ``agent``."""

    key: str
    kind: str  # TimerKind
    ts: int  # epoch ms
    agent: str = ""  # Agent class name whose TimerEvent actions fire
    partition: int = 0

    @property
    def seq(self) -> int:
        """The sequence number of this timer's firing: negative, never an input offset."""
        return firing_seq(self.ts)

    def owns(self, action: str) -> bool:
        """Whether action id ``action`` belongs to this timer's firing."""
        agent, _, rest = action.partition(".")
        tag = rest.rpartition("#")[2]
        return agent == self.agent and tag[:1] == self.kind[:1] and tag[1:].isdigit()


@dataclass(frozen=True)
class Tombstone:
    """Store instruction (never encoded): delete the entry with compaction ``identity``."""

    identity: tuple[Any, ...]


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


@dataclass(frozen=True)
class InputProgress:
    """Completed-through marker of one input partition (schema v5).

    Every input record of ``topic``/``partition`` below ``offset`` finished: all its
    actions completed and their outputs are durable. Unlike committed consumer offsets it
    lives in the compacted journal, so it survives pruning and consumer-group offset
    resets, and every host (worker, Faust, Spark backfill and audit) reads the same one.
    """

    topic: str
    partition: int
    offset: int  # exclusive
    at_ms: int = 0
    worker_id: str = ""


@dataclass(frozen=True)
class CompletionGroup:
    """The ActionDones of records of one input partition that completed together
    (schema v7).

    ``group`` makes the record's key unique (a writer's token and a counter): two groups
    never share a key, so compaction never folds one into another, and a group is
    tombstoned only once every record it holds is committed. Only input records'
    ActionDones of a v5+ ref go into groups (``groupable``); a timer firing's, which a
    later firing of the same timer may have to clear, stays a standalone ActionDone.
    """

    topic: str
    partition: int
    group: str
    dones: tuple[ActionDone, ...]
    at_ms: int = 0


class TwoPhase(str, Enum):  # noqa: UP042 - str values are the wire format
    """Phase of a two-phase call's obligation (schema v8)."""

    PREPARED = "PREPARED"  # prepare() journaled; commit or abort still owed
    COMMITTED = "COMMITTED"  # commit() returned, after the action's completion was durable
    ABORTING = "ABORTING"  # abort decided (durable); abort() may not have returned yet
    ABORTED = "ABORTED"  # abort() returned

    @property
    def open(self) -> bool:
        """Whether a commit or an abort is still owed."""
        return self is TwoPhase.PREPARED or self is TwoPhase.ABORTING


@dataclass(frozen=True)
class TwoPhaseCall:
    """The obligation of one prepared two-phase call (schema v8): what to commit or
    abort (``target``: the callable itself, journal value encoding) with what
    (``prepared``: payload-codec bytes of ``prepare()``'s result)."""

    ref: ActionRef
    index: int
    function_id: str
    args_digest: str
    phase: TwoPhase
    target: bytes
    prepared: bytes | None = None
    call_id: str = ""
    round: int = 0
    prepared_ms: int = 0
    settled_ms: int = 0
    attempts: int = 0
    last_error: str = ""
    worker_id: str = ""


JournalEntry = (
    TwoPhaseCall
    | CallEntry
    | ActionDone
    | MemorySnapshot
    | Truncation
    | TimerEntry
    | InputProgress
    | CompletionGroup
)


def groupable(done: ActionDone) -> bool:
    """Whether ``done`` may travel in a :class:`CompletionGroup`: an input record's
    (seq is its offset, not a timer firing's negative one) of a v5+ ref (with its topic)
    whose key holds no key separator (a record id that parses back the same way)."""
    return done.ref.seq >= 0 and bool(done.ref.topic) and "\x1f" not in done.ref.key


def expand(entry: JournalEntry) -> tuple[JournalEntry, ...]:
    """The entries a decoded record stands for: a group's ActionDones, else itself."""
    if entry.__class__ is CompletionGroup:
        return entry.dones
    return (entry,)


def firing_seq(ts: int) -> int:
    """Sequence number of the firing of a timer at ``ts``: ``-(ts + 1)``."""
    return -(ts + 1)


def action_ordinal(action: str) -> int:
    """The ordinal part of an action id ``Agent.method#3`` or ``#e3``/``#p3`` (timer
    firings); 0 when absent."""
    _, _, ordinal = action.rpartition("#")
    ordinal = ordinal.lstrip("ep")
    return int(ordinal) if ordinal.isdigit() else 0


def group_identity(topic: str, partition: int, group: str) -> tuple[Any, ...]:
    return ("g", topic, partition, group)


def progress_identity(topic: str, partition: int) -> tuple[Any, ...]:
    return ("p", topic, partition)


def timer_identity(key: str, kind: str, ts: int, agent: str) -> tuple[Any, ...]:
    return ("r", key, kind, ts, agent)


def ref_identity(kind: str, ref: ActionRef, *rest: Any) -> tuple[Any, ...]:
    """Compaction identity of an entry of action run ``ref``: ``(kind, key, seq, topic,
    action, *rest)``; the topic is left out for legacy refs (``topic == ""``), whose
    entries keep the key they were written under before v5. Key and seq stay first so
    that every entry of one record, any topic, shares the ``(kind, key, seq)`` prefix
    (readers filter by key without knowing the layout)."""
    if ref.topic:
        return (kind, ref.key, ref.seq, ref.topic, ref.action, *rest)
    return (kind, ref.key, ref.seq, ref.action, *rest)


def entry_key(entry: JournalEntry | Tombstone) -> tuple[Any, ...]:
    """The compaction identity of an entry (one live value per identity)."""
    if isinstance(entry, Tombstone):
        return entry.identity
    if isinstance(entry, TimerEntry):
        return timer_identity(entry.key, entry.kind, entry.ts, entry.agent)
    if isinstance(entry, InputProgress):
        return progress_identity(entry.topic, entry.partition)
    if isinstance(entry, CompletionGroup):
        return group_identity(entry.topic, entry.partition, entry.group)
    if isinstance(entry, CallEntry):
        return ref_identity("c", entry.ref, entry.index)
    if isinstance(entry, TwoPhaseCall):
        return ref_identity("x", entry.ref, entry.index)
    if isinstance(entry, ActionDone):
        return ref_identity("a", entry.ref)
    if isinstance(entry, MemorySnapshot):
        return ("m", entry.key)
    return ref_identity("t", entry.ref, entry.index)
