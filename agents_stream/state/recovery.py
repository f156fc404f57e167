"""Cache recovery: replay the ActionState topic tail into a partition's RocksDB cache.

Idempotent by construction: entries are keyed values (put / delete), so replaying a
record that the cache already holds rewrites the same value, and the checkpoint only
moves forward. Steps, for one partition:

1. Read the cache checkpoint (next topic offset it reflects; 0 for a new cache).
2. Fetch from there and learn the partition's high watermark from the fetch itself.
   A checkpoint beyond the high watermark means the topic was recreated (or the broker
   lost its data): the cache is wiped and rebuilt from the beginning.
3. Apply records in write batches (tombstone -> delete) until the high watermark, and
   move the checkpoint with each batch. Every value's framing and writer schema are
   checked: a foreign or garbage journal record fails the assignment when the partition
   is caught up, naming its slot, unless a later record of the same key (a tombstone from
   ``agents-stream state tombstone``, or a rewrite) superseded it. While one is
   unresolved the checkpoint stays at its offset, so a retry meets it again. A damaged
   Avro body fails when that slot is read.

Progress (records done / total, rate, ETA) is reported per batch through
:class:`agents_stream.progress.Progress`; the total is the high watermarks learned from the
first fetches minus the checkpoints.

A rebuild of millions of records takes minutes; a ``cancel`` event (the worker's stop
signal) is checked between batches and ends it with :class:`RebuildCancelled`. Each batch
was applied with its checkpoint in one write, so the cache stays consistent and the next
rebuild goes on from where this one stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import groupby, repeat
from operator import is_not
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..durable.errors import JournalDecodeError
from ..errors import KafkaIOError
from ..kafka.config import reader_config
from ..progress import Progress

if TYPE_CHECKING:
    from ..serde.journal import JournalCodec
    from .cache import PartitionCache

log = logging.getLogger("agents_stream.state")

BATCH = 5000
PROGRESS_INTERVAL = 5.0  # seconds between progress log lines (off a terminal)


class RebuildCancelled(Exception):
    """A cache rebuild stopped by its cancel event before the partitions were caught up."""


def rebuild_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    cache: PartitionCache,
    codec: JournalCodec,
    *,
    timeout: float = 60.0,
    cancel: threading.Event | None = None,
    transactional: bool = False,
) -> int:
    """Catch up one partition's cache; returns the number of records replayed."""
    caches = {partition: cache}
    return rebuild_partitions(
        bootstrap, topic, caches, codec, timeout=timeout, cancel=cancel, transactional=transactional
    )[partition]


