"""OutputSink: where an agent's outputs go, the whole interface the record path uses.

The record path sends an action's outputs once its ActionDone is acknowledged (one record
at a time, or a group commit's records together), and after a crash asks whether outputs
of an ActionDone not marked emitted are in the topic already. Every sink answers all of
it; :class:`Sink` gives a sink that only knows how to ``send`` the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any, NamedTuple, Protocol

from ..ackfuture import AckFuture, resolved
from ..errors import KafkaIOError, PartialSendError
from .journal import ActionDone


class SinkItem(NamedTuple):
    """One input record's outputs in a group send."""

    key: str
    values: Sequence[Any]
    partition: int  # of the input record
    stored: Sequence[bytes] | None  # the values as the ActionDone journals them (JSON)
    done: ActionDone | None  # whose outputs these are: their identity


class OutputSink(Protocol):
    """Attributes:
    threadsafe: ``send``/``send_batch`` may be called from the producer's thread (chained
        on the ActionDone's acknowledgement), not only from the event loop.
    takes_stored: the sink uses ``stored``, the values as their ActionDone journals them
        with the JSON payload codec (see ``values.plain_json``), instead of encoding the
        values again.
    finds_outputs: ``landed`` can tell which outputs are in the topic already (an output
        log); False: it always answers [] and is not asked.
    """

    # Read-only: a sink may derive them (an output sink finds outputs when it has an
    # output log).
    @property
    def threadsafe(self) -> bool: ...

    @property
    def takes_stored(self) -> bool: ...

    @property
    def finds_outputs(self) -> bool: ...

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        """Send one record's ``values`` (the outputs of ``done`` at ``indexes``, default
        all); the future resolves when they are durable. A failure that names the lost
        outputs is a :class:`PartialSendError` at position 0."""
        ...

    def send_batch(self, outputs: Sequence[SinkItem]) -> Future[None]:
        """Several records' outputs, one future for all: a failure is a
        :class:`PartialSendError` naming the records at fault (positions in ``outputs``);
        every output of the others is durable."""
        ...

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        """Those of ``indexes`` whose output of ``done`` is in the topic already
        (blocking)."""
        ...


class Sink:
    """Base of sinks that implement ``send`` only: a group is sent record by record, and
    nothing is found in the topic after a crash (outputs are sent again)."""

    threadsafe = False
    takes_stored = False
    finds_outputs = False

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        raise NotImplementedError

    def send_batch(self, outputs: Sequence[SinkItem]) -> Future[None]:
        return each_sent(
            [self.send(o.key, o.values, o.partition, o.stored, done=o.done) for o in outputs]
        )

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        return []


class NullSink(Sink):
    """Outputs go nowhere (an agent without an output topic)."""

    threadsafe = True

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        return resolved()


def each_sent(sends: Sequence[Future[None]]) -> Future[None]:
    """One future for the sends of several records' outputs (one future per record),
    settled once all are: failing with :class:`PartialSendError` naming the positions
    whose send failed (and, from a record's own ``PartialSendError``, its outputs that
    landed); the others' outputs are all durable."""
    if not sends:
        return resolved()
    failed: dict[int, Exception] = {}
    landed: dict[int, tuple[int, ...]] = {}
    combined: Future[None] = AckFuture()
    left = [len(sends)]
    lock = threading.Lock()

    def one_done(position: int, fut: Future[None]) -> None:
        exc = fut.exception()
        with lock:
            if isinstance(exc, PartialSendError):
                failed[position] = exc.failed[0]
                if 0 in exc.landed:
                    landed[position] = exc.landed[0]
            elif isinstance(exc, Exception):  # a sink's own error keeps its type
                failed[position] = exc
            elif exc is not None:  # cancelled
                failed[position] = KafkaIOError(f"output send {type(exc).__name__}")
            left[0] -= 1
            if left[0]:
                return
        if failed:
            combined.set_exception(PartialSendError(failed, landed))
        else:
            combined.set_result(None)

    for position, fut in enumerate(sends):
        fut.add_done_callback(partial(one_done, position))
    return combined
