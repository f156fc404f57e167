"""AgentHost: one agent bound to its input topic, as the worker runs it.

Per input record: decode the value (undecodable -> ``<input>-dlq``, stage ``decode``),
run the agent's actions through the durable ActionRunner, and apply the record error
policy every host shares (``host/policy.py``): a journal that cannot be read
or a strict-mode divergence stops the worker without committing the record; any other
exception is logged once (topic, partition, offset, key), then the record goes to
``<input>-dlq`` (stage ``action``) and processing goes on (``App(on_error="dlq")``), or
the worker stops (``on_error="fail"``).

``handle`` returns only when the record is finished (actions done, outputs and journal
acked, or the dead letter acked): the worker commits offsets on that signal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

from confluent_kafka import Message

from ..app import AgentBinding
from ..durable.acks import acked
from ..durable.journal import TimerEntry
from ..durable.runner import ActionRunner, RecordInput, RecordOutcome
from ..host.policy import judge, record_where
from .dlq import REPLAY_HEADER, DeadLetters, original_identity
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
    ) -> None:
        self.binding = binding
        self.runner = runner
        self._codec = input_codec
        self._dlq = dlq
        self._on_error = on_error
        self._stats = stats
        self._on_fatal = on_fatal
        # Per-agent counters read by the metrics collector at scrape time.
        self.counts: dict[str, int] = defaultdict(int)
        # (partition, offset) of finished records whose journal must outlive the commit:
        # dead letters (a replay meets it) and replays (they run under an older seq).
        self._keep: set[tuple[int, int]] = set()

    @property
    def name(self) -> str:
        return self.binding.name

    async def handle(self, msg: Message, key: str) -> None:
        self.counts["in"] += 1
        fields = record_fields(msg.topic(), msg.partition(), msg.offset(), key)
        raw = msg.value()
        if raw is None and self.binding.tombstones == "skip":
            self._stats["tombstones_skipped"] += 1
            return  # finished: committed like any other record
        try:
            value = None if raw is None else self._codec.decode(raw)
        except Exception as exc:
            log.warning(
                "undecodable record %s[%d]@%d (key %r) -> %s-dlq: %s",
                msg.topic(), msg.partition(), msg.offset(), key, msg.topic(), exc,
                extra=fields,
            )  # fmt: skip
            await self._dead_letter(msg, "decode", exc)
            return
        headers = {k: v for k, v in (msg.headers() or []) if v is not None}
        seq = msg.offset()
        replayed = self._replayed_seq(msg, headers) if REPLAY_HEADER in headers else None
        if replayed is not None:
            seq = replayed
        record = RecordInput(
            key=key,
            seq=seq,
            value=value,
            partition=msg.partition(),
            timestamp=msg.timestamp()[1],
            headers=headers,
            keyless=msg.key() is None,
        )
        outcome = await self._guarded(
            self.runner.run(record),
            f"action of {self.name} raised on "
            + record_where(msg.topic(), msg.partition(), msg.offset(), key),
            fields,
            dead_letter_to=f"{msg.topic()}-dlq",
        )
        if isinstance(outcome, BaseException):
            await self._dead_letter(msg, "action", outcome)
            return
        self.counts["out"] += len(outcome.outputs)
        if replayed is not None:
            self._keep.add((msg.partition(), msg.offset()))
        self._count(outcome)

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

    def keeps_journal(self, partition: int, offset: int) -> bool:
        """Whether a finished record's ActionStates must not be pruned (asked once)."""
        try:
            self._keep.remove((partition, offset))
            return True
        except KeyError:
            return False

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
        except asyncio.CancelledError:
            raise
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

    async def _dead_letter(self, msg: Message, stage: str, exc: BaseException) -> None:
        self._stats["dlq"] += 1
        self.counts[f"failed:{stage}"] += 1
        await acked(self._dlq.send(msg, stage, exc))
        self._keep.add((msg.partition(), msg.offset()))
