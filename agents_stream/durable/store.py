"""The ActionStateStore interface the durable core runs against (a port: state/ implements it).

Reads are served from a local view (dict or RocksDB) of the journal; writes are appended
to the durable log and acknowledged through a ``concurrent.futures.Future`` so that a
code block can wait for *its* record's ack without flushing anybody else's.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace

from ..ackfuture import AckFuture, resolved
from .journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CompletionGroup,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    TimerEntry,
    Tombstone,
    TwoPhaseCall,
    entry_key,
)


def completed_future() -> Future[None]:
    return resolved()


def all_of(futures: Sequence[Future[None]]) -> Future[None]:
    """A future that resolves when every one of ``futures`` has (first error wins)."""
    if not futures:
        return completed_future()
    if len(futures) == 1:
        return futures[0]
    combined: Future[None] = AckFuture()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(fut: Future[None]) -> None:
        exc = fut.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if combined.done():
                return
            if exc is not None:
                combined.set_exception(exc)
            elif last:
                combined.set_result(None)

    for fut in futures:
        fut.add_done_callback(one_done)
    return combined


class ActionStateStore(ABC):
    """Durable journal of ActionStates plus a read view of it.

    ``legacy_topics``: input topics whose records may have entries journaled before v5
    (keyed without a topic). Hosts set it to the app's first input topic: before v5
    every binding shared those keys, and the first topic is the one an upgraded
    single-topic app reads.
    """

    legacy_topics: frozenset[str] = frozenset()

    def resolve(self, ref: ActionRef) -> ActionRef:
        """The identity an action run continues under: ``ref``, or its legacy (pre-v5,
        topic-less) form when only that one has entries, so that an action run in flight
        across the upgrade keeps its slots and call ids."""
        if not ref.topic or ref.topic not in self.legacy_topics:
            return ref
        if self.done(ref) is not None or self.calls(ref):
            return ref
        legacy = replace(ref, topic="")
        if self.done(legacy) is not None or self.calls(legacy):
            return legacy
        return ref

    @abstractmethod
    def progress(self, topic: str, partition: int) -> InputProgress | None:
        """The completed-through marker of input ``topic``/``partition``, if any."""

    @abstractmethod
    def calls(self, ref: ActionRef) -> dict[int, CallEntry]:
        """Journaled call slots of one action run, by call index."""

    @abstractmethod
    def done(self, ref: ActionRef) -> ActionDone | None:
        """The completion record of an action run, if it completed."""

    @abstractmethod
    def memory(self, key: str, partition: int) -> MemorySnapshot | None:
        """Latest short-term memory snapshot of ``key``."""

    @abstractmethod
    def timer(self, probe: TimerEntry) -> TimerEntry | None:
        """The live timer with ``probe``'s identity (key, kind, ts, agent), if registered
        and not yet completed or deleted."""

    @abstractmethod
    def timers(self, partition: int) -> list[TimerEntry]:
        """Every live timer of ``partition`` (loaded by hosts when they take it over)."""

    @abstractmethod
    def append(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> Future[None]:
        """Append entries (a :class:`Tombstone` deletes) in order; the future resolves
        once all are durable. Order holds on the log: a durable entry implies every
        earlier one of the same call is durable."""

    def append_group(self, group: CompletionGroup) -> Future[None]:
        """Append the ActionDones of ``group`` as one completion group (v7), found by
        :meth:`done` under each member's identity. A store that keeps no groups appends
        them as standalone ActionDones."""
        return self.append(list(group.dones), group.partition)

    def pin(self, topic: str, partition: int, seq: int, key: str) -> None:  # noqa: B027
        """The journal of input record ``(key, seq)`` of ``topic`` is kept past its
        commit (a dead letter, whose replay meets it): a store that groups completions
        gives that record's a row of its own. Nothing by default."""

    # -- two-phase obligations (v8, durable/twophase.py) ---------------------------------
    @property
    def partitions(self) -> list[int]:
        """The partitions this store holds a view of (every one, for a store of all)."""
        return []

    def obligation(self, ref: ActionRef, index: int) -> TwoPhaseCall | None:
        """The two-phase obligation of slot ``index`` of ``ref``, if any."""
        return None

    def obligations(self, partition: int) -> list[TwoPhaseCall]:
        """Every live two-phase obligation of ``partition`` (open or settled, not yet
        pruned)."""
        return []

    def held_back(self, topic: str, partition: int) -> list[tuple[str, int, int, str]]:
        """Records ``(topic, partition, seq, key)`` a prune left for their open
        obligations (in this process), to prune once those are settled."""
        return [r for r in self._held_back if r[0] == topic and r[1] == partition]

    def release_held(self, record: tuple[str, int, int, str]) -> bool:
        """Whether ``record`` was held back from a prune (and forget it)."""
        if record in self._held_back:
            self._held_back.discard(record)
            return True
        return False

    @property
    def _held_back(self) -> set[tuple[str, int, int, str]]:
        held: set[tuple[str, int, int, str]] | None = self.__dict__.get("_held")
        if held is None:
            held = self.__dict__["_held"] = set()
        return held

    def prune_settled(self, records: Sequence[tuple[int, str]], partition: int, topic: str) -> None:
        """Prune committed records whose obligations are all settled, the obligations
        too (:meth:`prune_records` leaves a record with an obligation)."""
        self.prune_records(records, partition, topic)

    def prune_below(self, topic: str, partition: int, offset: int) -> int:
        """Prune what records of ``topic`` below completed-through ``offset`` left
        behind (called on assignment); how many journal records. Nothing by default."""
        return 0

    def fresh(self, key: str, seq: int, partition: int) -> bool:
        """True when input record ``(key, seq)`` of ``partition`` is known to have no
        journal entry at all (no call, ActionDone or truncation of any action): it runs
        without reading the journal. False when it has one, or when the store cannot
        tell cheaply: the record then takes the recovery branch, which reads it."""
        return False

    def note(self, entries: Sequence[JournalEntry | Tombstone], partition: int) -> None:
        """Append entries whose acks nobody waits for (emitted markers): a store may
        track only the group, not each entry (see ``AckingProducer.send_untracked``)."""
        self.append(entries, partition)

    @abstractmethod
    def forget_firing(self, timer: TimerEntry) -> Future[None]:
        """Tombstone the call, done and truncation entries of ``timer``'s firing."""

    def finish_timer(self, timer: TimerEntry) -> Future[None]:
        """A firing completed: tombstone the timer, *then* its firing's entries.

        In this order a crash in between leaves only orphaned firing entries (cleared by
        :meth:`forget_firing` when the same timer is registered again), never a live
        timer whose completed actions are gone (which would re-run them).
        """
        first = self.append([Tombstone(entry_key(timer))], timer.partition)
        return all_of([first, self.forget_firing(timer)])

    @abstractmethod
    def remove_calls(self, ref: ActionRef, from_index: int) -> Future[None]:
        """Tombstone call slots ``from_index`` and later (truncation after divergence)."""

    def prune_records(
        self, records: Sequence[tuple[int, str]], partition: int, topic: str = ""
    ) -> None:
        """:meth:`prune` for many ``(seq, key)`` records of one partition."""
        for seq, key in records:
            self.prune(key, seq, partition, topic)

    @abstractmethod
    def prune(self, key: str, seq: int, partition: int, topic: str = "") -> None:
        """Tombstone every entry of an input record of ``topic`` whose offset is covered
        by a durable :class:`InputProgress` marker; its legacy (pre-v5) entries too when
        ``topic`` is one of :attr:`legacy_topics`, never another topic's."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release local resources."""
