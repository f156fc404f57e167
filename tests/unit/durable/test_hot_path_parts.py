"""The hot path's shortcuts agree with the plain definitions they replace."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_stream.ackfuture import AckFuture, resolved, then
from agents_stream.durable import keys
from agents_stream.durable.acks import _Waker, acked
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    entry_key,
    ref_identity,
)
from agents_stream.durable.store import all_of

from .test_values import values as domain_values

text = st.text(st.characters(blacklist_characters="\x1f", blacklist_categories=("Cs",)))
refs = st.builds(
    ActionRef,
    key=text,
    seq=st.integers(-(2**63), 2**63 - 1),
    action=text.map(lambda a: a + "#0"),
    partition=st.integers(0, 1000),
    topic=st.one_of(st.just(""), text.filter(lambda t: "#" not in t)),
)


@given(refs, st.integers(0, 10_000))
def test_cached_keys_equal_the_generic_encoding(ref: ActionRef, index: int) -> None:
    for _ in range(2):  # computed, then from the per-ref cache
        assert keys.done_key(ref) == keys.encode_identity(ref_identity("a", ref))
        assert keys.call_key(ref, index) == keys.encode_identity(ref_identity("c", ref, index))
        assert keys.calls_prefix(ref) == keys.encode_identity(ref_identity("c", ref)) + b"\x1f"
    call = CallEntry(ref, index, "f", "d", CallStatus.PENDING)
    done = ActionDone(ref)
    assert keys.entry_key_bytes(call) == keys.encode_identity(entry_key(call))
    assert keys.entry_key_bytes(done) == keys.encode_identity(entry_key(done))
    assert keys.call_key(ref, index).startswith(keys.calls_prefix(ref))


def test_the_key_cache_is_not_part_of_the_ref() -> None:
    a, b = ActionRef("k", 1, "A.f#0", 0, "t"), ActionRef("k", 1, "A.f#0", 0, "t")
    keys.done_key(a)
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)


# -- AckFuture ----------------------------------------------------------------------------
def test_ack_future_resolves_callbacks_and_waiters_once() -> None:
    fut: AckFuture[int] = AckFuture()
    seen: list[int] = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    assert not fut.done() and not fut.cancel() and not fut.cancelled()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    threading.Timer(0.05, fut.set_result, (7,)).start()
    assert fut.result(timeout=5) == 7
    fut.add_done_callback(lambda f: seen.append(-f.result()))  # after: runs at once
    assert seen == [7, -7] and fut.exception() is None
    with pytest.raises(Exception, match="already finished"):
        fut.set_result(8)


def test_ack_future_registration_racing_resolution_calls_each_callback_once() -> None:
    """No lock between the resolver and registrants (it convoyed the event loop): with
    GIL switches forced every microsecond, every callback registered from two threads
    while a third resolves runs exactly once, and a blocked waiter always wakes."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(200):
            _race_once()
    finally:
        sys.setswitchinterval(interval)


