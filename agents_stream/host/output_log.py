"""Outputs already in the output topic, for actions whose emitted marker is missing.

An action's outputs are sent once its ActionDone is acked. The worker writes no marker
after them (the Faust host and backfill write the ActionDone again with ``emitted=True``,
without waiting for it): a worker that dies after the outputs' ack, before the commit
that prunes the record's journal, leaves an ActionDone that is not marked, and the next
owner would send its outputs again. So every output carries its identity in the header
``x-agents-stream-output`` (app id, input topic, partition, offset, action, when the
action finished, and the output's index: a record that reuses an offset of a recreated
topic cannot match), and a worker recovering such an ActionDone reads the output topic from
shortly before the action finished to its end: the outputs it finds are not sent again.

The read is bounded by time (``offsets_for_times``). An ActionDone that finished within
``App(output_scan_window=...)`` seconds is looked up from shortly before it finished to
the end of the topic (so outputs an earlier recovery sent again are found too). An older
one is looked up in a closed range around when it finished: its outputs were produced
once its ActionDone was acked, so they carry timestamps no later than two producer
delivery timeouts (``delivery.timeout.ms``, 5 minutes by default) after it, plus clock
skew; a partition's read stops at the first output stamped after that. Outputs sent
again by an earlier recovery long after the action finished are outside that range, and
are sent once more. A window of 0 turns every lookup off. A broker whose time index
answers every lookup with offset 0 (the embedded test broker) makes each read start at
the beginning: slower, still correct.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ..durable.journal import ActionDone
from ..durable.output_identity import OUTPUT_HEADER, output_prefix
from ..errors import KafkaIOError
from ..kafka.config import delivery_timeout_ms, reader_config

log = logging.getLogger(__name__)

# Output timestamps come from the producer's clock just after the action finished, or
# from the broker's with LogAppendTime: start the read this much earlier.
CLOCK_SKEW_MS = 60_000
# What was read is kept while recoveries ask again soon after (one read serves the many
# ActionDones of a partition taken over together), then dropped.
KEEP_S = 30.0
# A closed read covers this much more on each side, so that the ActionDones of one
# crash, finished within minutes of each other, share it.
SPAN_SLACK_MS = 600_000


class OutputLog:
    """Which outputs of an action are in ``topic`` already (blocking reads; thread-safe).

    Keeps the identities read of the outputs of the input partitions asked about, and
    how far each output partition was read. A question about another input partition,
    or one reaching further back in time, reads the window again; after
    :meth:`mark_stale` (a partition assignment: its previous owner may have written more)
    the next question reads what was appended since; other questions read nothing."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        origin: str,
        *,
        window_s: float,
        overrides: dict[str, Any] | None = None,
        timeout: float = 30.0,
        delivery_timeout: int | None = delivery_timeout_ms({}),
    ) -> None:
        """``delivery_timeout``: the producers' delivery timeout in ms (None: unbounded,
        older actions are then not looked up)."""
        self.topic = topic
        self.origin = origin
        self.window_ms = int(window_s * 1000)
        self.delivery_timeout_ms = delivery_timeout
        self._bootstrap = bootstrap
        self._overrides = overrides
        self._timeout = timeout
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._reset()

    def _reset(self) -> None:
        self._parts: set[bytes] = set()  # identity prefixes of the input partitions kept
        self._seen: set[bytes] = set()
        self._from_ms: int | None = None  # the read starts at this output timestamp
        self._next: dict[int, int] = {}  # output partition -> next offset to read
        self._stale = True
        self._used = time.monotonic()
        # Closed reads for older actions: (from ms, until ms, input partition, seen).
        self._spans: list[tuple[int, int, bytes, set[bytes]]] = []

    def mark_stale(self) -> None:
        """Outputs may have been appended that matter (partitions were assigned)."""
        self._stale = True

    def stale_on_assign(self, partitions: list[int]) -> None:
        """The store's assignment hook: a partition's previous owner may have sent
        outputs since the last read."""
        self._stale = True

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        """Those of ``indexes`` (indexes of ``done``'s outputs) whose output is in the
        topic (see the module doc for how far it looks)."""
        since_ms = done.finished_ms
        if not indexes or self.window_ms <= 0:
            return []
        part = f"{self.origin}/{done.ref.topic}/{done.ref.partition}/".encode()
        prefix = output_prefix(self.origin, done).encode()
        from_ms = since_ms - CLOCK_SKEW_MS
        with self._lock:
            if time.monotonic() - self._used > KEEP_S:
                self._reset()
            self._used = time.monotonic()
            if time.time() * 1000 - since_ms > self.window_ms:
                seen = self._span(part, from_ms, since_ms) or set()
                return [j for j in indexes if prefix + str(j).encode() in seen]
            if part not in self._parts or self._from_ms is None or from_ms < self._from_ms:
                self._parts.add(part)
                self._from_ms = from_ms if self._from_ms is None else min(from_ms, self._from_ms)
                self._seen.clear()
                self._read(self._starts(self._from_ms))
            elif self._stale:
                self._read(dict(self._next))
            self._stale = False
            self._used = time.monotonic()
            return [j for j in indexes if prefix + str(j).encode() in self._seen]

    def _span(self, part: bytes, from_ms: int, since_ms: int) -> set[bytes] | None:
        """The identities read in a closed range covering an older action's outputs
        (read now unless an earlier read covers it); None without a delivery timeout."""
        if self.delivery_timeout_ms is None:
            return None
        until_ms = since_ms + 2 * self.delivery_timeout_ms + CLOCK_SKEW_MS
        for lo, hi, asked, seen in self._spans:
            if asked == part and lo <= from_ms and until_ms <= hi:
                return seen
        lo, hi = from_ms - SPAN_SLACK_MS, until_ms + SPAN_SLACK_MS
        seen = set()
        self._read(self._starts(lo), until_ms=hi, parts=(part,), into=seen)
        self._spans.append((lo, hi, part, seen))
        return seen

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(reader_config(self._bootstrap, self._overrides))
        return self._consumer

    def _starts(self, from_ms: int) -> dict[int, int]:
        """Per output partition, the first offset at or after ``from_ms``."""
        consumer = self._client()
        meta = consumer.list_topics(self.topic, timeout=self._timeout).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "no partitions"
            raise KafkaIOError(f"cannot read output topic {self.topic!r}: {reason}")
        found = consumer.offsets_for_times(
            [TopicPartition(self.topic, p, max(from_ms, 0)) for p in sorted(meta.partitions)],
            timeout=self._timeout,
        )
        starts: dict[int, int] = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaIOError(f"offset lookup in {self.topic!r}[{tp.partition}]: {tp.error}")
            if tp.offset < 0:  # nothing at or after from_ms: from the current end
                tp.offset = consumer.get_watermark_offsets(tp, timeout=self._timeout)[1]
            starts[tp.partition] = tp.offset
        return starts

    def _read(
        self,
        starts: dict[int, int],
        *,
        until_ms: int | None = None,
        parts: tuple[bytes, ...] | None = None,
        into: set[bytes] | None = None,
    ) -> None:
        """Read each output partition from its start to the end its fetch reports (or to
        its first record stamped after ``until_ms``: a closed read, which leaves the
        open read's positions alone), keeping the identities of ``parts``' outputs."""
        consumer = self._client()
        # The end of each partition is its high watermark as first seen, not as it moves
        # on: read ``read_committed``, a partition's EOF comes at its last stable offset,
        # which stays below the current high watermark while any transaction is open
        # there. With exactly-once workers writing all the time some always is, and a read
        # that chased the moving high watermark never ended (30 s, then the outputs were
        # sent again: duplicates, tests/fault/test_group_changes.py). The transactions
        # open at the first EOF end within a commit interval (or the transaction timeout,
        # a dead worker's), and then the EOF passes that mark. The mark is the fetch's
        # (cached): the embedded broker's ListOffsets(latest) is not to be trusted.
        ends: dict[int, int] = {}
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        pending = set(starts)
        closed = until_ms is not None
        if not closed:
            self._next.update(starts)
        wanted = tuple(self._parts) if parts is None else parts
        seen = self._seen if into is None else into
        deadline = time.monotonic() + self._timeout
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaIOError(
                        f"end of output topic {self.topic!r}{sorted(pending)} not reached "
                        f"in {self._timeout}s"
                    )
                for msg in consumer.consume(1000, 0.2):
                    p = msg.partition()
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise KafkaIOError(f"reading {self.topic!r}: {err}", code=err.code())
                        end = ends.get(p)
                        if end is None:
                            end = ends[p] = consumer.get_watermark_offsets(
                                TopicPartition(self.topic, p), cached=True
                            )[1]
                        if msg.offset() >= end:
                            pending.discard(p)
                        continue
                    if closed:
                        if p not in pending:
                            continue  # past its range, other partitions still read
                        stamp = msg.timestamp()[1]
                        if stamp > until_ms:
                            pending.discard(p)
                            consumer.pause([TopicPartition(self.topic, p)])
                            continue
                    else:
                        self._next[p] = msg.offset() + 1
                    for name, value in msg.headers() or ():
                        if name == OUTPUT_HEADER and value.startswith(wanted):
                            seen.add(value)
        finally:
            if closed:  # a paused partition would stay paused in the next read
                consumer.resume([TopicPartition(self.topic, p) for p in starts])
            consumer.unassign()
