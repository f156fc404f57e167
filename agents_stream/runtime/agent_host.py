"""AgentHost: one agent bound to its input topic, as the worker runs it.

Per input record: decode the value (undecodable -> ``<input>-dlq``, stage ``decode``),
run the agent's actions through the durable ActionRunner, and apply the record error
policy every host shares (``host/policy.py``): a journal that cannot be read
or a strict-mode divergence stops the worker without committing the record; any other
exception is logged once (topic, partition, offset, key), then the record goes to
``<input>-dlq`` (stage ``action``) and processing goes on (``App(on_error="dlq")``), or
the worker stops (``on_error="fail"``).

The worker decodes a record with :meth:`AgentHost.prepare` as it dispatches it, and
submits it to the execution controller on its partition's lane (:meth:`AgentHost.lane`,
a :class:`~agents_stream.durable.lane.RecordLane`). The lane reports each record here
(:class:`PartitionLane`), where the error policy and the counts are applied, and this
reports it finished to the controller only when it is (actions done, outputs and
journal acked, or the dead letter acked): the worker commits offsets on that signal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any, Literal, cast

from confluent_kafka import Message

from ..app import AgentBinding
from ..durable.acks import acked
from ..durable.errors import DurableCallError
from ..durable.journal import TimerEntry
from ..durable.lane import Ended, RecordLane
from ..durable.ownership import OwnershipLost
from ..durable.runner import ActionRunner, RecordInput, RecordOutcome
from ..host.dlq import REPLAY_HEADER, DeadLetters, original_identity
from ..host.policy import judge, record_where, undelivered
from ..host.progress import KeptJournals
from ..host.registry_wait import RegistryWait
from ..serde.errors import RegistryError
from .controller import Admitted, ExecutionController
from .logs import record_fields

log = logging.getLogger("agents_stream.worker")


class AgentHost:
    def __init__(
        self,
        binding: AgentBinding,
        runner: ActionRunner,
        input_codec: Any,
        dlq: DeadLetters,
        *,
        on_error: Literal["dlq", "fail"],
        stats: MutableMapping[str, int],
        on_fatal: Callable[[BaseException], None],
        on_undelivered: Callable[[BaseException], None] | None = None,
        controller: ExecutionController,
        registry_wait: RegistryWait | None = None,
    ) -> None:
        self.binding = binding
        self.runner = runner
        self._codec = input_codec
        self._dlq = dlq
        self._on_error = on_error
        self._stats = stats
        self._on_fatal = on_fatal
        self._on_undelivered = on_undelivered
        # Per-agent counters read by the metrics collector at scrape time.
        self.counts: dict[str, int] = defaultdict(int)
        self.kept = KeptJournals()
        self._tombstones_seen: set[int] = set()  # partitions whose first one was logged
        self.controller = controller
        self._lanes: dict[int, PartitionLane] = {}
        # A registry refusal mid-run: the record waits and retries (host/registry_wait.py);
        # without one, it stops the worker like any fatal error.
        self._registry = registry_wait

    @property
    def name(self) -> str:
        return self.binding.name

    def lane(self, partition: int) -> PartitionLane:
        """Where the records of ``partition`` run (a new lane once a drain stopped the
        previous one)."""
        lane = self._lanes.get(partition)
        if lane is None or lane.stopped:
            lane = self._lanes[partition] = PartitionLane(self)
        return lane

    def prepare(
        self, msg: Message, key: str, partition: int, offset: int, keyless: bool
    ) -> RecordInput | Exception | None:
        """The record's runner input (``source`` is ``msg``; the other arguments are what
        the dispatcher read of it already); None when it is finished already (a skipped
        tombstone), an exception when it cannot be decoded (it goes to the DLQ:
        :meth:`dead_letter`)."""
        self.counts["in"] += 1
        raw = msg.value()
        if raw is None:
            self._tombstone(msg)
            if self.binding.tombstones == "skip":
                self._stats["tombstones_skipped"] += 1
                return None  # finished: committed like any other record
        try:
            value = None if raw is None else self._codec.decode(raw)
        except Exception as exc:
            if not isinstance(exc, RegistryError):  # not the record's: dead_letter stops
                log.warning(
                    "undecodable record %s[%d]@%d (key %r) -> %s-dlq: %s",
                    msg.topic(), msg.partition(), msg.offset(), key, msg.topic(), exc,
                    extra=record_fields(msg.topic(), msg.partition(), msg.offset(), key),
                )  # fmt: skip
            return exc
        return self._input(msg, key, partition, offset, keyless, value)

    def _input(
        self, msg: Message, key: str, partition: int, offset: int, keyless: bool, value: Any
    ) -> RecordInput:
        raw_headers = msg.headers()
        headers = {k: v for k, v in raw_headers if v is not None} if raw_headers else {}
        seq = offset
        if headers and REPLAY_HEADER in headers:
            replayed = self._replayed_seq(msg, headers)
            if replayed is not None:
                seq = replayed
        record = RecordInput(
            key=key,
            seq=seq,
            value=value,
            partition=partition,
            timestamp=msg.timestamp()[1],
            headers=headers,
            keyless=keyless,
            source=msg,
        )
        if self.runner.traces is not None:
            self.runner.traces.begin(msg.topic(), record, offset)
        return record

    async def _conclude(
        self, msg: Message, key: str, record: RecordInput, outcome: RecordOutcome | Exception
    ) -> None:
        """Apply the error policy to a failed record (dead letter, or stop: raises), or
        count a finished one. A record of a partition this member lost is neither: it
        raises OwnershipLost (not finished, not committed; its next owner runs it)."""
        if isinstance(outcome, RegistryError) and self._registry is not None:
            where = record_where(msg.topic(), msg.partition(), msg.offset(), key)
            outcome = await self._registry.retry(
                msg.topic(), msg.partition(), f"action of {self.name} on {where}", outcome,
                partial(self._rerun, record),
            )  # fmt: skip
        if (
            self._on_undelivered is not None
            and isinstance(outcome, Exception)
            and undelivered(outcome)
        ):
            # The cluster did not take a journal or output write (a broker outage, below
            # min ISR): the record is abandoned, not dead-lettered, and every partition is
            # taken again from its committed offsets (worker_rebalance.py: undelivered).
            self._on_undelivered(outcome)
            outcome = OwnershipLost(msg.topic(), msg.partition(), f"a write failed: {outcome}")
        if isinstance(outcome, OwnershipLost):
            self._abandoned(msg, outcome)
            raise outcome
        if isinstance(outcome, Exception):
            # A journaled failure replayed (a dead letter replayed before its fix) raised
            # out of the action: no RecordOutcome counts that call (issue 67, item 8).
            self._stats["calls_replayed"] += _replayed_failure(outcome)
            where = record_where(msg.topic(), msg.partition(), msg.offset(), key)
            verdict = judge(
                log,
                outcome,
                f"action of {self.name} raised on {where}",
                self._on_error,
                host="worker",
                dead_letter_to=f"{msg.topic()}-dlq",
                extra=record_fields(msg.topic(), msg.partition(), msg.offset(), key),
            )
            if verdict.stops:
                self._on_fatal(outcome)
                raise outcome
            settler = self.runner.config.two_phase
            if settler is not None:
                # Its preparations are aborted before it can be replayed (a replay, or
                # this record again after a crash, then prepares afresh).
                pending = settler.failed(msg.topic(), record.partition, record.seq, record.key)
                if pending is not None:
                    await acked(pending)
            await self.dead_letter(msg, "action", outcome)
            return
        self._finished(msg, record, outcome)

    async def _rerun(self, record: RecordInput) -> RecordOutcome | Exception:
        """Run ``record`` again from its journal (acked calls replayed); a registry
        refusal raises (retried), any other failure is returned (judged as usual)."""
        try:
            return await self.runner.run(record)
        except RegistryError:
            raise
        except Exception as exc:
            return exc

    async def _decode_later(self, msg: Message, exc: RegistryError) -> None:
        """A value the registry could not help decode (its writer's id not fetched):
        decoded again once it answers, then run; dead-lettered only if the registry's
        answer shows the record bad."""
        assert self._registry is not None
        raw_key = msg.key()
        key = raw_key.decode("utf-8", "backslashreplace") if raw_key is not None else ""
        partition, offset = msg.partition(), msg.offset()
        where = record_where(msg.topic(), partition, offset, key)

        async def decode() -> Any:
            return self._codec.decode(msg.value())

        try:
            value = await self._registry.retry(
                msg.topic(), partition, f"decoding {where}", exc, decode
            )
        except Exception as bad:  # the registry answered: the record's own fault
            log.warning(
                "undecodable record %s -> %s-dlq: %s", where, msg.topic(), bad,
                extra=record_fields(msg.topic(), partition, offset, key),
            )  # fmt: skip
            await self.dead_letter(msg, "decode", bad)
            return
        record = self._input(msg, key, partition, offset, raw_key is None, value)
        await self._conclude(msg, key, record, await self._rerun(record))

    def _tombstone(self, msg: Message) -> None:
        """Counted (``agents_stream_agent_tombstones_total``) and said once per partition:
        a producer sending null values is worth knowing about before the shutdown line."""
        self.counts["tombstones"] += 1
        if msg.partition() not in self._tombstones_seen:
            self._tombstones_seen.add(msg.partition())
            log.info(
                "%s[%d]@%d: a tombstone (null value, key %r): %s; logged once per partition",
                msg.topic(), msg.partition(), msg.offset(), msg.key(),
                "skipped and committed" if self.binding.tombstones == "skip"
                else "delivered as InputEvent(input=None)",
                extra=record_fields(msg.topic(), msg.partition(), msg.offset(), None),
            )  # fmt: skip

    def _abandoned(self, msg: Message, exc: OwnershipLost) -> None:
        self._stats["records_abandoned_not_owned"] += 1
        log.debug(
            "%s[%d]@%d abandoned: %s", msg.topic(), msg.partition(), msg.offset(), exc,
            extra=record_fields(msg.topic(), msg.partition(), msg.offset(), None),
        )  # fmt: skip

    def _finished(self, msg: Message, record: RecordInput, outcome: RecordOutcome) -> None:
        self.counts["out"] += len(outcome.outputs)
        self._keep_replayed(record)
        self._count(outcome)

    def _keep_replayed(self, record: RecordInput) -> None:
        """A replayed dead letter (run under its original seq): its journal is kept."""
        msg = record.source
        if record.seq != msg.offset():
            self.kept.add((msg.partition(), msg.offset()))
            self.runner.store.pin(msg.topic(), msg.partition(), record.seq, record.key)

    def _replayed_seq(self, msg: Message, headers: dict[str, bytes]) -> int | None:
        """The original offset of a replayed record of this partition, else None."""
        identity = original_identity(headers, msg.topic())
        if identity is None or identity[0] != msg.partition():
            log.warning(
                "%s[%d]@%d: ignoring %s=%r (not a record of this partition); processed as new",
                msg.topic(), msg.partition(), msg.offset(), REPLAY_HEADER, headers[REPLAY_HEADER],
            )  # fmt: skip
            return None
        return identity[1]

    async def handle_timer(self, timer: TimerEntry) -> None:
        """Fire one due timer: its TimerEvent actions run durably, then it is retired.

        Same policy as records; a timer whose action raises is dropped (logged and
        counted), like a record sent to the DLQ, rather than retried forever.
        """
        outcome = await self._guarded(
            self.runner.run_timer(timer.key, timer.partition, timer.kind, timer.ts),
            f"timer action of {self.name} raised on {timer.kind} timer {timer.ts} "
            f"of key={timer.key!r}",
        )
        if isinstance(outcome, BaseException):
            self._stats["timer_errors"] += 1
            await acked(self.runner.store.finish_timer(timer))
            return
        if outcome.timer_fired:
            self._stats["timers_fired"] += 1
        self._count(outcome)

    async def _guarded(
        self,
        run: Awaitable[RecordOutcome],
        what: str,
        fields: dict[str, Any] | None = None,
        *,
        dead_letter_to: str | None = None,
    ) -> RecordOutcome | BaseException:
        """Apply the error policy (host/policy.py); an exception returned means
        "dead-letter or drop it"."""
        try:
            return await run
        except (asyncio.CancelledError, OwnershipLost):
            raise  # abandoned, not failed: the firing stays journaled for the next owner
        except Exception as exc:
            verdict = judge(
                log,
                exc,
                what,
                self._on_error,
                host="worker",
                dead_letter_to=dead_letter_to,
                extra=fields,
            )
            if verdict.stops:
                self._on_fatal(exc)
                raise
            return exc

    def _count(self, outcome: RecordOutcome) -> None:
        self._stats["calls_executed"] += outcome.calls_executed
        self._stats["calls_replayed"] += outcome.calls_replayed
        self._stats["actions_skipped"] += outcome.actions_skipped
        if outcome.outputs_found or outcome.outputs_resent:
            self._stats["outputs_found"] += outcome.outputs_found
            self._stats["outputs_resent"] += outcome.outputs_resent

    async def dead_letter(self, msg: Message, stage: str, exc: BaseException) -> None:
        """Send ``msg`` to its dead-letter topic and return once that is acked."""
        if isinstance(exc, RegistryError) and self._registry is not None:
            await self._decode_later(msg, exc)
            return
        if isinstance(exc, RegistryError):
            # Issue 52: the schema registry did not answer while the value was decoded.
            # Not the record's fault: stop without committing it, never dead-letter it.
            where = record_where(msg.topic(), msg.partition(), msg.offset(), str(msg.key()))
            judge(log, exc, f"decoding {where}", self._on_error, host="worker")
            self._on_fatal(exc)
            raise exc
        self._stats["dlq"] += 1
        self.counts[f"failed:{stage}"] += 1
        await acked(self._dlq.send(msg, stage, exc))
        self.kept.add((msg.partition(), msg.offset()))
        # Its replay meets its journal: a completion it has in a group is given a row of
        # its own, which outlives the group (pruned below the completed-through marker).
        key = msg.key()
        self.runner.store.pin(
            msg.topic(), msg.partition(), msg.offset(), "" if key is None else key.decode()
        )


def _replayed_failure(exc: BaseException | None) -> int:
    """1 when ``exc``, or an exception it was raised from, is a journaled failure that a
    code block replayed (durable/failures.py notes it, or it is a DurableCallError)."""
    for _ in range(8):
        if exc is None:
            return 0
        notes = getattr(exc, "__notes__", ())
        if isinstance(exc, DurableCallError) or any(
            str(n).startswith("replayed from journal") for n in notes
        ):
            return 1
        exc = exc.__cause__ or exc.__context__
    return 0


class PartitionLane:
    """One partition's lane of an agent: runs the records the controller starts on a
    :class:`RecordLane` and reports them back, finished or not, after the error policy.

    A failed record is concluded on a task of its own (its dead letter acked, or the
    worker stopped) before it is reported; :meth:`stop` cancels those too."""

    def __init__(self, host: AgentHost) -> None:
        self._host = host
        self._controller = host.controller
        self._traces = host.runner.traces  # tracing.py; None when OpenTelemetry is off
        # A key's next record may start once this one's ActionDone is acked and its
        # outputs are sent, before they are acked. If they then fail, the record is dead-
        # lettered and the next one's outputs follow, as when it ran after the failure.
        # Not with on_error="fail": the worker stops and replays the failed outputs on
        # restart, after the next record's, which could be out by then.
        self._lane: RecordLane[Admitted] = RecordLane(
            host.runner, self, release_early=host._on_error != "fail"
        )
        self._tails: set[asyncio.Future[None]] = set()  # failed records being concluded
        self.stopped = False  # by a drain: the partition's next records get a new lane

    def start(self, records: list[Admitted]) -> None:
        self._lane.start(records)

    async def stop(self) -> None:
        self.stopped = True
        await self._lane.stop()
        tails = self._tails
        for task in tails:
            task.cancel()
        while tails:
            await asyncio.wait(list(tails))

    # -- LaneReports ----------------------------------------------------------------------
    def report(self, ticket: Admitted, outcome: Ended) -> None:
        record = cast(RecordInput, ticket.payload)
        msg = cast(Message, record.source)
        if self._traces is not None:  # a failed one's span ends once it is concluded
            self._traces.end(msg.topic(), record, msg.offset(), outcome)
        if isinstance(outcome, RecordOutcome):
            self._host._finished(msg, record, outcome)
            self._controller.finished([ticket], True)
        elif isinstance(outcome, OwnershipLost | asyncio.CancelledError):
            if isinstance(outcome, OwnershipLost):
                self._host._abandoned(msg, outcome)
            self._controller.finished([ticket], False)  # never committed: replayed elsewhere
        else:
            task = asyncio.ensure_future(self._host._conclude(msg, record.key, record, outcome))
            self._tails.add(task)
            task.add_done_callback(partial(self._concluded, ticket))

    def _concluded(self, ticket: Admitted, task: asyncio.Future[None]) -> None:
        self._tails.discard(task)
        if self._traces is not None:  # after its dead letter, which carries its traceparent
            record = ticket.payload
            self._traces.end(record.source.topic(), record, record.source.offset(), None)
        self._controller.finished([ticket], not task.cancelled() and task.exception() is None)

    def finished(self, done: list[tuple[Admitted, RecordOutcome]]) -> None:
        """The records of one group commit, finished: counted, then reported to the
        controller in one call."""
        host = self._host
        total = RecordOutcome()  # summed without a call per record
        outputs = 0
        for ticket, outcome in done:
            record: RecordInput = ticket.payload
            if self._traces is not None:
                self._traces.end(record.source.topic(), record, record.source.offset(), outcome)
            if record.headers:
                host._keep_replayed(record)
            outputs += len(outcome.outputs)
            total.calls_executed += outcome.calls_executed
            total.calls_replayed += outcome.calls_replayed
            total.actions_skipped += outcome.actions_skipped
            total.outputs_found += outcome.outputs_found
            total.outputs_resent += outcome.outputs_resent
        host.counts["out"] += outputs
        host._count(total)
        self._controller.finished([ticket for ticket, _ in done], True)

    def released(self, tickets: list[Admitted]) -> None:
        self._controller.released(tickets)
