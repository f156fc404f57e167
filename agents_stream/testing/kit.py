"""AgentTestContext: run an App's agents on records in-process, without a broker.

Faust has ``agent.test_context()``; this is ours (``app.test_context()``). It builds the
same runners, codecs and journal state machine a worker builds (``host/kit.py``), over an
in-memory ActionState store, so a unit test sees what production would do with a record:
its outputs, the key's short-term memory, and the journal entries of its code blocks. It
can also cut a record short between two code blocks, as a crash would, and deliver it
again to show the replay::

    ctx = app.test_context()
    run = ctx.send({"text": "refund please"}, key="u-1")
    assert run.outputs[0]["label"] == "billing"
    assert [c.function for c in run.calls] == ["triage:classify", "triage:open_case"]

    crashed = ctx.send({"text": "refund"}, key="u-2", crash_after_calls=1)
    again = ctx.redeliver(crashed)          # as after a restart: same offset
    assert (again.replayed, again.executed) == (1, 1)

How the crash is made: the record's partition is released (``durable/ownership.py``) once
its N-th call result is journaled, exactly as a worker fences a partition it lost: the
next code block does not start and nothing more is journaled or sent. ``redeliver`` takes
the partition again and runs the same record (same offset), whose journaled calls replay.

For a test against a real broker and a real worker, see :class:`~agents_stream.testing.
live.LiveWorker`.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..durable.journal import CallEntry, CallStatus
from ..durable.ownership import Ownership, OwnershipLost
from ..durable.runner import RecordInput
from ..durable.sink import Sink
from ..durable.store import completed_future
from ..durable.values import decode_value
from ..errors import ConfigurationError
from ..host.kit import DurableHost
from ..state.memory import InMemoryActionStateStore

if TYPE_CHECKING:
    from ..app import App


@dataclass(frozen=True)
class Call:
    """One journaled call of a record: its slot as a replay would find it."""

    action: str  # e.g. "Triage.triage#0"
    index: int
    function: str
    status: str  # "SUCCEEDED", "FAILED" or "PENDING"
    result: Any = None  # decoded (SUCCEEDED)
    error: str | None = None  # "Type: message" (FAILED)
    call_id: str = ""
    # A two-phase call's obligation: "PREPARED", "COMMITTED", "ABORTING" or "ABORTED"
    # (None for other calls); the commit/abort attempts so far and the last failure.
    phase: str | None = None
    attempts: int = 0
    last_error: str = ""


@dataclass
class Run:
    """What one delivery of a record did."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: Any
    outputs: list[Any] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)  # the key's, after the record
    executed: int = 0  # calls run (not replayed) by this delivery
    replayed: int = 0  # calls answered from the journal
    crashed: bool = False  # cut short by ``crash_after_calls``
    error: Exception | None = None  # the action's exception (a worker dead-letters it)


class _Collector(Sink):
    """Output sink of the test context: every output, by input topic."""

    threadsafe = True  # the runner may send from the thread that sees the journal ack

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._lock = threading.Lock()

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: Any = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        with self._lock:
            self.values.extend(values)
        return completed_future()


class _CrashingStore(InMemoryActionStateStore):
    """Releases a record's partition once it journaled N terminal call results."""

    ownership: Ownership  # always given: the holds it releases to crash a record

    def __init__(self, ownership: Ownership) -> None:
        super().__init__()
        self.ownership = ownership
        self.crash: tuple[str, int, int] | None = None  # topic, partition, calls left

    def append(self, entries: Any, partition: int) -> Future[None]:
        done = super().append(entries, partition)
        crash = self.crash
        if crash is not None:
            landed = sum(
                1
                for e in entries
                if isinstance(e, CallEntry) and e.status is not CallStatus.PENDING
            )
            left = crash[2] - landed
            if left <= 0:
                self.crash = None
                self.ownership.release(crash[0], crash[1])  # the "crash": fenced from here
            else:
                self.crash = (crash[0], crash[1], left)
        return done


