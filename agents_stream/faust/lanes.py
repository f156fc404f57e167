"""KeyLanes: the Faust host's records run concurrently by key, in order within a key.

Faust's own ``agent(concurrency=N)`` runs N copies of the agent over one stream, so two
records of one key may run at once and finish in either order. A durable agent must keep
a key's records in order (its memory, and a replay, see them that way), as the worker's
execution controller does; records of other keys have nothing to wait for. With calls
that take ``t`` seconds, one at a time caps an agent at ``1 / t`` records a second.

A lane is one task per busy key that runs the key's records one after another; at most
``limit`` records are admitted at once (submitted and not finished), and :meth:`submit`
waits for room, which holds back Faust's stream the way one record at a time did.
Faust commits only the offsets below the first record not yet acked, so records that
finish out of order are never committed past an unfinished one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

Job = Callable[[], Awaitable[Any]]


class KeyLanes:
    """Run jobs one at a time per key, different keys concurrently, ``limit`` at once.

    A job that raises stops nothing else; the first such error is raised by the next
    :meth:`submit` (or :meth:`join`), as a record raising in the agent's loop would be.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1; got {limit}")
        self.limit = limit
        self._room = asyncio.Semaphore(limit)
        self._waiting: dict[Hashable, deque[Job]] = {}  # busy keys: jobs queued behind
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None
        self.in_flight = 0  # admitted, not finished (running or queued behind their key)

    async def submit(self, key: Hashable, job: Job) -> None:
        """Admit ``job`` for ``key`` (waiting while ``limit`` jobs are admitted); it runs
        after every job submitted earlier for the same key."""
        self._raise_error()
        await self._room.acquire()
        self.in_flight += 1
        queue = self._waiting.get(key)
        if queue is not None:
            queue.append(job)
            return
        queue = self._waiting[key] = deque()
        task = asyncio.ensure_future(self._lane(key, queue, job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _lane(self, key: Hashable, queue: deque[Job], job: Job) -> None:
        while True:
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                if self._error is None:
                    self._error = exc
            finally:
                self.in_flight -= 1
                self._room.release()
            if not queue:
                del self._waiting[key]
                return
            job = queue.popleft()

    async def join(self) -> None:
        """Wait until every admitted job finished; raise the first error of one."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._raise_error()

    def cancel(self) -> None:
        """Cancel the running jobs and drop the queued ones (the agent is stopping:
        unacked records are consumed again, their journaled calls replayed)."""
        for task in list(self._tasks):
            task.cancel()
        for queue in self._waiting.values():
            self.in_flight -= len(queue)
            queue.clear()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error
