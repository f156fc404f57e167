"""One Faust event through the ActionRunner: run, then ack; or dead-letter; or stop.

This is the record policy of the worker (``runtime/worker.py``), applied to Faust events
so that the two hosts replay and commit alike:

1. The event becomes a :class:`RecordInput` (key as ``str``, ``seq`` = input offset,
   partition, timestamp in ms, headers) and runs through the ActionRunner to completion:
   every action done, its journal records and outputs acknowledged by the broker.
2. Only then is the event acked. Faust commits acked offsets, so an input offset is never
   committed before its actions completed; an unacked record is re-consumed after a crash
   and its journaled calls are replayed, completed actions skipped.
3. An action that raises: the verdict is the worker's (:mod:`agents_stream.host.policy`).
   With ``on_error="dlq"`` the record is copied to ``<input>-dlq`` (headers say why),
   then acked; with ``"fail"`` (and always for journal decode errors and strict
   non-determinism) it is *not* acked and the Faust app is crashed, so the record is
   re-consumed by the next worker.
   Once the host is stopping, no later event is run or acked either: Faust commits
   the first run of consecutive acked offsets, which could otherwise skip the
   unacked one.
4. A record whose partition was revoked while it ran is abandoned, unacked: the next
   owner of the partition re-runs it with its journaled calls replayed.
5. A dead letter replayed to its input (``agents-stream dlq replay``, header
   ``x-replay-of``) runs under its original offset, so it meets what its first attempt
   journaled. The completed-through skip still goes by the replay's own offset, and the
   journals of dead-lettered and replayed records are kept (not pruned), as the worker
   does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol

from ..durable.ownership import OwnershipLost
from ..durable.runner import ActionRunner, RecordInput, RecordOutcome
from ..host.dlq import REPLAY_HEADER, original_identity
from ..host.policy import OnError, judge, record_where
from ..host.progress import CompletedThrough, KeptJournals
from ..host.registry_wait import RegistryWait
from ..serde.errors import RegistryError

log = logging.getLogger("agents_stream.faust")


class FaustMessage(Protocol):
    """What the handler reads of ``faust.types.Message`` (duck-typed for fakes)."""

    topic: str
    partition: int
    offset: int
    timestamp: float | None
    key: bytes | None
    value: bytes | None
    headers: Any


class FaustEvent(Protocol):
    """What the handler reads of ``faust.types.EventT``."""

    key: Any
    value: Any
    message: Any  # FaustMessage

    def ack(self) -> bool: ...


class DeadLetterSink(Protocol):
    def send(self, msg: Any, stage: str, exc: BaseException) -> Future[None]: ...


def record_key(key: Any) -> str:
    """The agents_stream key of a Faust event key: ``str`` as is, bytes as UTF-8 (invalid
    bytes backslash-escaped, as the worker does), ``None`` as ``""``."""
    if key is None:
        return ""
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key).decode("utf-8", "backslashreplace")
    return str(key)


def record_headers(headers: Any) -> dict[str, bytes]:
    """Faust headers (a mapping or a list of pairs) as ``{name: bytes}``; None values
    are dropped, ``str`` values UTF-8 encoded."""
    if not headers:
        return {}
    pairs: Iterable[tuple[Any, Any]] = headers.items() if hasattr(headers, "items") else headers
    out: dict[str, bytes] = {}
    for name, value in pairs:
        if value is None:
            continue
        out[str(name)] = value.encode() if isinstance(value, str) else bytes(value)
    return out


def record_input(event: FaustEvent) -> RecordInput:
    """The RecordInput of a Faust event: ``seq`` is the input offset, so a re-consumed
    record meets the ActionStates of its earlier run; for a replayed dead letter, the
    offset it was dead-lettered from (:func:`replayed_offset`)."""
    msg = event.message
    ts = msg.timestamp
    headers = record_headers(msg.headers)
    replayed = replayed_offset(msg, headers) if REPLAY_HEADER in headers else None
    return RecordInput(
        key=record_key(event.key),
        seq=int(msg.offset) if replayed is None else replayed,
        value=event.value,
        partition=int(msg.partition),
        timestamp=int(ts * 1000) if ts else None,
        headers=headers,
        # As in the worker: a record without a key shares neither memory nor order.
        keyless=getattr(msg, "key", event.key) is None and event.key is None,
    )


def replayed_offset(msg: FaustMessage, headers: dict[str, bytes]) -> int | None:
    """The original offset named by ``x-replay-of`` when it is a record of this very
    topic and partition (its journal lives in this partition); else None, logged: the
    header is anyone's to write, so a foreign one only makes the record run as new."""
    identity = original_identity(headers, str(msg.topic))
    if identity is not None and identity[0] == int(msg.partition):
        return identity[1]
    log.warning(
        "%s[%d]@%d: ignoring %s=%r (not a record of this partition); processed as new",
        msg.topic, msg.partition, msg.offset, REPLAY_HEADER, headers[REPLAY_HEADER],
    )  # fmt: skip
    return None


