"""RunnerContext: what an action sees, and the journal state machine of its code blocks.

Slot protocol (one slot per ``execute*`` call, index assigned when the call *starts*):

1. Look up the journaled slot at this index. If its function id or args digest differ
   from this call, the action diverged: drop this slot and all later ones (tombstones
   plus a Truncation record, acked), warn, and continue as if nothing was journaled.
   Strict mode raises :class:`NonDeterminismError` instead.
2. SUCCEEDED -> return the stored result. FAILED -> raise an equivalent exception.
   PENDING with a reconciler -> run the reconciler (never the function) and journal its
   outcome in the same slot. PENDING without a reconciler -> execute again.
3. Nothing journaled: for reconcilable calls journal PENDING and wait for the ack
   *before* the function starts; run the function (with retries); journal the terminal
   outcome and wait for its ack before returning to the action.

Nothing a code block returns reaches the action before it is durable, so a crash at any
point either replays the outcome or (PENDING) reconciles it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..events import Event, OutputEvent
from ..state.base import ActionStateStore
from .acks import acked
from .callable import DurableCallable, RetryPolicy
from .errors import CodeBlockViolation, DurableCallError, NonDeterminismError
from .identity import args_digest, function_id, wants_call_id
from .journal import ActionRef, CallEntry, CallStatus, ExceptionInfo, Truncation
from .memory import ShortTermMemory
from .payload import PayloadCodec
from .timers import Timers

log = logging.getLogger("agents_stream.durable")

_IN_CODE_BLOCK: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agents_stream_in_code_block", default=False
)


def _now_ms() -> int:
    return int(time.time() * 1000)


def exception_info(exc: BaseException) -> ExceptionInfo:
    cls = type(exc)
    return ExceptionInfo(
        type=f"{cls.__module__}.{cls.__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc))[-4000:],
    )


def rebuild_exception(info: ExceptionInfo) -> BaseException:
    """An exception equivalent to the journaled one.

    The original class is used only if its module is already imported: journal data must
    not be able to make the worker import (and so run) arbitrary modules.
    """
    module_name, _, qualname = info.type.rpartition(".")
    if module_name == "builtins" or module_name in sys.modules:
        obj: Any = sys.modules.get(module_name) or __builtins__
        for part in qualname.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, type) and issubclass(obj, Exception):
            try:
                exc = obj(info.message)
                exc.__notes__ = [f"replayed from journal; original traceback:\n{info.traceback}"]
                return exc
            except Exception:
                pass
    return DurableCallError(info.type, info.message, info.traceback)


@dataclass(frozen=True)
class ContextConfig:
    app_id: str
    worker_id: str
    codec: PayloadCodec
    strict: bool = False
    executor: Any = None  # concurrent.futures.Executor for execute_async of sync functions


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    fid: str
    digest: str
    reconciler: Callable[..., Any] | None
    retry: RetryPolicy | None


class RunnerContext:
    """Passed to every action as ``ctx``.

    ``execute``/``execute_async`` are durable code blocks (see module docstring);
    ``short_term_memory``, ``timers`` and ``send_event`` must not be used inside them.
    """

    def __init__(
        self,
        ref: ActionRef,
        store: ActionStateStore,
        config: ContextConfig,
        memory_base: dict[str, bytes],
        *,
        firing: tuple[str, int] | None = None,
    ) -> None:
        self.ref = ref
        self.key = ref.key
        self._store = store
        self._config = config
        self._journal: dict[int, CallEntry] = store.calls(ref)
        self._next_index = 0
        self._lock = threading.Lock()
        self.short_term_memory = ShortTermMemory(memory_base, self._guard)
        self.timers = Timers(self._guard, firing)
        self.sent_events: list[Event] = []
        self.outputs: list[Any] = []
        self.replayed_calls = 0
        self.executed_calls = 0

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
        if _IN_CODE_BLOCK.get():
            raise CodeBlockViolation(
                f"{what} called inside a code block of {self.ref.action}: memory, timers and "
                "events are journaled with the action, not the call; return a value from the "
                "code block and use it in the action body"
            )

    # -- durable calls --------------------------------------------------------------
    def execute(
        self,
        fn: Callable[..., Any] | DurableCallable,
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` durably, in this thread, and return its result.

        Blocks the calling action (and, from an ``async`` action, the event loop) until
        the outcome is journaled and acknowledged. After a crash a journaled outcome is
        returned / re-raised without running ``fn`` again.
        """
        call = self._describe(fn, args, kwargs, reconciler, retry)
        index = self._claim_index()
        slot = self._resolve_slot(index, call)
        if slot is not None and slot.status.terminal:
            return self._replay(slot)
        if slot is not None and call.reconciler is not None:
            return self._finish_sync(index, call, slot.started_ms, call.reconciler, slot.attempts)
        started = _now_ms()
        if call.reconciler is not None:
            self._append(self._entry(index, call, CallStatus.PENDING, started)).result()
        return self._finish_sync(index, call, started, call.fn, 0)

    def execute_async(
        self,
        fn: Callable[..., Any] | DurableCallable,
        *args: Any,
        reconciler: Callable[..., Any] | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Awaitable[Any]:
        """Durable call that does not block the event loop: coroutine functions are
        awaited, plain functions run in the worker's thread pool.

        The call index is taken *now*, when ``execute_async`` is called, so several calls
        gathered with ``asyncio.gather`` replay into the same slots in any completion order.
        """
        call = self._describe(fn, args, kwargs, reconciler, retry)
        index = self._claim_index()
        return self._run_async(index, call)

    durable_execute = execute
    durable_execute_async = execute_async

    async def _run_async(self, index: int, call: _Call) -> Any:
        slot = self._resolve_slot(index, call)
        if slot is not None and slot.status.terminal:
            return self._replay(slot)
        if slot is not None and call.reconciler is not None:
            target, started, attempts = call.reconciler, slot.started_ms, slot.attempts
        else:
            target, started, attempts = call.fn, _now_ms(), 0
            if call.reconciler is not None:
                pending = self._entry(index, call, CallStatus.PENDING, started)
                await acked(self._append(pending))
        tries = 0
        while True:
            tries += 1
            try:
                result = await self._invoke_async(target, index, call)
            except Exception as exc:
                if call.retry is not None and call.retry.should_retry(exc, tries):
                    await asyncio.sleep(call.retry.delay(tries))
                    continue
                entry = self._failed(index, call, started, exc, attempts + tries)
                await acked(self._append(entry))
                raise
            entry = self._succeeded(index, call, started, result, attempts + tries)
            await acked(self._append(entry))
            return result

    async def _invoke_async(self, target: Callable[..., Any], index: int, call: _Call) -> Any:
        args = self._call_args(target, index, call)
        if inspect.iscoroutinefunction(target):

            async def guarded() -> Any:
                _IN_CODE_BLOCK.set(True)
                return await target(*args, **call.kwargs)

            return await asyncio.create_task(guarded())
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        ctx.run(_IN_CODE_BLOCK.set, True)
        result = await loop.run_in_executor(
            self._config.executor, lambda: ctx.run(target, *args, **call.kwargs)
        )
        if inspect.isawaitable(result):
            return await result
        return result

    def _finish_sync(
        self,
        index: int,
        call: _Call,
        started: int,
        target: Callable[..., Any],
        attempts: int,
    ) -> Any:
        if inspect.iscoroutinefunction(target):
            raise TypeError(
                f"{call.fid} is a coroutine function: use `await ctx.execute_async(...)`"
            )
        args = self._call_args(target, index, call)
        tries = 0
        while True:
            tries += 1
            token = _IN_CODE_BLOCK.set(True)
            try:
                result = target(*args, **call.kwargs)
            except Exception as exc:
                _IN_CODE_BLOCK.reset(token)
                if call.retry is not None and call.retry.should_retry(exc, tries):
                    time.sleep(call.retry.delay(tries))
                    continue
                self._append(self._failed(index, call, started, exc, attempts + tries)).result()
                raise
            _IN_CODE_BLOCK.reset(token)
            self._append(self._succeeded(index, call, started, result, attempts + tries)).result()
            return result

    # -- slot bookkeeping -----------------------------------------------------------
    def _describe(
        self,
        fn: Callable[..., Any] | DurableCallable,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reconciler: Callable[..., Any] | None,
        retry: RetryPolicy | None,
    ) -> _Call:
        self._guard("execute")  # nested code blocks would journal into the outer slot
        if isinstance(fn, DurableCallable):
            if reconciler is None and fn.has_reconciler:
                reconciler = fn.reconciler
            fid, target = fn.function_id, fn.call
        else:
            fid, target = function_id(fn), fn
        return _Call(target, args, kwargs, fid, args_digest(args, kwargs), reconciler, retry)

    def _claim_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def _call_args(self, target: Callable[..., Any], index: int, call: _Call) -> tuple[Any, ...]:
        if wants_call_id(target):
            return (self.ref.call_id(self._config.app_id, index), *call.args)
        return call.args

    def _resolve_slot(self, index: int, call: _Call) -> CallEntry | None:
        slot = self._journal.get(index)
        if slot is None:
            return None
        if (slot.function_id, slot.args_digest) == (call.fid, call.digest):
            return slot
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
        dropped = sorted(i for i in self._journal if i >= index)
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
        for i in dropped:
            del self._journal[i]
        evidence = Truncation(
            self.ref, index, call.fid, call.digest, *recorded, dropped=len(dropped), at_ms=_now_ms()
        )
        self._store.remove_calls(self.ref, index)
        self._store.append([evidence], self.ref.partition).result()
        return None

    def _replay(self, slot: CallEntry) -> Any:
        self.replayed_calls += 1
        if slot.status is CallStatus.FAILED:
            assert slot.exception is not None
            raise rebuild_exception(slot.exception)
        return None if slot.result is None else self._decode_result(slot)

    def _decode_result(self, slot: CallEntry) -> Any:
        from .errors import JournalDecodeError

        try:
            return self._config.codec.decode(slot.result)  # type: ignore[arg-type]
        except Exception as exc:
            raise JournalDecodeError(
                f"result payload is not valid {self._config.codec.name}: {exc}",
                key=self.ref.key,
                seq=self.ref.seq,
                action=self.ref.action,
                index=slot.index,
            ) from exc

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

    def _succeeded(
        self, index: int, call: _Call, started: int, value: Any, attempts: int
    ) -> CallEntry:
        self.executed_calls += 1
        payload = self._config.codec.encode(value)
        return self._entry(
            index, call, CallStatus.SUCCEEDED, started, result=payload, attempts=attempts
        )

    def _failed(
        self, index: int, call: _Call, started: int, exc: BaseException, attempts: int
    ) -> CallEntry:
        self.executed_calls += 1
        return self._entry(
            index,
            call,
            CallStatus.FAILED,
            started,
            exception=exception_info(exc),
            attempts=attempts,
        )

    def _append(self, entry: CallEntry) -> Future[None]:
        self._journal[entry.index] = entry
        return self._store.append([entry], self.ref.partition)
