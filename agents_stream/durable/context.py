"""RunnerContext: what an action sees, and the journal state machine of its code blocks.

Slot protocol (one slot per ``execute*`` call, index assigned when the call *starts*):

0. When the call is made, before anything is journaled or run: the arguments must bind
   to the function's signature (else TypeError, the caller's bug), the reconciler must
   take no arguments or the call's own, and every argument must be in the journaled
   value domain (:mod:`.values`), whose canonical encoding is the args digest.
1. Look up the journaled slot at this index. If its function id or args digest differ
   from this call, the action diverged: drop this slot and every later one not yet
   resolved by this run (tombstones plus a Truncation record, acked), warn, and continue
   as if nothing was journaled. Slots this run already replayed or wrote stay: their
   outcome reached the action (or ran a side effect), so dropping them would run them
   again after a crash. Strict mode raises :class:`NonDeterminismError` instead.
2. SUCCEEDED -> return the stored result. FAILED -> raise an equivalent exception.
   PENDING with a reconciler -> run the reconciler (never the function) and journal its
   outcome in the same slot. PENDING without a reconciler -> execute again.
3. Nothing journaled: for reconcilable calls journal PENDING and wait for the ack
   *before* the function starts; run the function (with retries); journal the terminal
   outcome and wait for its ack before returning to the action. A result that cannot
   be journaled (outside the value domain, or over ``max_entry_bytes``) is journaled
   as a failure with that library error, so a replay neither re-runs the call nor
   returns anything else.

Nothing a code block returns reaches the action before it is durable, so a crash at any
point either replays the outcome or (PENDING) reconciles it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from types import FunctionType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from ..agent import learn_calls_sync
from ..events import Event, OutputEvent
from .acks import NO_SERVING, AckServing, acked
from .bridge import Carrier, await_, bridged, carrier
from .callable import DurableCallable, RetryPolicy, TwoPhaseCommitCallable
from .errors import (
    CodeBlockViolation,
    DurableError,
    JournalDecodeError,
    NonDeterminismError,
    PayloadError,
    ResultTooLargeError,
)
from .failures import exception_info, rebuild_exception
from .identity import (
    LEGACY_DIGEST_LEN,
    CallShape,
    args_digest,
    call_shape,
    function_id,
    legacy_args_digest,
    reconciler_form,
)
from .inflight import Flight
from .journal import (
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    TimerUpdate,
    Tombstone,
    Truncation,
    TwoPhase,
    TwoPhaseCall,
    entry_key,
)
from .memory import ShortTermMemory
from .ownership import Ownership, OwnershipLost
from .payload import PayloadCodec, encode_result
from .pool import CodeBlockPool
from .timers import Timers
from .twophase import Settler, round_call_id
from .values import encode_value

if TYPE_CHECKING:
    from ..tracing import CallTrace
    from .store import ActionStateStore

log = logging.getLogger("agents_stream.durable")

P = ParamSpec("P")
R = TypeVar("R")

_IN_CODE_BLOCK: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agents_stream_in_code_block", default=False
)


_CONTEXT_LOCK = threading.Lock()
# Plain function -> (function id, target, shape, is a coroutine function): what
# ``_describe`` works out of a code block's function, once per function.
_PLANS: dict[Any, tuple[str, Callable[..., Any], CallShape, bool]] = {}

# Async actions are tasks of their own: under load one loop round resumes hundreds of
# them, each journaling its next call, and the reports that come back meanwhile waited
# for the round to end (p50 over 5 ms). Every 16 results journaled, the loop serves the
# reports that are due (``ContextConfig.acks``; a sync action's batch does the same).
_ASYNC_RESULTS = itertools.count()


def _now_ms() -> int:
    return int(time.time() * 1000)


ENTRY_OVERHEAD_BYTES = 16 * 1024
"""Room kept in a journal record for everything but the payload (identity, traceback,
Avro and Kafka framing)."""

DEFAULT_MAX_ENTRY_BYTES = 1_000_000 - ENTRY_OVERHEAD_BYTES
"""For Kafka's defaults: topic ``max.message.bytes`` 1048588, producer
``message.max.bytes`` 1000000."""


def max_entry_bytes_for(max_message_bytes: int) -> int:
    """``ContextConfig.max_entry_bytes`` for a journal whose records may be at most
    ``max_message_bytes`` (the smaller of the ActionState topic's ``max.message.bytes``
    and the producer's ``message.max.bytes``)."""
    return max(1024, max_message_bytes - ENTRY_OVERHEAD_BYTES)


@dataclass(frozen=True)
class ContextConfig:
    """What every RunnerContext of a host shares.

    Attributes:
        max_entry_bytes: largest encoded result journaled; a larger one fails its call
            with :class:`ResultTooLargeError` before anything is produced. Hosts that
            know the ActionState topic's limit pass ``max_entry_bytes_for(limit)``.
    """

    app_id: str
    worker_id: str
    codec: PayloadCodec
    strict: bool = False
    executor: Any = None  # concurrent.futures.Executor for execute_async of sync functions
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    # The host's partition holds (durable/ownership.py): every code block checks its
    # action's lease before it starts. None: a host that owns no partitions.
    ownership: Ownership | None = None
    # Where the journal's acks are served (durable/acks.py): the host's producer.
    acks: AckServing = NO_SERVING
    # Settles two-phase calls' obligations (durable/twophase.py); None: a host that
    # cannot (a Spark backfill), where a TwoPhaseCommitCallable is refused.
    two_phase: Settler | None = None


@dataclass
class _Call:
    fn: Callable[..., Any]
    shape: CallShape
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    fid: str
    digest: str
    reconciler: Callable[..., Any] | None
    reconciler_shape: CallShape | None
    reconciler_takes_args: bool  # False: the zero-argument (Flink Agents) form
    retry: RetryPolicy | None
    # A TwoPhaseCommitCallable's call: the object (its encoding journaled with the
    # obligation) and the preparation round this run makes (durable/twophase.py).
    two_phase: TwoPhaseCommitCallable[Any] | None = None
    target: bytes = b""
    round: int = 0


_warned_blocking: set[tuple[str, str]] = set()


def _warn_blocking(action: str, fid: str) -> None:
    """``ctx.execute`` outside a carrier (``durable/bridge.py``) cannot suspend: it waits
    for its journal ack on the event loop (a sync action's code block runs there too,
    not in the pool), and every other record of the worker waits too. Actions run in a
    carrier when their own code names ``ctx.execute`` (``calls_sync`` in ``agent.py``);
    one that reached it through a helper function is learned here, so its later records
    run in one. A task an async action created never runs in its carrier: said once per
    action and function."""
    learn_calls_sync(action)
    if (action, fid) in _warned_blocking:
        return
    _warned_blocking.add((action, fid))
    log.warning(
        "%s: ctx.execute(%s) ran outside the action's carrier and blocked the event "
        "loop, and every other record, until it and its journal ack were done. Called "
        "from a helper function, later records of this action run in a carrier and do "
        "not block; called from a task the action created, it blocks every time: use "
        "`await ctx.execute_async(...)` there",
        action,
        fid,
    )


def _run_guarded(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    flight: Flight | None = None,
) -> Any:
    if flight is not None:
        # Here, on the thread that runs it, not when it was queued: a pool thread may
        # take the call after this member lost the partition (a SIGSTOP between), or
        # after its record was abandoned.
        flight.enter()
    token = _IN_CODE_BLOCK.set(True)
    try:
        return target(*args, **kwargs)
    finally:
        # Also on BaseException: a thread's context outlives this call, and a leaked
        # flag would forbid memory to every later action on that thread.
        _IN_CODE_BLOCK.reset(token)


async def _in_code_block(awaitable: Awaitable[Any], flight: Flight | None = None) -> Any:
    if flight is not None:
        flight.enter()  # when the task starts: a later loop round than the call
    _IN_CODE_BLOCK.set(True)  # this task's own context: released when it ends
    return await awaitable


class _Blocks:
    """Code blocks of one action run in flight, and the thread the action runs on: a
    thread a code block started has none of its context, so its memory writes are told
    apart by thread (see ``_refuse_in_code_block``)."""

    __slots__ = ("running", "thread")

    def __init__(self) -> None:
        self.running = 0
        self.thread = threading.get_ident()


def _refuse_in_code_block(action: str, blocks: _Blocks | None, what: str) -> None:
    if _IN_CODE_BLOCK.get() or (
        blocks is not None and blocks.running and threading.get_ident() != blocks.thread
    ):
        # The second case: a thread started by a code block (or any other thread) while
        # one of the action's code blocks runs. A replay skips the code block, so what
        # that thread wrote would be missing from the replayed memory.
        raise CodeBlockViolation(
            f"{what} called inside a code block of {action}: memory, timers and events are "
            "journaled with the action, not the call; return a value from the code block "
            "and use it in the action body"
        )


class RunnerContext:
    """Passed to every action as ``ctx``.

    ``execute``/``execute_async`` are durable code blocks (see module docstring);
    ``short_term_memory``, ``timers`` and ``send_event`` must not be used inside them.
    """

    # Set by a traced action (tracing.py) to get its code blocks' spans.
    _trace: CallTrace | None = None

    def __init__(
        self,
        ref: ActionRef,
        store: ActionStateStore,
        config: ContextConfig,
        memory_base: dict[str, bytes] | Callable[[], dict[str, bytes]],
        *,
        firing: tuple[str, int] | None = None,
        fresh: bool = False,
    ) -> None:
        self.ref = ref
        self.key = ref.key
        self._store = store
        self._config = config
        # Read on the first call; known empty for a record the store says is fresh.
        self._slots: dict[int, CallEntry] | None = {} if fresh else None
        self._resolved: set[int] = set()  # slots this run replayed or (re)wrote
        self._next_index = 0
        # Memory and timers are built when the action first touches them: most actions
        # touch neither, and a context is built for every action run.
        self._memory_base = memory_base
        self._firing = firing
        self._memory: ShortTermMemory | None = None
        self._timers: Timers | None = None
        self.sent_events: list[Event] = []
        self.outputs: list[Any] = []
        self.replayed_calls = 0
        self.executed_calls = 0
        # Made by the first code block or memory access, on the action's thread (most
        # actions make neither).
        self._blocks: _Blocks | None = None
        ownership = config.ownership
        # The hold this action started under (durable/ownership.py); 0 with no ownership.
        self._lease = ownership.lease(ref.topic, ref.partition) if ownership is not None else 0

    def _guard_fn(self) -> Callable[[str], None]:
        # Not the bound method: memory and timers holding it would make every context a
        # reference cycle, left (with its closures, ~18 objects a record) to the collector.
        blocks = self._blocks
        if blocks is None:
            blocks = self._blocks = _Blocks()
        return partial(_refuse_in_code_block, self.ref.action, blocks)

    def check_hold(self) -> None:
        """Raise OwnershipLost when this member no longer holds the partition this
        action started under (a code block is about to start, an ActionDone about to be
        journaled)."""
        ownership = self._config.ownership
        if ownership is not None:
            ownership.check(self.ref.topic, self.ref.partition, self._lease)

    def _admit(self) -> None:
        """A code block is about to start: as :meth:`check_hold`, after waiting out a
        journal that stopped answering (``Ownership.admit``)."""
        ownership = self._config.ownership
        if ownership is not None:
            ownership.admit(self.ref.topic, self.ref.partition, self._lease)

    def _flight(self) -> Flight:
        if self._blocks is None:
            self._blocks = _Blocks()
        ownership = self._config.ownership
        if ownership is None:
            return Flight(None)
        # As _admit, without a reference to this context (a thread may hold the flight).
        return Flight(partial(ownership.admit, self.ref.topic, self.ref.partition, self._lease))

    @property
    def short_term_memory(self) -> ShortTermMemory:
        """The key's short-term memory (get/set/delete); not inside a code block."""
        memory = self._memory
        if memory is None:
            memory = self._memory = ShortTermMemory(self._memory_base, self._guard_fn())
        return memory

    @short_term_memory.setter
    def short_term_memory(self, memory: ShortTermMemory) -> None:
        self._memory = memory

    @property
    def timers(self) -> Timers:
        """Timers of the key (register/delete event- and processing-time timers)."""
        timers = self._timers
        if timers is None:
            timers = self._timers = Timers(self._guard_fn(), self._firing)
        return timers

    @timers.setter
    def timers(self, timers: Timers) -> None:
        self._timers = timers

    def _effects(self) -> tuple[dict[str, bytes | None], tuple[TimerUpdate, ...]]:
        """The memory updates and timer changes of this run (both empty when untouched)."""
        memory, timers = self._memory, self._timers
        return (
            memory.updates if memory is not None else {},
            timers.updates if timers is not None else (),
        )

    @property
    def _journal(self) -> dict[int, CallEntry]:
        """The journaled slots of this action run, read when first needed (an action
        that makes no call never pays the cache scan)."""
        slots = self._slots
        if slots is None:
            slots = self._slots = self._store.calls(self.ref)
        return slots

    # A context is built for every action run and most never make a call, so they share
    # one lock instead of each allocating its own: it only guards a few assignments (a
    # call's index and resolved slots), so contention between contexts is negligible.
    _lock = _CONTEXT_LOCK

    # -- events ---------------------------------------------------------------------
    def send_event(self, event: Event) -> None:
        """Trigger the actions listening for ``event`` (same key and input record), or
        emit ``OutputEvent.output`` to the output topic once this action completes."""
        self._guard("send_event")
        if isinstance(event, OutputEvent):
            self.outputs.append(event.output)
        else:
            self.sent_events.append(event)

    def _guard(self, what: str) -> None:
        _refuse_in_code_block(self.ref.action, self._blocks, what)

    # -- durable calls --------------------------------------------------------------
    # Typed overloads: the result is ``fn``'s return type. Arguments are checked against
    # ``fn``'s parameters when nothing library-specific is passed (PEP 612 allows no
    # keyword-only ``reconciler=``/``retry=`` beside ``P.kwargs``, and ``call_id`` is
    # injected, so those forms fall back to an unchecked argument list).
    @overload
    def execute(self, fn: DurableCallable[R], /, *args: Any, **kwargs: Any) -> R: ...
    @overload
    def execute(self, fn: TwoPhaseCommitCallable[R], /, *args: Any, **kwargs: Any) -> R: ...
    @overload
    def execute(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def execute(  # type: ignore[overload-cannot-match]
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> R: ...
    def execute(  # type: ignore[misc]  # reconciler=/retry= are keyword-only, see above
        self,
        fn: Callable[..., Any] | DurableCallable[Any] | TwoPhaseCommitCallable[Any],
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` durably and return its result.

        From a sync action, ``fn`` runs in the worker's thread pool while the action
        waits, suspended on the event loop without holding a thread (``durable/bridge.py``);
        from an ``async`` action it runs inline (keep it quick: use
        :meth:`execute_async` for I/O) and the action is suspended, the loop not
        blocked, while the outcome is acknowledged. Returns once the outcome is
        journaled and acknowledged. After a crash a journaled outcome is
        returned / re-raised without running ``fn`` again, the result equal to the
        original, types included.

        Raises:
            TypeError: the arguments do not bind to ``fn`` (or the reconciler takes
                neither no arguments nor the call's); nothing is journaled or run.
            UnsupportedValueError: an argument is outside the journaled value domain
                (nothing journaled or run), or the result is (the call is journaled as
                failed with this error).
            ResultTooLargeError: the encoded result exceeds
                ``ContextConfig.max_entry_bytes`` (journaled as failed with this error).
        """
        call = self._describe(fn, args, kwargs, reconciler, retry, sync=True)
        index = self._claim_index()
        slot = self._resolve_slot(index, call)
        if call.two_phase is not None:
            slot, waiting = self._two_phase_slot(index, call, slot)
            for _ in range(4):  # decide the abort, run it, then prepare
                if waiting is None:
                    break
                self._wait(waiting)
                slot, waiting = self._two_phase_slot(index, call, slot)
            else:
                raise self._abort_pending(index)
        if slot is not None and slot.status.terminal:
            return self._replay(slot)
        if slot is not None and call.reconciler is not None:
            return self._finish_sync(index, call, slot.started_ms, True, slot.attempts)
        started = _now_ms()
        if call.reconciler is not None:
            self.check_hold()
            self._wait(self._append(self._entry(index, call, CallStatus.PENDING, started)))
        return self._finish_sync(index, call, started, False, 0)

    @overload
    def execute_async(
        self, fn: DurableCallable[R], /, *args: Any, **kwargs: Any
    ) -> Awaitable[R]: ...
    @overload
    def execute_async(
        self, fn: TwoPhaseCommitCallable[R], /, *args: Any, **kwargs: Any
    ) -> Awaitable[R]: ...
    @overload
    def execute_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]: ...
    @overload
    def execute_async(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]: ...
    @overload
    def execute_async(  # type: ignore[overload-cannot-match]
        self,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Awaitable[R]: ...
    @overload
    def execute_async(  # type: ignore[overload-cannot-match]
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Awaitable[R]: ...
    def execute_async(  # type: ignore[misc]  # reconciler=/retry= are keyword-only, see above
        self,
        fn: Callable[..., Any] | DurableCallable[Any] | TwoPhaseCommitCallable[Any],
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Awaitable[Any]:
        """Durable call that does not block the event loop: coroutine functions are
        awaited, plain functions run in the worker's thread pool.

        The call index is taken *now*, when ``execute_async`` is called, so several calls
        gathered with ``asyncio.gather`` replay into the same slots in any completion order.
        Raises as :meth:`execute`; the call-time errors here, before an awaitable exists.
        """
        call = self._describe(fn, args, kwargs, reconciler, retry, sync=False)
        index = self._claim_index()
        return self._run_async(index, call)

    durable_execute = execute
    durable_execute_async = execute_async

    async def _run_async(self, index: int, call: _Call) -> Any:
        slot = self._resolve_slot(index, call)
        if call.two_phase is not None:
            slot, waiting = self._two_phase_slot(index, call, slot)
            for _ in range(4):  # decide the abort, run it, then prepare
                if waiting is None:
                    break
                await acked(waiting)
                slot, waiting = self._two_phase_slot(index, call, slot)
            else:
                raise self._abort_pending(index)
        if slot is not None and slot.status.terminal:
            return self._replay(slot)
        reconciling = slot is not None and call.reconciler is not None
        if reconciling and slot is not None:
            started, attempts = slot.started_ms, slot.attempts
        else:
            started, attempts = _now_ms(), 0
            if call.reconciler is not None:
                self.check_hold()
                pending = self._entry(index, call, CallStatus.PENDING, started)
                await acked(self._append(pending))
        flight = self._flight()
        tries = 0
        try:
            while True:
                tries += 1
                try:
                    result = await self._invoke_async(index, call, reconciling, flight)
                except OwnershipLost:
                    raise  # not the call's outcome: nothing journaled, the next owner runs it
                except Exception as exc:
                    if call.retry is not None and call.retry.should_retry(exc, tries):
                        await asyncio.sleep(call.retry.delay(tries))
                        continue
                    entry = self._failed(index, call, started, exc, attempts + tries)
                    await acked(self._append(entry))
                    raise
                entry, refusal = self._outcome(index, call, started, result, attempts + tries)
                appended = self._append(entry, call)
                if next(_ASYNC_RESULTS) & 15 == 15:
                    self._config.acks.serve_due()
                await acked(appended)
                self.check_hold()  # as in the sync path: an ack after the hold was lost
                if refusal is not None:
                    self._unjournaled(index, call, result)
                    raise refusal
                return result
        finally:
            flight.land()

    async def _invoke_async(
        self, index: int, call: _Call, reconciling: bool, flight: Flight
    ) -> Any:
        target, args, kwargs = self._invocation(index, call, reconciling)
        self._blocks.running += 1  # type: ignore[union-attr]  # made by _flight
        try:
            if inspect.iscoroutinefunction(target):
                ownership = self._config.ownership
                if ownership is not None and ownership.stalled:
                    # The journal stopped answering: a call started now could not be
                    # journaled until it answers (see Ownership.admit).
                    await ownership.admit_async(self.ref.topic, self.ref.partition, self._lease)
                return await asyncio.create_task(_in_code_block(target(*args, **kwargs), flight))
            loop = asyncio.get_running_loop()
            ctx = contextvars.copy_context()
            result = await loop.run_in_executor(
                self._config.executor, ctx.run, _run_guarded, target, args, kwargs, flight
            )
            if inspect.isawaitable(result):
                return await asyncio.create_task(_in_code_block(result))
            return result
        finally:
            self._blocks.running -= 1  # type: ignore[union-attr]

    def _finish_sync(
        self,
        index: int,
        call: _Call,
        started: int,
        reconciling: bool,
        attempts: int,
    ) -> Any:
        target, args, kwargs = self._invocation(index, call, reconciling)
        bridge = carrier()  # on the loop, waits suspend the action instead of blocking
        if bridge is None and asyncio._get_running_loop() is not None:
            _warn_blocking(self.ref.action, call.fid)
        # A sync action's call runs in the pool (it may block on I/O); an async action's
        # runs inline, as documented (only its waits suspend).
        pooled = bridge is not None and not bridge.stepping
        flight = self._flight()
        try:
            return self._attempts(index, call, started, attempts, target, args, kwargs,
                                  bridge, pooled, flight)  # fmt: skip
        finally:
            flight.land()  # acknowledged, failed, or abandoned (GreenletExit)

    def _attempts(
        self,
        index: int,
        call: _Call,
        started: int,
        attempts: int,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        bridge: Carrier | None,
        pooled: bool,
        flight: Flight,
    ) -> Any:
        """The attempts of a sync call, then its journaled outcome (acked)."""
        # The carrier is known here: its waits need no lookup of the current greenlet.
        wait = self._config.acks.wait if bridge is None else bridge.wait
        tries = 0
        while True:
            tries += 1
            error: Exception | None = None
            self._blocks.running += 1  # type: ignore[union-attr]  # made by _flight
            try:
                if pooled:
                    assert bridge is not None
                    result = bridge.wait(self._in_pool(target, args, kwargs, flight))
                else:
                    result = _run_guarded(target, args, kwargs, flight)
            except OwnershipLost:
                raise  # not the call's outcome: nothing journaled, the next owner runs it
            except Exception as exc:
                error = exc
            finally:
                self._blocks.running -= 1  # type: ignore[union-attr]
            if error is not None:
                if call.retry is not None and call.retry.should_retry(error, tries):
                    delay = call.retry.delay(tries)
                    if bridge is not None:
                        bridge.wait(asyncio.sleep(delay))
                    else:
                        time.sleep(delay)
                    continue
                wait(self._append(self._failed(index, call, started, error, attempts + tries)))
                raise error
            entry, refusal = self._outcome(index, call, started, result, attempts + tries)
            wait(self._append(entry, call))
            # An ack that arrives after the hold was lost (a cut link healing, its queued
            # writes delivered) may be of a transaction about to abort: not a durable
            # result, so the action does not go on with it.
            self.check_hold()
            if refusal is not None:
                self._unjournaled(index, call, result)
                raise refusal
            return result

    def _in_pool(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        flight: Flight,
    ) -> Awaitable[Any] | Future[Any]:
        """A sync action on the loop (see ``bridge``) runs its code block in the pool:
        the block may block on I/O, the loop must not."""
        ctx = contextvars.copy_context()
        executor = self._config.executor
        if isinstance(executor, CodeBlockPool):
            return executor.submit(ctx.run, _run_guarded, target, args, kwargs, flight)
        return asyncio.get_running_loop().run_in_executor(
            executor, ctx.run, _run_guarded, target, args, kwargs, flight
        )

    def _wait(self, fut: Future[None]) -> None:
        """Wait for a journal ack: suspended on the loop when the action is bridged,
        blocking this thread otherwise."""
        if bridged():
            await_(fut)
        else:
            self._config.acks.wait(fut)

    # -- slot bookkeeping -----------------------------------------------------------
    def _describe(
        self,
        fn: Callable[..., Any] | DurableCallable[Any] | TwoPhaseCommitCallable[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reconciler: Callable[..., Any] | None,
        retry: RetryPolicy | None,
        *,
        sync: bool = False,
    ) -> _Call:
        """Everything that can be wrong with a call is refused here, before its index is
        taken and before anything is journaled or run."""
        self._guard("execute")  # nested code blocks would journal into the outer slot
        try:
            plan = _PLANS.get(fn)
        except TypeError:  # an unhashable callable object
            plan = None
        if plan is not None:
            fid, target, shape, is_coroutine = plan
        elif isinstance(fn, TwoPhaseCommitCallable):
            return self._describe_two_phase(fn, args, kwargs, reconciler, retry, sync=sync)
        elif isinstance(fn, DurableCallable):
            if reconciler is None and fn.has_reconciler:
                reconciler = fn.reconciler
            fid, target = fn.function_id, fn.call
            shape, is_coroutine = call_shape(target), inspect.iscoroutinefunction(target)
        else:
            fid, target = function_id(fn), fn
            shape, is_coroutine = call_shape(target), inspect.iscoroutinefunction(target)
            if type(fn) is FunctionType and fn.__closure__ is None:
                # A plain function (what code blocks nearly always are): everything
                # above is fixed for it. Not closures, which are made per record.
                if len(_PLANS) >= 4096:
                    _PLANS.clear()
                _PLANS[fn] = (fid, target, shape, is_coroutine)
        unbound = shape.bind_error(args, kwargs)
        if unbound is not None:
            raise TypeError(
                f"{fid}{shape.signature} cannot take the arguments given to ctx.execute: "
                f"{unbound} (nothing was journaled or run)"
            ) from None
        if sync and (
            is_coroutine or (reconciler is not None and inspect.iscoroutinefunction(reconciler))
        ):
            raise TypeError(f"{fid} is a coroutine function: use `await ctx.execute_async(...)`")
        rec_shape, rec_takes_args = None, False
        if reconciler is not None:
            rec_shape, rec_takes_args = reconciler_form(reconciler, fid, args, kwargs)
        digest = args_digest(args, kwargs)
        return _Call(
            target, shape, args, kwargs, fid, digest, reconciler, rec_shape, rec_takes_args, retry
        )

    def _describe_two_phase(
        self,
        fn: TwoPhaseCommitCallable[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reconciler: Callable[..., Any] | None,
        retry: RetryPolicy | None,
        *,
        sync: bool,
    ) -> _Call:
        fid = fn.function_id
        kind = type(fn)
        if reconciler is not None:
            raise TypeError(f"{fid}: a two-phase call takes no reconciler (its commit and "
                            "abort settle it)")  # fmt: skip
        missing = [
            name
            for name in ("prepare", "commit", "abort")
            if getattr(kind, name) is getattr(TwoPhaseCommitCallable, name)
        ]
        if missing:
            raise TypeError(f"{fid} does not implement {', '.join(missing)} (nothing was "
                            "journaled or run)")  # fmt: skip
        if self._config.two_phase is None:
            raise TypeError(
                f"{fid}: this host does not settle two-phase calls (the worker, the Faust "
                "host and app.test_context() do; a Spark backfill does not)"
            )
        if self.ref.seq < 0:
            raise TypeError(f"{fid}: two-phase calls are not supported in timer actions "
                            f"({self.ref.action})")  # fmt: skip
        if "\x1f" in self.ref.key:
            raise TypeError(f"{fid}: a two-phase call's record key may not contain \\x1f")
        target = fn.prepare
        shape, is_coroutine = call_shape(target), inspect.iscoroutinefunction(target)
        if sync and is_coroutine:
            raise TypeError(f"{fid}.prepare is a coroutine function: use "
                            "`await ctx.execute_async(...)`")  # fmt: skip
        unbound = shape.bind_error(args, kwargs)
        if unbound is not None:
            raise TypeError(
                f"{fid}.prepare{shape.signature} cannot take the arguments given to "
                f"ctx.execute: {unbound} (nothing was journaled or run)"
            ) from None
        # Its fields are its identity, digested as arguments, and journaled whole with
        # the obligation: whoever settles it calls commit/abort on the same object.
        encoded = encode_value(fn, where=f"two-phase call {fid}")
        digest = args_digest((fn, *args), kwargs)
        return _Call(target, shape, args, kwargs, fid, digest, None, None, False, retry,
                     two_phase=fn, target=encoded)  # fmt: skip

    def _claim_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def _invocation(
        self, index: int, call: _Call, reconciling: bool
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        call_id = self.ref.call_id(self._config.app_id, index)
        if call.round:
            call_id = round_call_id(call_id, call.round)
        if not reconciling:
            return call.fn, *call.shape.arguments(call_id, call.args, call.kwargs)
        assert call.reconciler is not None and call.reconciler_shape is not None
        if call.reconciler_takes_args:
            args, kwargs = call.args, call.kwargs
        else:
            args, kwargs = (), {}
        return call.reconciler, *call.reconciler_shape.arguments(call_id, args, kwargs)

    def _resolve_slot(self, index: int, call: _Call) -> CallEntry | None:
        slot = self._journal.get(index)
        if slot is not None and not _matches(slot, call):
            self._diverged(index, call, slot)
            slot = None
        with self._lock:
            self._resolved.add(index)
        return slot

    def _diverged(self, index: int, call: _Call, slot: CallEntry) -> None:
        expected, recorded = (call.fid, call.digest), (slot.function_id, slot.args_digest)
        if self._config.strict:
            raise NonDeterminismError(
                key=self.ref.key,
                seq=self.ref.seq,
                action=self.ref.action,
                index=index,
                expected=expected,
                recorded=recorded,
            )
        with self._lock:
            dropped = sorted(i for i in self._journal if i >= index and i not in self._resolved)
            doomed = [self._journal.pop(i) for i in dropped]
        log.warning(
            "non-deterministic replay: key=%r seq=%s action=%s call_index=%s now calls %s "
            "(args %s) but journal has %s (args %s); truncating %d slot(s) and re-executing",
            self.ref.key,
            self.ref.seq,
            self.ref.action,
            index,
            *expected,
            *recorded,
            len(dropped),
        )
        evidence = Truncation(
            self.ref, index, call.fid, call.digest, *recorded, dropped=len(dropped), at_ms=_now_ms()
        )
        tombstones = [Tombstone(entry_key(entry)) for entry in doomed]
        self._wait(self._store.append([*tombstones, evidence], self.ref.partition))
        self._abort_dropped(dropped)

    def _replay(self, slot: CallEntry) -> Any:
        if self._trace is not None:
            self._trace.replayed(slot)
        if slot.status is CallStatus.FAILED:
            if slot.exception is None or slot.result is not None:
                raise self._corrupt(
                    slot, "FAILED slot without an exception payload (or with a result)"
                )
            try:
                exc = rebuild_exception(slot.exception)
            except ValueError as err:
                raise self._corrupt(
                    slot, f"exception args of {slot.exception.type}: {err}"
                ) from err
            self.replayed_calls += 1
            raise exc
        if slot.exception is not None:
            raise self._corrupt(slot, "SUCCEEDED slot with an exception payload")
        self.replayed_calls += 1
        return None if slot.result is None else self._decode_result(slot)

    def _decode_result(self, slot: CallEntry) -> Any:
        try:
            return self._config.codec.decode(slot.result)  # type: ignore[arg-type]
        except Exception as exc:
            raise self._corrupt(
                slot, f"result payload is not valid {self._config.codec.name}: {exc}"
            ) from exc

    def _corrupt(self, slot: CallEntry, reason: str) -> JournalDecodeError:
        return JournalDecodeError(
            f"{reason} (function {slot.function_id})",
            key=self.ref.key,
            seq=self.ref.seq,
            action=self.ref.action,
            index=slot.index,
        )

    def _entry(
        self,
        index: int,
        call: _Call,
        status: CallStatus,
        started: int,
        *,
        result: bytes | None = None,
        exception: ExceptionInfo | None = None,
        attempts: int = 0,
    ) -> CallEntry:
        return CallEntry(
            ref=self.ref,
            index=index,
            function_id=call.fid,
            args_digest=call.digest,
            status=status,
            result=result,
            exception=exception,
            call_id=self.ref.call_id(self._config.app_id, index),
            started_ms=started,
            finished_ms=0 if status is CallStatus.PENDING else _now_ms(),
            attempts=attempts,
            worker_id=self._config.worker_id,
        )

    def _outcome(
        self, index: int, call: _Call, started: int, value: Any, attempts: int
    ) -> tuple[CallEntry, PayloadError | None]:
        """The entry journaling a returned ``value``: SUCCEEDED, or FAILED with the
        library error that says why ``value`` cannot be journaled (also returned)."""
        try:
            payload = encode_result(self._config.codec, value)
        except PayloadError as exc:
            refusal: PayloadError = exc
        except Exception as exc:  # an opt-in codec (pickle) that cannot encode it
            refusal = PayloadError(
                f"the {self._config.codec.name} payload codec cannot encode the result of "
                f"{call.fid} ({type(value).__qualname__}): {exc}"
            )
        else:
            limit = self._config.max_entry_bytes
            if len(payload) <= limit:
                self.executed_calls += 1
                return self._entry(
                    index, call, CallStatus.SUCCEEDED, started, result=payload, attempts=attempts
                ), None
            refusal = ResultTooLargeError(
                f"the result of {call.fid} (key={self.ref.key!r} seq={self.ref.seq} "
                f"action={self.ref.action!r} call_index={index}) is {len(payload)} bytes "
                f"encoded, over the journal limit of {limit} bytes "
                "(ContextConfig.max_entry_bytes, from the ActionState topic's "
                "max.message.bytes): store large payloads elsewhere (object store, "
                "database) and return a reference from the code block, or raise the "
                "topic's max.message.bytes and the producer's message.max.bytes"
            )
        return self._failed(index, call, started, refusal, attempts), refusal

    def _failed(
        self, index: int, call: _Call, started: int, exc: BaseException, attempts: int
    ) -> CallEntry:
        self.executed_calls += 1
        return self._entry(
            index,
            call,
            CallStatus.FAILED,
            started,
            exception=exception_info(exc, max_bytes=self._config.max_entry_bytes),
            attempts=attempts,
        )

    def _append(self, entry: CallEntry, call: _Call | None = None) -> Future[None]:
        self._journal[entry.index] = entry
        if self._trace is not None:
            self._trace.journaled(entry)
        if call is not None and call.two_phase is not None and entry.status is CallStatus.SUCCEEDED:
            settler = self._config.two_phase
            assert settler is not None  # refused in _describe otherwise
            obligation = TwoPhaseCall(
                ref=self.ref,
                index=entry.index,
                function_id=call.fid,
                args_digest=call.digest,
                phase=TwoPhase.PREPARED,
                target=call.target,
                prepared=entry.result,
                call_id=entry.call_id,
                round=call.round,
                prepared_ms=entry.finished_ms,
                worker_id=self._config.worker_id,
            )
            return settler.prepared(obligation, entry)
        return self._store.append([entry], self.ref.partition)

    # -- two-phase calls (durable/twophase.py) ----------------------------------------
    def _two_phase_slot(
        self, index: int, call: _Call, slot: CallEntry | None
    ) -> tuple[CallEntry | None, Future[None] | None]:
        """What a two-phase call at ``index`` does with its journal: the slot to replay
        (its preparation stands: PREPARED or COMMITTED), or None to prepare (afresh, in
        ``call.round``, once an aborted preparation's abort returned); or a future to
        wait for first (an abort being decided or run), then ask again."""
        settler = self._config.two_phase
        assert settler is not None
        if slot is not None and slot.status is CallStatus.FAILED:
            # Its prepare raised (nothing to settle); written after any earlier round's
            # abort returned, so it is this slot's newest outcome: replayed.
            return slot, None
        x = settler.current(self.ref, index)
        if x is None:
            return slot, None  # none yet (or settled and pruned: its slot stands)
        same = x.function_id == call.fid and x.args_digest == call.digest
        if same and x.phase in (TwoPhase.PREPARED, TwoPhase.COMMITTED):
            if slot is None or slot.status is not CallStatus.SUCCEEDED:
                # Its slot was lost after the obligation (one append, x first): the
                # obligation holds the prepared result.
                slot = self._entry(index, call, CallStatus.SUCCEEDED, x.prepared_ms,
                                   result=x.prepared)  # fmt: skip
            return slot, None
        if x.phase is TwoPhase.PREPARED:
            # Another call's preparation at this index (a slot lost or truncated): it
            # will never complete with this record.
            return None, settler.aborting([x])
        if x.phase is TwoPhase.ABORTING:
            return None, settler.settle_now(x)
        call.round = x.round + 1  # aborted (or another call committed): prepare afresh
        return None, None

    def _unjournaled(self, index: int, call: _Call, prepared: Any) -> None:
        """A preparation whose result cannot be journaled (the call failed with the
        refusal, journaled): no obligation says what to abort later, so its ``abort``
        is started now with the value in hand, on the settler's threads, once (logged
        if it raises)."""
        if call.two_phase is None or self._config.two_phase is None:
            return
        call_id = round_call_id(self.ref.call_id(self._config.app_id, index), call.round)
        self._config.two_phase.abort_unjournaled(call.two_phase, prepared, call_id)

    def _abort_pending(self, index: int) -> DurableError:
        return DurableError(
            f"two-phase call at key={self.ref.key!r} seq={self.ref.seq} action="
            f"{self.ref.action} call_index={index}: the abort of its previous preparation "
            "has not returned yet (it is retried); the call is prepared afresh once it has"
        )

    def _abort_dropped(self, dropped: list[int]) -> None:
        """Slots a divergence dropped: their preparations are aborted (decided now,
        acked; ``abort()`` runs on the settler)."""
        settler = self._config.two_phase
        if settler is None:
            return
        doomed = [x for i in dropped if (x := settler.current(self.ref, i)) is not None]
        pending = settler.aborting([x for x in doomed if x.phase is TwoPhase.PREPARED])
        if pending is not None:
            self._wait(pending)


def _matches(slot: CallEntry, call: _Call) -> bool:
    if slot.function_id != call.fid:
        return False
    if slot.args_digest == call.digest:
        return True
    if len(slot.args_digest) != LEGACY_DIGEST_LEN:
        return False
    # Written before digests saw values: compare the way it was digested then.
    try:
        return slot.args_digest == legacy_args_digest(call.args, call.kwargs)
    except (TypeError, ValueError, RecursionError):  # not digestible then: not that call
        return False