def _race_once() -> None:
    fut: AckFuture[int] = AckFuture()
    calls: list[int] = []
    woke: list[int] = []
    start = threading.Barrier(4)

    def register(base: int) -> None:
        start.wait()
        for i in range(50):
            fut.add_done_callback(lambda f, n=base + i: calls.append(n))

    def wait() -> None:
        start.wait()
        woke.append(fut.result(timeout=5))

    def resolve() -> None:
        start.wait()
        fut.set_result(1)

    threads = [
        threading.Thread(target=register, args=(0,)),
        threading.Thread(target=register, args=(100,)),
        threading.Thread(target=wait),
        threading.Thread(target=resolve),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == [*range(50), *range(100, 150)]
    assert woke == [1]


@pytest.mark.parametrize("resolved_at", ["before append", "after append"])
def test_ack_future_resolution_between_a_registrants_steps(resolved_at: str) -> None:
    """The two interleavings the lock-free registration must survive, made
    deterministic: the resolver runs between the registrant's check and its append
    (the registrant must then run the callback itself), or between its append and its
    second check (the resolver runs it; the registrant must not run it again)."""

    class Preempted(list[Callable[..., object]]):
        def append(self, fn: Callable[..., object]) -> None:
            if resolved_at == "before append":
                fut.set_result(1)
            super().append(fn)
            if resolved_at == "after append":
                fut.set_result(1)

    fut: AckFuture[int] = AckFuture()
    fut._callbacks = Preempted()
    calls: list[int] = []
    fut.add_done_callback(lambda f: calls.append(f.result()))
    assert calls == [1]


def test_ack_future_errors_and_raising_callbacks() -> None:
    fut: AckFuture[None] = AckFuture()
    fut.add_done_callback(lambda f: 1 / 0)  # logged, the next callback still runs
    later: list[BaseException | None] = []
    fut.add_done_callback(lambda f: later.append(f.exception()))
    error = OSError("nope")
    fut.set_exception(error)
    assert later == [error] and fut.exception() is error
    with pytest.raises(OSError, match="nope"):
        fut.result()


def test_ack_future_under_asyncio_wrap_future() -> None:
    async def main() -> int:
        fut: AckFuture[int] = AckFuture()
        threading.Timer(0.02, fut.set_result, (3,)).start()
        return await asyncio.wrap_future(fut)

    assert asyncio.run(main()) == 3


def test_acked_settles_every_waiter_resolved_from_racing_threads() -> None:
    """The loop's waker takes no lock: acks resolved by three threads at once, with GIL
    switches forced every microsecond, each settle their loop future exactly once (a
    lost wake-up would leave a waiter pending and time the gather out)."""

    async def main() -> list[int]:
        futures: list[AckFuture[int]] = [AckFuture() for _ in range(3000)]
        waiters = [acked(f) for f in futures]

        def resolve(part: int) -> None:
            for i in range(part, len(futures), 3):
                futures[i].set_result(i)

        threads = [threading.Thread(target=resolve, args=(p,)) for p in range(3)]
        for t in threads:
            t.start()
        try:
            return await asyncio.wait_for(asyncio.gather(*waiters), timeout=10)
        finally:
            for t in threads:
                t.join()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(5):
            assert asyncio.run(main()) == list(range(3000))
    finally:
        sys.setswitchinterval(interval)


def test_an_ack_arriving_just_after_the_wakers_drain_schedules_another() -> None:
    """The interleaving the lock-free waker must survive, made deterministic: another
    thread's ack lands right after the loop's drain found the queue empty. The drain
    cleared its flag first, so that arrival schedules the next drain."""
    loop = asyncio.new_event_loop()
    scheduled: list[Callable[[], object]] = []

    class Loop:
        def create_future(self) -> asyncio.Future[Any]:
            return loop.create_future()

        def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
            scheduled.append(fn)

    waker = _Waker(Loop())  # type: ignore[arg-type]
    late: AckFuture[int] = AckFuture()
    late.set_result(2)
    late_waiter: asyncio.Future[Any] = loop.create_future()

    class ArrivesWhenDrained(deque[Any]):
        arrived = False

        def __len__(self) -> int:
            n = super().__len__()
            if n == 0 and not self.arrived:
                self.arrived = True
                waker._arrived(late_waiter, late)  # type: ignore[arg-type]
            return n

    waker._ready = ArrivesWhenDrained()
    first: AckFuture[int] = AckFuture()
    first_waiter = waker.wrap(first)
    first.set_result(1)
    while scheduled:  # the loop runs each scheduled drain
        scheduled.pop(0)()
    assert first_waiter.result() == 1 and late_waiter.result() == 2
    loop.close()


def test_then_runs_the_step_after_success_only() -> None:
    first: AckFuture[None] = AckFuture()
    second: AckFuture[None] = AckFuture()
    chained = then(first, lambda: second)
    first.set_result(None)
    assert not chained.done()
    second.set_result(None)
    assert chained.result(0) is None

    failed: AckFuture[None] = AckFuture()
    ran: list[int] = []
    chained = then(failed, lambda: ran.append(1) or resolved())  # type: ignore[func-returns-value]
    failed.set_exception(OSError("ack"))
    assert ran == [] and isinstance(chained.exception(0), OSError)

    def boom() -> Future[None]:
        raise ValueError("encode")

    chained = then(resolved(), boom)
    assert isinstance(chained.exception(0), ValueError)


def test_all_of_concurrent_failures_resolve_once() -> None:
    parts: list[Future[None]] = [AckFuture() for _ in range(50)]
    combined = all_of(parts)
    threads = [
        threading.Thread(target=p.set_exception, args=(OSError(str(i)),))
        for i, p in enumerate(parts)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(combined.exception(5), OSError)


# -- value encoding fast path ---------------------------------------------------------------
json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


@given(json_trees | domain_values | st.tuples(json_trees, json_trees) | st.just(()))
def test_plain_fast_path_gives_the_tagged_encoding(value: object) -> None:
    """Plain JSON trees skip the tagged tree; the bytes must be the general path's."""
    from agents_stream.durable import values as v

    for canon in (False, True):
        tree = v._encoded_tree(value, canon, "value")
        if canon:
            slow = v._text(tree, canon).encode("utf-8", "surrogatepass")
        else:
            slow = v._stored_text(tree)
        fast = v.canonical_bytes(value) if canon else v.encode_value(value)[2:]
        assert fast == slow


def _topic_json(value: object) -> bytes | None:
    """The reference: what the default output-topic codec writes (None: it refuses)."""
    from agents_stream.serde.errors import ValueEncodeError
    from agents_stream.serde.values import JsonValueCodec

    try:
        return JsonValueCodec().encode(value)
    except ValueEncodeError:
        return None


@given(json_trees | domain_values | st.tuples(json_trees, json_trees) | st.just(()))
def test_journaled_output_bytes_are_the_topic_json_when_taken(value: object) -> None:
    """An output's journaled bytes go to a JSON output topic as they are only when they
    equal what the topic codec would write; otherwise the codec encodes (or refuses) it."""
    from agents_stream.durable.values import _plain, encode_value, plain_json

    stored = encode_value(value)
    taken = plain_json(stored)
    if taken is not None:
        assert taken == _topic_json(value)
    elif _plain(value) and b'"$' not in stored and b"\xed" not in stored:
        raise AssertionError("a plain value was encoded twice")


def test_the_journal_bytes_of_plain_outputs_are_reused_and_tagged_ones_are_not() -> None:
    from agents_stream.durable.values import encode_value, plain_json

    assert plain_json(encode_value({"id": 7, "name": "Zoë", "tags": ["a"]})) == (
        '{"id":7,"name":"Zoë","tags":["a"]}'.encode()
    )
    for value in [(1, 2), {"$k": 1}, "$5", float("nan"), "\ud800", {1: "a"}]:
        assert plain_json(encode_value(value)) is None
    assert plain_json(b'{"a":1}') is None  # plain JSON of a pre-tagging journal


@given(json_trees | st.dictionaries(st.text(), json_trees) | domain_values)
def test_the_cached_json_writer_writes_what_json_encoder_does(value: object) -> None:
    import json

    from agents_stream.durable import values as v

    for canon in (False, True):
        try:
            tree = v._encoded_tree(value, canon, "value")
        except v.UnsupportedValueError:
            continue
        reference = json.JSONEncoder(
            sort_keys=canon, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode(tree)
        assert v._text(tree, canon) == reference


def test_the_cached_json_writer_refuses_what_json_encoder_refuses() -> None:
    from agents_stream.durable import values as v

    for bad in (float("nan"), {"a": float("inf")}, object(), {"k": {1, 2}}):
        with pytest.raises((ValueError, TypeError)):
            v._text(bad, False)