class ConfluentLikeMessage:
    """A Faust message seen through the confluent-kafka ``Message`` accessors that
    :class:`~agents_stream.host.dlq.DeadLetters` reads."""

    def __init__(self, msg: Any) -> None:
        self._msg = msg

    def topic(self) -> str:
        return str(self._msg.topic)

    def partition(self) -> int:
        return int(self._msg.partition)

    def offset(self) -> int:
        return int(self._msg.offset)

    def key(self) -> bytes | None:
        return self._msg.key  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self._msg.value  # type: ignore[no-any-return]

    def headers(self) -> list[tuple[str, bytes]]:
        return list(record_headers(self._msg.headers).items())


class FaustRecordHandler:
    """Runs Faust events of one input topic through an ActionRunner (see module doc).

    Args:
        runner: the agent's runner (store partitions must be assigned by the caller).
        dead_letters: where failed records go with ``on_error="dlq"``.
        on_error: ``"dlq"`` or ``"fail"``, as ``App(on_error=...)``.
        crash: called with the exception when the host must stop (Faust ``app.crash``).
        owns: whether this host still owns an input partition (revoked -> abandon).
        registry_wait: where a record the schema registry refused mid-run waits and is
            run again (``host/registry_wait.py``); None: such a record crashes the app.
    """

    def __init__(
        self,
        runner: ActionRunner,
        *,
        dead_letters: DeadLetterSink | None,
        on_error: OnError,
        crash: Callable[[BaseException], Awaitable[None]],
        owns: Callable[[int], bool],
        progress: CompletedThrough | None = None,
        registry_wait: RegistryWait | None = None,
    ) -> None:
        self.runner = runner
        self.dead_letters = dead_letters
        self.on_error = on_error
        self._crash = crash
        self._owns = owns
        self._registry = registry_wait
        self.failed: BaseException | None = None
        self.kept = KeptJournals()
        # Completed-through markers (host/progress.py), loaded by the host on assignment.
        self.progress = progress or CompletedThrough(runner.store, "", rerun_completed=False)
        self.stats: dict[str, int] = {
            "records": 0,
            "calls_executed": 0,
            "calls_replayed": 0,
            "actions_skipped": 0,
            "outputs_found": 0,
            "outputs_resent": 0,
            "dlq": 0,
            "abandoned": 0,
        }

    async def handle(self, event: FaustEvent) -> bool:
        """Process ``event``; returns True when it was acked (done or dead-lettered)."""
        if self.failed is not None:
            return False  # stopping: leave it (and everything after it) unacked
        record = record_input(event)
        offset = int(event.message.offset)
        # The replay's own offset: a replayed dead letter sits above the marker even
        # though it runs under the older offset it was dead-lettered from.
        if self.progress.skips(self.runner.topic, record.partition, offset):
            # Finished before (re-delivered after an offset reset): running it again
            # would charge its side effects twice.
            self.stats["skipped_completed"] = self.stats.get("skipped_completed", 0) + 1
            event.ack()
            return True
        try:
            outcome = await self.runner.run(record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not (isinstance(exc, RegistryError) and self._registry is not None):
                return await self._failed(event, record, exc)
            try:  # not the record's fault: it waits for the registry, then runs again
                outcome = await self._registry.retry(
                    event.message.topic, record.partition, self._where(event, record), exc,
                    partial(self.runner.run, record),
                )  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as again:
                return await self._failed(event, record, again)
        self._count(outcome)
        if record.seq != offset:
            self.kept.add((record.partition, offset))
        event.ack()
        return True

    def _count(self, outcome: RecordOutcome) -> None:
        self.stats["records"] += 1
        self.stats["calls_executed"] += outcome.calls_executed
        self.stats["calls_replayed"] += outcome.calls_replayed
        self.stats["actions_skipped"] += outcome.actions_skipped
        self.stats["outputs_found"] += outcome.outputs_found
        self.stats["outputs_resent"] += outcome.outputs_resent

    @staticmethod
    def _where(event: FaustEvent, record: RecordInput) -> str:
        msg = event.message
        return record_where(msg.topic, record.partition, int(msg.offset), record.key)

    async def _failed(self, event: FaustEvent, record: RecordInput, exc: Exception) -> bool:
        msg = event.message
        where = self._where(event, record)
        if isinstance(exc, OwnershipLost) or not self._owns(record.partition):
            self.stats["abandoned"] += 1
            log.info("%s abandoned: partition revoked while it ran (%r)", where, exc)
            return False
        verdict = judge(
            log,
            exc,
            f"action of {self.runner.name} raised on {where}",
            self.on_error,
            host="Faust app",
            dead_letter_to=f"{msg.topic}-dlq",
            can_dead_letter=self.dead_letters is not None,
        )
        if verdict.stops or self.dead_letters is None:
            self.failed = exc
            await self._crash(exc)
            return False
        settler = self.runner.config.two_phase
        if settler is not None:  # its preparations aborted before it can be replayed
            try:
                pending = settler.failed(msg.topic, record.partition, record.seq, record.key)
                if pending is not None:
                    await asyncio.wrap_future(pending)
            except OwnershipLost as lost:
                self.stats["abandoned"] += 1
                log.info("%s abandoned: partition revoked before its dead letter (%r)", where, lost)
                return False
        await asyncio.wrap_future(self.dead_letters.send(ConfluentLikeMessage(msg), "action", exc))
        self.stats["dlq"] += 1
        self.kept.add((record.partition, int(msg.offset)))
        event.ack()
        return True