def rebuild_partitions(
    bootstrap: str,
    topic: str,
    caches: dict[int, PartitionCache],
    codec: JournalCodec,
    *,
    timeout: float = 60.0,
    cancel: threading.Event | None = None,
    transactional: bool = False,
) -> dict[int, int]:
    """Catch up several partitions with one consumer (one connection and fetch session
    for a whole assignment); returns records replayed per partition.

    ``transactional`` (exactly-once apps): the reader is ``read_committed``, whose end of
    a partition is its last stable offset; while a transaction is open (a worker died in
    one: the broker aborts it after its ``transaction.timeout.ms``) the journaled calls
    written after its first record are behind that offset too, and a cache caught up
    only to it would run them again. So a partition is caught up only once its end
    reaches the high watermark.

    Raises RebuildCancelled once ``cancel`` is set (checked between batches)."""
    starts = {p: cache.checkpoint for p, cache in caches.items()}
    replayed = dict.fromkeys(caches, 0)
    open_parts = set(caches)
    scratch: set[int] = set()
    consumer = Consumer(reader_config(bootstrap))
    current = codec.current_header()  # records this version writes need no check
    prefix_len = len(current) if current else -1
    deadline = time.monotonic() + timeout
    progress = Progress(
        f"rebuild of {topic}[{','.join(map(str, sorted(caches)))}]",
        interval=PROGRESS_INTERVAL,
        logger=log,
    )
    remaining: dict[int, int] = {}  # partition -> records to replay, once its watermark is known
    # Per partition: unreadable values not (yet) superseded, by key -> (offset, error).
    bad: dict[int, dict[bytes, tuple[int, JournalDecodeError]]] = {p: {} for p in caches}
    held_back: dict[int, tuple[int, int]] = {}  # partition -> (last stable offset, high)
    try:
        # Explicit offsets, 0 for a new cache: a logical one (OFFSET_BEGINNING) costs an
        # offset lookup that added ~0.5 s to every rebuild, i.e. to every assignment; a
        # log that no longer starts at 0 is reset to its start (auto.offset.reset).
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(caches)])
        while open_parts:
            if cancel is not None and cancel.is_set():
                raise RebuildCancelled(
                    f"rebuild of {topic}{sorted(caches)} cancelled after "
                    f"{sum(replayed.values())} records (checkpoints kept)"
                )
            # consume() waits its whole timeout unless the batch fills: keep it short so an
            # empty or small partition is caught up in milliseconds, not seconds.
            msgs = consumer.consume(*_wanted(remaining, replayed, open_parts))
            if not msgs:
                # End of partition is learned from the fetch (partition EOF), not from
                # ListOffsets, which some Kafka-protocol brokers answer imprecisely.
                _past_the_end(consumer, topic, starts, replayed, open_parts, scratch)
                if not open_parts:
                    break
                if time.monotonic() > deadline:
                    raise KafkaIOError(_no_end(topic, open_parts, held_back))
                continue
            deadline = time.monotonic() + timeout
            batches: dict[int, list[tuple[bytes, bytes | None]]] = {}
            next_offsets: dict[int, int] = {}
            at_end: list[int] = []
            runs = _clean_runs(msgs, current, open_parts, starts, bad)
            if runs is not None:
                for p, (run_keys, run_values, next_offset) in runs.items():
                    caches[p].replay(run_keys, run_values, next_offset)
                    replayed[p] += len(run_keys)
                    progress.advance(len(run_keys))
                if len(remaining) < len(caches):
                    _learn_totals(consumer, topic, starts, remaining, progress)
                continue
            # Per record only what is needed: the common record (current schema, nothing
            # unresolved) costs a prefix compare and an append (rebuild is record-bound).
            for msg in msgs:
                p = msg.partition()
                if p not in open_parts:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if transactional and _open_transaction(consumer, topic, p, msg, held_back):
                            continue
                        at_end.append(p)
                        continue
                    raise KafkaIOError(f"reading {topic}[{p}]: {err}", code=err.code())
                offset = msg.offset()
                if offset < starts[p]:  # the log restarted below our checkpoint
                    scratch.add(p)
                    open_parts.discard(p)
                    continue
                key = msg.key() or b""
                value = msg.value()
                unresolved = bad[p]
                if value is not None and value[:prefix_len] != current:
                    try:
                        codec.check(key, value)  # unknown schema or garbage: names the slot
                    except JournalDecodeError as exc:
                        unresolved[key] = (offset, exc)
                    else:
                        if unresolved:
                            unresolved.pop(key, None)
                elif unresolved:
                    unresolved.pop(key, None)
                records = batches.get(p)
                if records is None:
                    records = batches[p] = []
                records.append((key, value))
                next_offsets[p] = offset + 1
            for p, records in batches.items():
                if p in open_parts:
                    hold = min((offset for offset, _ in bad[p].values()), default=None)
                    caches[p].apply(records, next_offsets[p] if hold is None else hold, replay=True)
                    replayed[p] += len(records)
                    progress.advance(len(records))
            if len(remaining) < len(caches):
                _learn_totals(consumer, topic, starts, remaining, progress)
            for p in at_end:
                if p not in open_parts:
                    continue
                open_parts.discard(p)
                if bad[p]:
                    raise min(bad[p].values(), key=lambda found: found[0])[1]
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                if starts[p] > high:
                    scratch.add(p)
    finally:
        progress.close()
        consumer.close()
        for cache in caches.values():
            cache.settle()
    for p in sorted(scratch):
        replayed[p] = _restart_from_scratch(
            bootstrap, topic, p, caches[p], codec, cancel, transactional
        )
    return replayed


def _clean_runs(
    msgs: list[Message],
    current: bytes,
    open_parts: set[int],
    starts: dict[int, int],
    bad: dict[int, dict[bytes, tuple[int, JournalDecodeError]]],
) -> dict[int, tuple[list[bytes], list[bytes | None], int]] | None:
    """The common batch, checked column by column in C: records of open partitions, no
    errors or end-of-partition events, every key set, every value a tombstone or written
    by the current schema, nothing unresolved. Returns ``{partition: (keys, values,
    next offset)}``, or None for the record-by-record path (which handles everything)."""
    if not current:  # a registry frames the records: each one is checked
        return None
    if any(map(is_not, map(Message.error, msgs), repeat(None))):
        return None
    keys = list(map(Message.key, msgs))
    if None in keys:
        return None
    values = list(map(Message.value, msgs))
    written = [v for v in values if v is not None] if None in values else values
    if not all(map(bytes.startswith, written, repeat(current))):
        return None
    runs: dict[int, tuple[list[bytes], list[bytes | None], int]] = {}
    at = 0
    # A fetch's records of one partition arrive together: a few runs per batch.
    for p, run in groupby(map(Message.partition, msgs)):
        n = len(list(run))
        if p not in open_parts or bad[p] or msgs[at].offset() < starts[p]:
            return None
        run_keys, run_values = keys[at : at + n], values[at : at + n]
        if p in runs:
            run_keys, run_values = runs[p][0] + run_keys, runs[p][1] + run_values
        runs[p] = (run_keys, run_values, msgs[at + n - 1].offset() + 1)
        at += n
    return runs


