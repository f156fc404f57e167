"""Keys of ActionState records: the Kafka record key, also the RocksDB cache key.

Fields are joined with the ASCII unit separator so that all slots of one action (and all
actions of one input record) share a byte prefix the cache can scan. Compaction keeps one
value per key: a slot finalized in place (PENDING -> SUCCEEDED) simply overwrites.
"""

from __future__ import annotations

from ..durable.journal import ActionRef, JournalEntry, TimerEntry, Tombstone, entry_key

SEP = "\x1f"


def encode_identity(identity: tuple[object, ...]) -> bytes:
    return SEP.join(str(part) for part in identity).encode()


def entry_key_bytes(entry: JournalEntry | Tombstone) -> bytes:
    return encode_identity(entry_key(entry))


def call_key(ref: ActionRef, index: int) -> bytes:
    return encode_identity(("c", ref.key, ref.seq, ref.action, index))


def calls_prefix(ref: ActionRef) -> bytes:
    return encode_identity(("c", ref.key, ref.seq, ref.action)) + SEP.encode()


def done_key(ref: ActionRef) -> bytes:
    return encode_identity(("a", ref.key, ref.seq, ref.action))


def memory_key(key: str) -> bytes:
    return encode_identity(("m", key))


def timer_key(timer: TimerEntry) -> bytes:
    return entry_key_bytes(timer)


TIMERS_PREFIX = ("r" + SEP).encode()  # every TimerEntry of a partition


def record_prefixes(key: str, seq: int) -> list[bytes]:
    """Prefixes covering every entry of one input record (for pruning)."""
    tail = (SEP + key + SEP + str(seq) + SEP).encode()
    return [kind.encode() + tail for kind in ("c", "a", "t")]


def decode_identity(raw: bytes) -> list[str]:
    return raw.decode().split(SEP)
