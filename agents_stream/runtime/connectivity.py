"""The connectivity watch: tells a worker that the broker stopped answering it (a network
partition), as the freeze watchdog (``watchdog.py``) tells it that its process stopped.

Why: a worker cut off from the cluster hears nothing. librdkafka retries into the void and
reports its own session timeout only ``session.timeout.ms`` after the last heartbeat
(measured: 10.5 s after the cut with a 6 s session, 4.5 s after the other member had taken
the partitions over). Meanwhile the worker keeps starting code blocks for the backlog it
fetched before the cut; their results can never be journaled, so the next owner runs every
one of them again (measured: 107 calls in flight at the cut, 494 started after it, 600 run
twice). A worker that stays connected hears an answer every few milliseconds: the
journal's delivery reports.

So, watched every beat of the watchdog's thread (``WATCHDOG_BEAT``), on the journal
producer (every code block's outcome is a journal write, so a worker that starts code
blocks always has writes to be answered):

1. *Stalled*: records outstanding and no successful delivery report for ``stall_after``
   (four times the usual time between answers, 50-500 ms: a busy journal hears from a
   healthy broker every few milliseconds). New code blocks
   wait (:meth:`Ownership.admit`): starting a side effect whose outcome cannot be
   journaled only widens the window in which a crash runs it twice. A stall that ends
   (a slow broker, a leader moving, a cut that heals) costs that wait and nothing else.
2. *Cut off*: no answer for ``lost_after`` (the freeze limit: the session may have
   expired since, see ``freeze_after``): every hold is suspended
   (:meth:`Ownership.suspend`), as after a freeze: nothing of the partitions runs or is
   written from then on, and the worker asks the group whether they are still its own
   (``worker_rebalance.py``, ``after_freeze``) once it can reach it.

A worker that writes nothing (idle, or between bursts) has nothing to lose by not
knowing: it starts no code block until it writes, and the first write that goes
unanswered stalls the next ones.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from time import monotonic
from typing import Any

from ..durable.ownership import Ownership
from ..kafka.producer import Ack, AckingProducer

log = logging.getLogger("agents_stream.worker")

# Stalled: no answer for a few times the usual time between answers, within these
# bounds. Each call started in that window after a cut runs again on the next owner, so
# it is short; a false stall (the loop serving the reports busy for a moment) only makes
# code blocks wait that moment.
STALL_MIN = 0.05
STALL_MAX = 0.5
STALL_FACTOR = 4.0
GAP_WEIGHT = 0.05  # of each answer in the moving average of the time between answers
WARN_AFTER = 1.0  # a stall this long is logged (shorter ones are counted only)


class ConnectivityWatch:
    """Watches the answers of ``producer``'s broker(s) for ``ownership``.

    ``lost_after``: seconds without an answer, with writes outstanding, after which every
    hold is suspended (the worker's freeze limit).
    """

    def __init__(
        self,
        ownership: Ownership,
        producer: AckingProducer,
        *,
        lost_after: float,
        stats: MutableMapping[str, int] | None = None,
    ) -> None:
        self.ownership = ownership
        self.producer = producer
        self.lost_after = lost_after
        # Moving average of the time between answers while writes are outstanding: a
        # worker that keeps its journal busy hears from the broker every few ms (however
        # long each record waits, answers come in a stream).
        self.gap = STALL_MIN / STALL_FACTOR
        self._answered = monotonic()  # the last delivery report, or nothing outstanding
        self._warned = False
        # Stalls that held code blocks back, suspensions this watch caused: counted in the
        # worker's stop line.
        self.stats: MutableMapping[str, int] = stats if stats is not None else {}
        producer.observe_acks(self._on_acks)

    @property
    def cuts(self) -> int:
        return self.stats.get("broker_silences", 0)

    @property
    def stall_after(self) -> float:
        return min(STALL_MAX, max(STALL_MIN, STALL_FACTOR * self.gap), self.lost_after / 2)

    def unanswered(self) -> float:
        """Seconds since the last answer while writes are outstanding (0 when none are):
        any thread (the metrics scrape)."""
        client: Any = self.producer._producer
        if client is None or not len(client):
            return 0.0
        return max(0.0, monotonic() - self._answered)

    def _on_acks(self, batch: Sequence[Ack]) -> None:
        # The thread serving delivery reports. An error report is no answer: a record
        # timing out is librdkafka giving up locally.
        if not any(ack.error is None for ack in batch):
            return
        now = monotonic()
        gap, self._answered = now - self._answered, now
        self.gap += GAP_WEIGHT * (min(gap, STALL_MAX) - self.gap)

    def tick(self) -> None:
        """The watchdog's thread, every beat (before its freeze check)."""
        client: Any = self.producer._producer  # not built yet: nothing ever sent
        now = monotonic()
        if client is None or not len(client):
            # Nothing outstanding: nothing to be answered.
            self._answered = now
            self._stall(False, 0.0)
            return
        silent = now - self._answered
        self._stall(silent > self.stall_after, silent)
        ownership = self.ownership
        if silent > self.lost_after and ownership.suspended is None and ownership.held():
            # Once: the holds are released then (held() is empty until the group
            # confirms them), and the stall stays on while the silence lasts.
            self.stats["broker_silences"] = self.cuts + 1
            ownership.suspend(
                f"no answer from the broker for {silent:.1f}s with {len(client)} records "
                f"outstanding (over {self.lost_after:.1f}s: cut off from the cluster?)"
            )

    def _stall(self, stalled: bool, silent: float) -> None:
        ownership = self.ownership
        if stalled and not ownership.stalled:
            self.stats["journal_stalls"] = self.stats.get("journal_stalls", 0) + 1
        ownership.stalled = stalled
        if stalled and not self._warned and silent >= WARN_AFTER:
            self._warned = True
            log.warning(
                "the broker has not answered the journal for %.1fs: code blocks wait "
                "(its partitions are given up after %.1fs of this)",
                silent,
                self.lost_after,
            )
        elif not stalled and self._warned:
            self._warned = False
            log.info("the broker answers again: code blocks start")
