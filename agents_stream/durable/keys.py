"""Keys of ActionState records: the Kafka record key, also the RocksDB cache key.

Fields are joined with the ASCII unit separator so that all slots of one action (and all
actions of one input record) share a byte prefix the cache can scan. Compaction keeps one
value per key: a slot finalized in place (PENDING -> SUCCEEDED) simply overwrites.

Layouts of the per-record entries (``c`` call, ``a`` done, ``t`` truncation):

* v5: ``kind key seq topic action [index]``: the input topic is part of the identity,
  so records of two topics at the same partition/offset never share a slot;
* legacy (written before v5): ``kind key seq action [index]``. Action ids always
  contain ``#`` and topic names never do, which tells the two apart.
"""

from __future__ import annotations

from dataclasses import replace

from .journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    JournalEntry,
    TimerEntry,
    Tombstone,
    TwoPhaseCall,
    entry_key,
    progress_identity,
)

SEP = "\x1f"
RECORD_KINDS = ("c", "a", "t")


def encode_identity(identity: tuple[object, ...]) -> bytes:
    return SEP.join(str(part) for part in identity).encode()


def _ref_tail(ref: ActionRef) -> str:
    """``key seq [topic] action`` of ``ref``, joined; computed once per ref (an action
    run's keys are encoded several times: lookups, its appends, pruning)."""
    tail: str | None = ref.__dict__.get("_key_tail")
    if tail is not None:
        return tail
    # The fields of ref_identity("", ref)[1:] joined by SEP, each formatted with str()
    # as encode_identity does, without building the tuple and a generator per ref.
    if ref.topic:
        tail = f"{ref.key!s}\x1f{ref.seq!s}\x1f{ref.topic!s}\x1f{ref.action!s}"
    else:
        tail = f"{ref.key!s}\x1f{ref.seq!s}\x1f{ref.action!s}"
    object.__setattr__(ref, "_key_tail", tail)  # frozen: a cache, not a field
    return tail


def entry_key_bytes(entry: JournalEntry | Tombstone) -> bytes:
    kind = type(entry)
    if kind is ActionDone:
        return ("a\x1f" + _ref_tail(entry.ref)).encode()  # type: ignore[union-attr]
    if kind is CallEntry:
        return call_key(entry.ref, entry.index)  # type: ignore[union-attr]
    if kind is TwoPhaseCall:
        return obligation_key(entry.ref, entry.index)  # type: ignore[union-attr]
    return encode_identity(entry_key(entry))


def call_key(ref: ActionRef, index: int) -> bytes:
    return f"c\x1f{_ref_tail(ref)}\x1f{index}".encode()


def obligation_key(ref: ActionRef, index: int) -> bytes:
    """The key of slot ``index``'s two-phase obligation (v8): ``x`` + the slot's key
    tail. Not a per-record kind (``RECORD_KINDS``): pruning a record leaves it."""
    return f"x\x1f{_ref_tail(ref)}\x1f{index}".encode()


def obligation_record(raw: bytes) -> tuple[str, int, str] | None:
    """``(key, seq, topic)`` of an obligation key (topic ``""``: legacy layout)."""
    parts = raw.decode().split(SEP)
    if len(parts) == 6:
        return parts[1], int(parts[2]), parts[3]
    if len(parts) == 5:
        return parts[1], int(parts[2]), ""
    return None


OBLIGATIONS_PREFIX = ("x" + SEP).encode()  # every TwoPhaseCall of a partition (v8)


def calls_prefix(ref: ActionRef) -> bytes:
    return ("c\x1f" + _ref_tail(ref) + "\x1f").encode()


def done_key(ref: ActionRef) -> bytes:
    return ("a\x1f" + _ref_tail(ref)).encode()


def memory_key(key: str) -> bytes:
    return encode_identity(("m", key))


def timer_key(timer: TimerEntry) -> bytes:
    return entry_key_bytes(timer)


def progress_key(topic: str, partition: int) -> bytes:
    return encode_identity(progress_identity(topic, partition))


TIMERS_PREFIX = ("r" + SEP).encode()  # every TimerEntry of a partition
GROUPS_PREFIX = ("g" + SEP).encode()  # every CompletionGroup of a partition (v7)


def legacy_ref(ref: ActionRef) -> ActionRef:
    """``ref`` as it was keyed before v5 (no topic)."""
    return replace(ref, topic="")


def record_prefixes(key: str, seq: int, topic: str = "") -> list[bytes]:
    """Prefixes covering every entry of one input record of ``topic`` (for pruning).

    Without a topic they cover the record's entries of *every* layout and topic: keep
    only the legacy ones with :func:`is_legacy`.
    """
    tail = SEP + key + SEP + str(seq) + SEP + (topic + SEP if topic else "")
    return [(kind + tail).encode() for kind in RECORD_KINDS]


def decode_identity(raw: bytes) -> list[str]:
    return raw.decode().split(SEP)


def is_legacy(parts: list[str]) -> bool:
    """Whether decoded per-record identity ``parts`` use the pre-v5 layout."""
    return len(parts) > 3 and "#" in parts[3]


def identity_fields(parts: list[str]) -> dict[str, str]:
    """Named fields (key, seq, topic, action, index) of a decoded per-record identity;
    ``topic`` is ``""`` for the legacy layout."""
    if parts[:1] == ["g"]:  # a completion group: ``g topic partition group``
        return dict(zip(("kind", "topic", "partition", "group"), parts, strict=False))
    if len(parts) < 2 or parts[0] not in RECORD_KINDS:
        return {"key": parts[1]} if len(parts) >= 2 else {}
    names: tuple[str, ...] = ("kind", "key", "seq", "action", "index")
    if len(parts) > 3 and not is_legacy(parts):
        names = ("kind", "key", "seq", "topic", "action", "index")
    out = dict(zip(names, parts, strict=False))
    out.setdefault("topic", "")
    return out