def _open_transaction(
    consumer: Consumer,
    topic: str,
    partition: int,
    eof: Message,
    held_back: dict[int, tuple[int, int]],
) -> bool:
    """Whether the end-of-partition event ``eof`` stops at a last stable offset below
    the high watermark (an open transaction): the partition is not caught up yet."""
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
    stable = eof.offset()
    if 0 <= stable < high:
        if partition not in held_back:
            log.info(
                "%s[%d]: an open transaction holds the last stable offset at %d (high "
                "watermark %d): waiting for it to commit or abort",
                topic, partition, stable, high,
            )  # fmt: skip
        held_back[partition] = (stable, high)
        return True
    held_back.pop(partition, None)
    return False


def _no_end(topic: str, open_parts: set[int], held_back: dict[int, tuple[int, int]]) -> str:
    held = {p: held_back[p] for p in sorted(open_parts) if p in held_back}
    if not held:
        return f"no end of partition seen for {topic}{sorted(open_parts)}"
    where = ", ".join(f"{topic}[{p}] at {s} < {h}" for p, (s, h) in held.items())
    return (
        f"an open transaction holds the last stable offset ({where}) longer than the "
        "rebuild waits: a producer of this transactional app died mid-transaction and the "
        "broker has not aborted it yet (its transaction.timeout.ms; the worker sets 10 s "
        "unless producer_config says otherwise)"
    )


def _past_the_end(
    consumer: Consumer,
    topic: str,
    starts: dict[int, int],
    replayed: dict[int, int],
    open_parts: set[int],
    scratch: set[int],
) -> None:
    """Move to ``scratch`` the partitions whose checkpoint is past the high watermark
    their fetches reported: a broker may answer a fetch beyond the end of a recreated
    topic with nothing at all (Tansu does) instead of "offset out of range", so no
    partition EOF would ever come."""
    for p in [p for p in open_parts if starts[p] > 0 and replayed[p] == 0]:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        if 0 <= high < starts[p]:
            open_parts.discard(p)
            scratch.add(p)


def _wanted(
    remaining: dict[int, int], replayed: dict[int, int], open_parts: set[int]
) -> tuple[int, float]:
    """How many records (and end-of-partition events) the next consume can expect, and
    how long it may wait for them.

    consume() returns early only once its batch is full: asked for more than is left, it
    waits out its whole timeout, at the end of every rebuild (a sixth of a 200k-record
    one) and for a caught-up cache (most of an assignment's fixed cost). Until the
    fetches told where the partitions end, poll briefly; then ask for what is left
    (offsets that compaction removed make that an overestimate: one wait again)."""
    if not open_parts.issubset(remaining):
        return BATCH, 0.005
    left = sum(max(remaining[p] - replayed[p], 0) for p in open_parts)
    return max(1, min(BATCH, left + len(open_parts))), 0.05


def _learn_totals(
    consumer: Consumer,
    topic: str,
    starts: dict[int, int],
    remaining: dict[int, int],
    progress: Progress,
) -> None:
    """Record each partition's work (high watermark from the fetches - checkpoint) once
    known; sets the progress total when every partition's is."""
    for p, start in starts.items():
        if p not in remaining:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            if high >= 0:
                remaining[p] = max(high - max(start, low), 0)
    if len(remaining) == len(starts):
        progress.set_total(sum(remaining.values()))


def _restart_from_scratch(
    bootstrap: str,
    topic: str,
    partition: int,
    cache: PartitionCache,
    codec: JournalCodec,
    cancel: threading.Event | None,
    transactional: bool,
) -> int:
    log.warning(
        "%s[%d]: cache checkpoint %d is past the topic end; the topic was recreated, "
        "rebuilding the cache from scratch",
        topic,
        partition,
        cache.checkpoint,
    )
    cache.clear()
    return rebuild_partition(
        bootstrap, topic, partition, cache, codec, cancel=cancel, transactional=transactional
    )
