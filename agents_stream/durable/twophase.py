"""Two-phase calls: the obligations prepared calls leave, and their settling.

A ``TwoPhaseCommitCallable`` call journals, in one append, its obligation
(:class:`~.journal.TwoPhaseCall`, PREPARED) and then its slot (SUCCEEDED with
``prepare()``'s result): a durable slot implies a durable obligation (per-partition
order), and the action sees the prepared result only once both are acked.

What happens to an obligation is decided from durable facts only, so that whoever
holds the partition next decides the same way:

* **commit** when its record is below the partition's durable completed-through marker
  (at-least-once: acked; exactly-once: committed with its transaction) and the action
  that prepared it has its ActionDone: the action completed, its outputs are in the log.
* **abort** when the record will never complete with that preparation: the action
  raised and the record was dead-lettered or dropped (:meth:`Settler.failed`), a replay
  diverged from the slot (the context's truncation), or, found when the partition is
  assigned, the record is below the marker with no ActionDone (skipped by an offset
  reset). An abort is decided first (ABORTING, acked), then ``abort()`` runs, then
  ABORTED is journaled: a record that runs again meanwhile (a dead-letter replay, or the
  same record after a crash) finds the preparation aborted and prepares afresh
  (``round`` + 1, ``call_id~round``), never commits an aborted one.

``commit()``/``abort()`` run on the settler's threads, off the record path, in call order
per record, retried with backoff until they return (a commit is never turned into an
abort); COMMITTED / ABORTED is journaled when they return. A crash in between runs them
again: they must be idempotent. A record with an open obligation is not pruned (its
ActionDone is the evidence of the decision) until the obligation is settled; then the
settler prunes it, if its host pruned it meanwhile (``held_back``: a dead letter's journal,
kept for its replay, is not pruned).

Only the settler writes an obligation after it is prepared, under one lock with the
newest state of each one it has written and not yet heard back about (``_known``; once
acked the store holds it): a decision is checked against the obligation's round and
phase right before it is written, so a stale decision never overwrites a fresh
preparation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from .acks import NO_SERVING, AckServing
from .identity import call_shape
from .journal import ActionRef, CallEntry, TwoPhase, TwoPhaseCall
from .keys import obligation_key
from .ownership import OwnershipLost
from .values import decode_value

if TYPE_CHECKING:
    from .payload import PayloadCodec
    from .store import ActionStateStore

log = logging.getLogger("agents_stream.durable.twophase")

Record = tuple[str, int, int, str]  # topic, partition, seq, key

SWEEP_EVERY_S = 1.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
ACK_TIMEOUT_S = 30.0


def round_call_id(call_id: str, round_: int) -> str:
    """The call id handed to a preparation: the slot's own for the first one,
    ``<call id>~<round>`` for one prepared afresh after an abort (an external system
    that deduplicates on the id must not answer with the aborted one)."""
    return call_id if round_ == 0 else f"{call_id}~{round_}"


def record_of(x: TwoPhaseCall) -> Record:
    return (x.ref.topic, x.ref.partition, x.ref.seq, x.ref.key)


class Settler:
    """Settles the two-phase obligations of the partitions its host holds.

    ``through(topic, partition)``: the host's durable completed-through marker (None
    when unknown); ``holds(partition)``: whether the host still holds it; ``prune``:
    whether the host prunes committed records (then a settled record is pruned here).
    """

    def __init__(
        self,
        store: ActionStateStore,
        codec: PayloadCodec,
        *,
        app_id: str,
        worker_id: str,
        through: Callable[[str, int], int | None],
        holds: Callable[[int], bool] = lambda partition: True,
        prune: bool = True,
        acks: AckServing = NO_SERVING,
        threads: int = 4,
        sweep_every: float = SWEEP_EVERY_S,
        once: bool = False,
    ) -> None:
        """``once``: a commit or abort that raises is tried again by the next
        :meth:`sweep`, not retried in place (the test kit's settling, step by step)."""
        self.once = once
        self.store = store
        self.codec = codec
        self.app_id = app_id
        self.worker_id = worker_id
        self.through = through
        self._holds = holds
        self._prune = prune
        self._acks = acks
        self._sweep_every = sweep_every
        self._lock = threading.RLock()
        self._known: dict[bytes, TwoPhaseCall] = {}
        # Partition -> its open obligations' keys (see _open_of).
        self._index: dict[int, dict[bytes, tuple[ActionRef, int]]] = {}
        self._jobs: dict[Record, Future[None]] = {}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="agents-stream-2pc")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats: dict[str, int] = {
            "two_phase_prepared": 0,
            "two_phase_committed": 0,
            "two_phase_aborted": 0,
            "two_phase_failures": 0,
        }

    # -- what the context writes ---------------------------------------------------------
    def prepared(self, x: TwoPhaseCall, slot: CallEntry) -> Future[None]:
        """Journal a preparation: the obligation, then its slot, in one append."""
        with self._lock:
            self.stats["two_phase_prepared"] += 1
            return self._write([x], [x, slot])

    def _write(
        self, obligations: list[TwoPhaseCall], entries: list[TwoPhaseCall | CallEntry]
    ) -> Future[None]:
        """Append ``entries`` (under the lock), ``obligations`` known as the newest
        state of theirs until the append is answered: acked, the store holds them (its
        future resolves once the cache has applied them); failed, they never were."""
        keys = [obligation_key(x.ref, x.index) for x in obligations]
        for key, x in zip(keys, obligations, strict=True):
            self._known[key] = x
            index = self._index.get(x.ref.partition)
            if index is not None and x.phase.open:
                index[key] = (x.ref, x.index)
        try:
            fut = self.store.append(entries, obligations[0].ref.partition)
        except BaseException:
            self._forget(keys, obligations)
            raise
        fut.add_done_callback(lambda _: self._forget(keys, obligations))
        return fut

    def _forget(self, keys: list[bytes], obligations: list[TwoPhaseCall]) -> None:
        with self._lock:
            for key, x in zip(keys, obligations, strict=True):
                if self._known.get(key) is x:
                    del self._known[key]

    def current(self, ref: ActionRef, index: int) -> TwoPhaseCall | None:
        """The newest state of slot ``index``'s obligation (written here, else read)."""
        with self._lock:
            known = self._known.get(obligation_key(ref, index))
        return known if known is not None else self.store.obligation(ref, index)

    def aborting(self, obligations: Iterable[TwoPhaseCall]) -> Future[None] | None:
        """Decide to abort ``obligations`` (open ones of one partition): ABORTING in one
        append; their aborts are queued once it is acked. None when there are none."""
        doomed = [x for x in obligations if x.phase is TwoPhase.PREPARED]
        if not doomed:
            return None
        marked = [replace(x, phase=TwoPhase.ABORTING, worker_id=self.worker_id) for x in doomed]
        with self._lock:
            fut = self._write(marked, list(marked))
        fut.add_done_callback(
            lambda f: None if f.exception() else [self.settle(record_of(x)) for x in marked]
        )
        return fut

    def settle_now(self, x: TwoPhaseCall) -> Future[None]:
        """The settling of ``x``'s record, started now if not running (a record that
        runs again and meets an ABORTING preparation waits for its abort)."""
        return self.settle(record_of(x))

    def abort_unjournaled(self, target: object, prepared: object, call_id: str) -> None:
        """Abort a preparation that was never journaled (its result could not be), once,
        with the value in hand; logged if it raises."""

        def run() -> None:
            method = target.abort  # type: ignore[attr-defined]
            args, kwargs = call_shape(method).arguments(call_id, (prepared,), {})
            try:
                method(*args, **kwargs)
            except Exception as exc:
                log.warning(
                    "abort of two-phase call %s, whose prepared result could not be "
                    "journaled, failed (not retried: nothing journaled says to): %s: %s",
                    call_id, type(exc).__name__, exc,
                )  # fmt: skip

        try:
            self._pool.submit(run)
        except RuntimeError:  # closed
            run()

    # -- the host's hooks ------------------------------------------------------------------
    def failed(self, topic: str, partition: int, seq: int, key: str) -> Future[None] | None:
        """The record was dead-lettered or dropped: abort its open obligations whose
        action did not complete (those of actions that completed are committed once the
        record is below the marker)."""
        open_ = [
            x
            for x in self._open_of(partition)
            if record_of(x) == (topic, partition, seq, key) and self.store.done(x.ref) is None
        ]
        return self.aborting(open_)

    def assigned(self, topic: str, partition: int) -> int:
        """The partition was taken (its cache rebuilt, its marker loaded), before any of
        its records runs here: settle every open obligation below the marker, aborting
        those whose action never completed (its record was skipped). How many."""
        self._load(partition)  # what the last owner left
        return self._sweep(topic, partition, assigned=True)

    def revoked(self, partition: int) -> None:
        """Nothing more is written for ``partition``: running settles stop at their next
        step (the store refuses writes for a partition not held)."""
        with self._lock:
            for key in [k for k, x in self._known.items() if x.ref.partition == partition]:
                del self._known[key]
            self._index.pop(partition, None)

    @property
    def waiting(self) -> int:
        """Open obligations of the partitions held: commits or aborts owed."""
        return sum(1 for x in self._open() if self._holds(x.ref.partition))

    def idle(self, timeout: float | None = None) -> None:
        """Wait for every settling started so far (and those they start) to end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                jobs = [j for j in self._jobs.values() if not j.done()]
            if not jobs:
                return
            for job in jobs:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    job.result(left)
                except Exception:
                    pass

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="agents-stream-2pc-sweep", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- sweeping ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self._sweep_every):
            try:
                self.sweep()
            except Exception as exc:  # the next round tries again
                log.warning("two-phase sweep failed (retried): %s", exc, exc_info=exc)

    def sweep(self) -> int:
        """Settle what is due on every held partition; how many records were started."""
        started = 0
        for topic, partition in {(x.ref.topic, x.ref.partition) for x in self._open()}:
            started += self._sweep(topic, partition, assigned=False)
        return started

    def _open(self) -> list[TwoPhaseCall]:
        out: list[TwoPhaseCall] = []
        for partition in self.store.partitions:
            out += self._open_of(partition)
        return out

    def _open_of(self, partition: int) -> list[TwoPhaseCall]:
        """The open obligations of ``partition``: from the index of those this process
        knows to be open (read whole from the store once per assignment, then kept by
        its own writes), each read at its newest state; a settled one leaves the index.
        A sweep costs a point read per open obligation, not a scan of every settled one
        a journal that is not pruned keeps."""
        with self._lock:
            index = self._index.get(partition)
        if index is None:
            index = self._load(partition)
        found, settled = [], []
        for key, (ref, slot) in list(index.items()):
            x = self.current(ref, slot)
            if x is not None and x.phase.open:
                found.append(x)
            else:
                settled.append(key)
        if settled:
            with self._lock:
                for key in settled:
                    if key not in self._known:  # not one being written
                        index.pop(key, None)
        return found

    def _load(self, partition: int) -> dict[bytes, tuple[ActionRef, int]]:
        index = {
            obligation_key(x.ref, x.index): (x.ref, x.index)
            for x in self.store.obligations(partition)
            if x.phase.open
        }
        with self._lock:
            for key, x in self._known.items():
                if x.ref.partition == partition and x.phase.open:
                    index[key] = (x.ref, x.index)
            self._index[partition] = index
        return index

    def _sweep(self, topic: str, partition: int, *, assigned: bool) -> int:
        if not self._holds(partition):
            return 0
        through = self.through(topic, partition)
        if through is None:
            return 0
        due: set[Record] = set()
        skipped: list[TwoPhaseCall] = []
        for x in self._open_of(partition):
            if x.ref.topic != topic:
                continue
            if x.phase is TwoPhase.ABORTING:
                due.add(record_of(x))  # decided: due whatever the marker says
                continue
            if not 0 <= x.ref.seq < through:
                continue
            if self.store.done(x.ref) is not None:
                due.add(record_of(x))
            elif assigned:
                skipped.append(x)  # below the marker, never completed: skipped by a reset
        if skipped:
            log.warning(
                "%s[%d]: %d prepared two-phase call(s) of records below completed-through "
                "marker %d whose action never completed (skipped by an offset reset): "
                "aborting", topic, partition, len(skipped), through,
            )  # fmt: skip
            self.aborting(skipped)
        for record in sorted(due):
            self.settle(record)
        if self._prune:
            # Held back from a prune by an obligation since settled elsewhere (a Spark
            # reconcile): pruned now.
            open_records = {record_of(x) for x in self._open_of(partition)}
            for record in self.store.held_back(topic, partition):
                if record not in open_records and record not in self._jobs:
                    self._pruned(record)
        return len(due) + len(skipped)

    # -- settling one record ---------------------------------------------------------------
    def settle(self, record: Record) -> Future[None]:
        """Settle the open obligations of ``record`` in call order (one job per record:
        a second request joins the running one)."""
        with self._lock:
            job = self._jobs.get(record)
            if job is not None and not job.done():
                return job
            try:
                job = self._pool.submit(self._settle, record)
            except RuntimeError:  # closed
                job = Future()
                job.set_exception(OwnershipLost(record[0], record[1], "the settler is closed"))
                return job
            self._jobs[record] = job
        job.add_done_callback(lambda done: self._forget_job(record, done))
        return job

    def _forget_job(self, record: Record, job: Future[None]) -> None:
        with self._lock:
            if self._jobs.get(record) is job:
                del self._jobs[record]

    def _settle(self, record: Record) -> None:
        topic, partition = record[0], record[1]
        try:
            for x in sorted(self._open_of(partition), key=lambda o: o.index):
                if record_of(x) != record:
                    continue
                commit = x.phase is TwoPhase.PREPARED
                if commit and not self._committable(x):
                    continue  # not decided yet
                self._finish(x, commit)
            self._pruned(record)
        except OwnershipLost as exc:
            log.info("%s[%d]: two-phase settling stopped: %s", topic, partition, exc)
        except Exception as exc:  # a journal write not acked in time, a test kit's raise
            level = logging.INFO if self.once else logging.WARNING
            log.log(level, "%s[%d]: two-phase settling of %s left for the next sweep: %s",
                    topic, partition, record, exc)  # fmt: skip

    def _committable(self, x: TwoPhaseCall) -> bool:
        """Its record is below the durable marker and its action completed."""
        through = self.through(x.ref.topic, x.ref.partition)
        if through is None or not 0 <= x.ref.seq < through:
            return False
        return self.store.done(x.ref) is not None

    def _still(self, x: TwoPhaseCall) -> bool:
        """Whether ``x`` is still the open preparation of its slot."""
        now = self._known.get(obligation_key(x.ref, x.index)) or self.store.obligation(
            x.ref, x.index
        )
        return now is not None and now.round == x.round and now.phase.open

    def _finish(self, x: TwoPhaseCall, commit: bool) -> None:
        """Run ``commit``/``abort`` of ``x`` until it returns, then journal it."""
        with self._lock:
            if not self._still(x):
                return
        what = "commit" if commit else "abort"
        attempts, error, delay = x.attempts, x.last_error, BACKOFF_FIRST_S
        target = decode_value(x.target)
        prepared = None if x.prepared is None else self.codec.decode(x.prepared)
        method = getattr(target, what)
        call_id = round_call_id(x.call_id, x.round)
        args, kwargs = call_shape(method).arguments(call_id, (prepared,), {})
        while True:
            if self._stop.is_set() or not self._holds(x.ref.partition):
                raise OwnershipLost(x.ref.topic, x.ref.partition)
            attempts += 1
            try:
                method(*args, **kwargs)
                break
            except Exception as exc:
                error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
                self.stats["two_phase_failures"] += 1
                if self.once:
                    with self._lock:
                        if self._still(x):  # the attempt is remembered, not journaled
                            key = obligation_key(x.ref, x.index)
                            self._known[key] = replace(x, attempts=attempts, last_error=error)
                    raise
                log.warning(
                    "%s of two-phase call %s (%s, key=%r seq=%s action=%s index=%d) failed, "
                    "attempt %d, retried in %.1f s: %s",
                    what, call_id, x.function_id, x.ref.key, x.ref.seq, x.ref.action,
                    x.index, attempts, delay, error,
                )  # fmt: skip
                if self._stop.wait(delay):
                    raise OwnershipLost(
                        x.ref.topic, x.ref.partition, "the settler is closed"
                    ) from exc
                delay = min(BACKOFF_MAX_S, delay * 2)
        done = replace(
            x,
            phase=TwoPhase.COMMITTED if commit else TwoPhase.ABORTED,
            settled_ms=int(time.time() * 1000),
            attempts=attempts,
            last_error=error,
            worker_id=self.worker_id,
        )
        with self._lock:
            if not self._still(x):
                return  # prepared afresh, or settled by someone else meanwhile
            fut = self._write([done], [done])
        self._acks.wait(fut, ACK_TIMEOUT_S)
        self.stats["two_phase_committed" if commit else "two_phase_aborted"] += 1

    def _pruned(self, record: Record) -> None:
        """Every obligation of ``record`` is settled and the record is committed: prune
        it, obligations included (the host prunes committed records)."""
        topic, partition, seq, key = record
        if not self._prune:
            return
        through = self.through(topic, partition)
        if through is None or seq >= through:
            return
        left = [x for x in self._open_of(partition) if record_of(x) == record]
        if left or not self.store.release_held(record):
            return  # still owed; or not one the host pruned (a dead letter's, kept)
        self.store.prune_settled([(seq, key)], partition, topic)


__all__ = ["Settler", "obligation_key", "round_call_id"]