class AgentTestContext:
    """Runs ``app``'s agents in this process (see the module doc). Not thread-safe: one
    test drives it. ``code_block_threads``: the pool of sync code blocks."""

    __test__ = False  # not a pytest test class, whatever a test module imports it as

    def __init__(self, app: App, *, code_block_threads: int = 8, settle: bool = True) -> None:
        """``settle``: a record that completed is committed at once and its two-phase
        calls committed (one that raised: aborted, as a dead letter's); False leaves
        them PREPARED until :meth:`settle`."""
        if not app.agents:
            raise ConfigurationError(f"app {app.id!r} has no agents to test")
        self.app = app
        self.ownership = Ownership()
        self.store = _CrashingStore(self.ownership)
        self._pool = ThreadPoolExecutor(code_block_threads, thread_name_prefix="test-code-block")
        self._sinks = {b.input: _Collector() for b in app.agents}
        self._dir = tempfile.TemporaryDirectory(prefix="agents-stream-test-")
        self.kit = DurableHost(
            app,
            bootstrap="",
            data_dir=self._dir.name,
            worker_id="test",
            executor=self._pool,
            store=self.store,
            sinks=self._sinks,
            produce=False,
            ownership=self.ownership,
        )
        self._offsets: defaultdict[tuple[str, int], int] = defaultdict(int)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Two-phase calls: a delivered record that completed counts as committed (the
        # completed-through position of its partition moves past it).
        self.auto_settle = settle
        self._committed: dict[tuple[str, int], int] = {}
        settler = self.kit.settler
        assert settler is not None
        settler.through = lambda topic, partition: self._committed.get((topic, partition))
        settler.once = True
        settler._prune = False  # the kit prunes nothing: settled calls stay to be seen
        self.settler = settler

    # -- records ---------------------------------------------------------------------------
    def send(
        self,
        value: Any,
        *,
        key: str | None = None,
        topic: str | None = None,
        partition: int = 0,
        headers: dict[str, bytes] | None = None,
        timestamp: int | None = None,
        crash_after_calls: int | None = None,
    ) -> Run:
        """Deliver one record (the next offset of its partition) and run its actions.
        ``value`` goes through the input topic's codec and back, so the action sees what a
        worker would decode (bytes are decoded as they are). ``topic`` may be left out when
        the app has one agent input. An action that raises is returned in ``Run.error``
        (a worker would dead-letter the record)."""
        return self._sync(
            self.send_async(
                value,
                key=key,
                topic=topic,
                partition=partition,
                headers=headers,
                timestamp=timestamp,
                crash_after_calls=crash_after_calls,
            )
        )

    async def send_async(
        self,
        value: Any,
        *,
        key: str | None = None,
        topic: str | None = None,
        partition: int = 0,
        headers: dict[str, bytes] | None = None,
        timestamp: int | None = None,
        crash_after_calls: int | None = None,
    ) -> Run:
        """:meth:`send` from a running event loop (pytest-asyncio tests)."""
        topic = self._topic(topic)
        codec = self.kit.bindings[topic].input_codec
        decoded = codec.decode(value if isinstance(value, bytes) else codec.encode(value))
        offset = self._offsets[(topic, partition)]
        self._offsets[(topic, partition)] = offset + 1
        record = RecordInput(
            key=key if key is not None else "",
            seq=offset,
            value=decoded,
            partition=partition,
            timestamp=timestamp if timestamp is not None else int(time.time() * 1000),
            headers=dict(headers or {}),
            keyless=key is None,
        )
        return await self._deliver(topic, record, crash_after_calls)

    def redeliver(self, run: Run, *, crash_after_calls: int | None = None) -> Run:
        """Deliver ``run``'s record again, at the same offset, as a restarted worker
        would after a crash: journaled calls replay, completed actions are skipped."""
        return self._sync(self.redeliver_async(run, crash_after_calls=crash_after_calls))

    async def redeliver_async(self, run: Run, *, crash_after_calls: int | None = None) -> Run:
        codec = self.kit.bindings[run.topic].input_codec
        record = RecordInput(
            key=run.key if run.key is not None else "",
            seq=run.offset,
            value=codec.decode(codec.encode(run.value)),
            partition=run.partition,
            keyless=run.key is None,
        )
        return await self._deliver(run.topic, record, crash_after_calls)

    def settle(self, *, timeout: float = 30.0) -> list[Call]:
        """Run the commits and aborts that are due (records committed, their actions
        complete; or dead-lettered), once each: one that raises stays PREPARED with its
        attempt counted, for the next ``settle``. Returns every two-phase call's state."""
        self.settler.sweep()
        self.settler.idle(timeout)
        return self.two_phase()

    def two_phase(self) -> list[Call]:
        """Every two-phase call still journaled, with its phase (a settled record's
        are pruned with it, as on a worker: look at ``Run.calls`` instead)."""
        return [c for c in self._all_calls() if c.phase is not None]

    # -- what is there ---------------------------------------------------------------------
    def outputs(self, topic: str | None = None) -> list[Any]:
        """Every output so far of the agent on input ``topic``."""
        return list(self._sinks[self._topic(topic)].values)

    def memory(self, key: str, partition: int = 0) -> dict[str, Any]:
        """The key's short-term memory as the journal holds it."""
        snapshot = self.store.memory(key, partition)
        if snapshot is None:
            return {}
        return {name: decode_value(raw) for name, raw in snapshot.values.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            self._loop.close()
        self._dir.cleanup()

    def __enter__(self) -> AgentTestContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------
    def _topic(self, topic: str | None) -> str:
        if topic is not None:
            if topic not in self.kit.bindings:
                raise ConfigurationError(
                    f"{topic!r} is not an agent input of app {self.app.id!r} "
                    f"(inputs: {', '.join(self.kit.bindings)})"
                )
            return topic
        if len(self.kit.bindings) != 1:
            raise ConfigurationError(
                f"app {self.app.id!r} has several agent inputs "
                f"({', '.join(self.kit.bindings)}): pass topic="
            )
        return next(iter(self.kit.bindings))

    def _sync(self, coro: Any) -> Run:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("inside an event loop: await send_async()/redeliver_async()")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)  # type: ignore[no-any-return]

    async def _deliver(self, topic: str, record: RecordInput, crash_after: int | None) -> Run:
        if self.ownership.lease(topic, record.partition) == 0:
            self.ownership.acquire(topic, record.partition)  # a new hold, as on assign
        if crash_after is not None:
            if crash_after < 0:
                raise ValueError("crash_after_calls must be >= 0")
            self.store.crash = (topic, record.partition, crash_after)
            if crash_after == 0:
                self.ownership.release(topic, record.partition)
        run = Run(topic, record.partition, record.seq, None if record.keyless else record.key,
                  record.value)  # fmt: skip
        runner = self.kit.bindings[topic].runner
        try:
            outcome = await runner.run(record)
        except OwnershipLost:
            run.crashed = True
        except Exception as exc:
            run.error = exc
        else:
            run.outputs = list(outcome.outputs)
            run.executed, run.replayed = outcome.calls_executed, outcome.calls_replayed
        finally:
            self.store.crash = None
        if not run.crashed:
            try:
                self._finished(topic, record, failed=run.error is not None)
            except OwnershipLost:  # "crashed" before its dead letter's abort was decided
                run.crashed, run.error = True, None
        if run.crashed:  # counted from the journal: the outcome never came back
            run.executed = sum(1 for c in self._calls(topic, record) if c.status != "PENDING")
        run.calls = self._calls(topic, record)
        if not record.keyless:
            run.memory = self.memory(record.key, record.partition)
        return run

    def _finished(self, topic: str, record: RecordInput, *, failed: bool) -> None:
        """The record completed (or, ``failed``, was dead-lettered): committed, as a
        worker's commit would; its two-phase calls settled when ``auto_settle``."""
        if failed:
            pending = self.settler.failed(topic, record.partition, record.seq, record.key)
            if pending is not None:
                pending.result(30)
        tp = (topic, record.partition)
        # Records run in order here (a crashed one is delivered again before the next).
        self._committed[tp] = max(self._committed.get(tp, 0), record.seq + 1)
        if self.auto_settle:
            self.settler.sweep()
            self.settler.idle(30)

    def _calls(self, topic: str, record: RecordInput | None) -> list[Call]:
        codec = self.kit.context.codec
        phases = {
            (x.ref.action, x.index, x.ref.key, x.ref.seq): x
            for p in self.store.partitions
            for x in self.store.obligations(p)
            if x.ref.topic == topic
        }
        out = []
        for entry in self.store.entries():
            ref = getattr(entry, "ref", None)
            if not isinstance(entry, CallEntry) or ref is None:
                continue
            if ref.topic != topic:
                continue
            if record is not None and (ref.key != record.key or ref.seq != record.seq):
                continue
            x = phases.get((ref.action, entry.index, ref.key, ref.seq))
            if x is not None:
                x = self.settler.current(x.ref, x.index) or x
            result = codec.decode(entry.result) if entry.result is not None else None
            error = None
            if entry.exception is not None:
                error = f"{entry.exception.type}: {entry.exception.message}"
            out.append(
                Call(
                    action=ref.action,
                    index=entry.index,
                    function=entry.function_id,
                    status=entry.status.name,
                    result=result,
                    error=error,
                    call_id=entry.call_id,
                    phase=None if x is None else x.phase.value,
                    attempts=0 if x is None else x.attempts,
                    last_error="" if x is None else x.last_error,
                )
            )
        return out  # journal order: the order the calls landed in

    def _all_calls(self) -> list[Call]:
        return [c for topic in self.kit.bindings for c in self._calls(topic, None)]
