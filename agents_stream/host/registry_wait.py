"""A schema registry that refuses mid-run: the partition waits, it is not stopped.

At start-up a registry refusal is a configuration error and stops the worker in one line
(``serde/startup.py``). Once it runs, the same refusal (a compatibility rule changed under
it, a subject deleted, the registry down while a new writer's id is fetched) says nothing
about the record either, and it is not the worker's own death (DESIGN.md, guarantee 11):
the record is neither dead-lettered nor committed, and its partition waits.

What a host does with a :class:`~agents_stream.serde.errors.RegistryError` out of a record,
in order (:meth:`RegistryWait.retry`):

1. A record of a partition that is not waiting yet is tried again at once (its failure
   may predate the end of the partition's last wait). Refused again, it logs one WARNING
   (partition, subject, version, the server's reason) and asks the host to stop fetching
   that partition (``pause``); records of it already fetched meet the same refusal and
   wait too, silently.
2. Each waiting record tries again after a backoff (``first`` seconds, doubled up to
   ``most``), or at once when another record of its partition got through. Every attempt
   counts in ``registry_retries`` (``agents_stream_registry_retries_total``).
3. When an attempt is accepted the partition's wait ends: one INFO line, fetching resumes,
   the record goes on as if it had never failed. Its journaled calls that were acked are
   replayed, not run again (the refused write was never acked).

A revoke cancels the waits; a shutdown ends them at once (:meth:`RegistryWait.stop`: the
host does not sit out a backoff on SIGTERM). Either way the record stays uncommitted and
its next owner runs it. Commits stop at the waiting record, so nothing after it is lost either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..serde.errors import RegistryError

log = logging.getLogger("agents_stream.host")  # the worker and the Faust host

T = TypeVar("T")
Pause = Callable[[str, int, bool], None]
"""``pause(topic, partition, paused)``: stop (True) or restart fetching one partition."""


@dataclass
class _Waiting:
    """One partition's wait: how many records wait, and a signal that one got through."""

    records: int = 0
    through: asyncio.Event = field(default_factory=asyncio.Event)
    accepted: bool = False


class RegistryWait:
    """Retries records that a schema registry refused mid-run, one partition at a time.

    Args:
        stats: the host's counters; ``registry_retries`` counts attempts.
        pause: the host's hook to stop and restart fetching one partition (None: the
            in-flight limit alone holds the partition back).
        first: seconds before the first retry.
        most: the longest backoff between retries.
    """

    def __init__(
        self,
        stats: MutableMapping[str, int],
        pause: Pause | None = None,
        *,
        first: float = 0.5,
        most: float = 15.0,
    ) -> None:
        self._stats = stats
        self._pause = pause
        self.first = first
        self.most = most
        self._waiting: dict[tuple[str, int], _Waiting] = {}
        self._stopped = False

    @property
    def paused(self) -> int:
        """Partitions waiting for the registry now (``agents_stream_registry_paused_partitions``)."""
        return len(self._waiting)

    def stop(self) -> None:
        """The host is stopping: every wait ends now, abandoned (CancelledError)."""
        self._stopped = True
        for waiting in self._waiting.values():
            waiting.through.set()

    @staticmethod
    def waits_on(exc: BaseException) -> bool:
        """Whether ``exc`` is the registry's (retried) rather than the record's."""
        return isinstance(exc, RegistryError)

    async def retry(
        self,
        topic: str,
        partition: int,
        where: str,
        exc: RegistryError,
        attempt: Callable[[], Awaitable[T]],
    ) -> T:
        """Run ``attempt`` again until it does not raise a :class:`RegistryError`; return
        what it returned (or raise what else it raised). ``where`` names the record.

        Raises:
            asyncio.CancelledError: the wait was cancelled (revoke, shutdown).
        """
        tp = (topic, partition)
        waiting = self._waiting.get(tp)
        if waiting is None:
            # The failure may be older than the partition's last wait (a record decoded
            # while the registry was down, run after it came back): asked again at once
            # before a new wait is declared.
            self._count()
            try:
                return await attempt()
            except RegistryError as again:
                exc = again
            waiting = self._waiting.get(tp)
        if waiting is None:
            waiting = self._waiting[tp] = _Waiting()
            log.warning(
                "%s: %s; not a bad record: not dead-lettered, not committed; partition %s[%d] "
                "paused, retrying (backoff %.1f s to %.0f s) until the registry accepts",
                where, exc, topic, partition, self.first, self.most,
            )  # fmt: skip
            if self._pause is not None:
                self._pause(topic, partition, True)
        waiting.records += 1
        delay = self.first
        try:
            while True:
                try:
                    await asyncio.wait_for(waiting.through.wait(), delay)
                except TimeoutError:
                    pass
                if self._stopped:
                    raise asyncio.CancelledError  # abandoned, not failed: not committed
                delay = min(delay * 2, self.most)
                self._count()
                try:
                    result = await attempt()
                except RegistryError as again:
                    exc = again
                    log.debug("%s: still refused: %s", where, again)
                    continue
                # The others of this partition try again now; a new signal for later ones.
                waiting.through, through = asyncio.Event(), waiting.through
                through.set()
                waiting.accepted = True
                return result
        finally:
            self._left(tp, waiting, where)

    def _count(self) -> None:
        self._stats["registry_retries"] = self._stats.get("registry_retries", 0) + 1

    def _left(self, tp: tuple[str, int], waiting: _Waiting, where: str) -> None:
        waiting.records -= 1
        if waiting.records or self._waiting.get(tp) is not waiting:
            return
        del self._waiting[tp]
        if waiting.accepted:
            log.info("%s: the schema registry accepted; partition %s[%d] resumed", where, *tp)
        if self._pause is not None:
            self._pause(tp[0], tp[1], False)
