"""Sync actions wait for journal acks without holding a thread (durable/bridge.py).

With actions on a thread pool, records in flight were capped at the pool size: every
waiting ``ctx.execute`` held a thread. Here a two-thread pool serves 300 records whose
acks all arrive late, and all 300 wait at once.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from agents_stream import Agent, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable.context import ContextConfig
from agents_stream.durable.payload import JSON
from agents_stream.durable.runner import ActionRunner, RecordInput
from agents_stream.state.memory import InMemoryActionStateStore

RECORDS = 300
ran_on: set[str] = set()


def charge(n: int) -> int:
    ran_on.add(threading.current_thread().name)
    return n * 10


class Charging(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        total = ctx.execute(charge, event.input)
        ctx.short_term_memory.set("total", total)  # the body is no code block
        ctx.send_event(OutputEvent(output=total))


class LateAcks(InMemoryActionStateStore):
    """Acks arrive only once the test releases them; counts appends waiting at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[Future[None]] = []
        self.peak = 0
        self.release = threading.Event()

    def append(self, entries, partition):  # type: ignore[no-untyped-def]
        super().append(entries, partition)
        fut: Future[None] = Future()
        self.waiting.append(fut)
        self.peak = max(self.peak, sum(not f.done() for f in self.waiting))
        if self.release.is_set():
            fut.set_result(None)
        return fut

    def flush(self) -> None:
        self.release.set()
        for fut in self.waiting:
            if not fut.done():
                fut.set_result(None)


def test_sync_actions_wait_for_acks_without_threads():
    store = LateAcks()
    pool = ThreadPoolExecutor(2, thread_name_prefix="pool")
    config = ContextConfig(app_id="t", worker_id="w", codec=JSON, executor=pool)
    runner = ActionRunner(Charging, store, config)

    async def main() -> list[int]:
        runs = [
            asyncio.ensure_future(runner.run(RecordInput(f"k{n}", n, n))) for n in range(RECORDS)
        ]
        for _ in range(1000):  # bounded: with a thread per waiting action it never gets there
            if store.peak == RECORDS:
                break
            await asyncio.sleep(0.01)
        store.flush()
        outcomes = await asyncio.gather(*runs)
        return [o.outputs[0] for o in outcomes]

    try:
        assert asyncio.run(main()) == [n * 10 for n in range(RECORDS)]
    finally:
        pool.shutdown()
    assert store.peak == RECORDS  # every record's call waited at once: not capped by 2
    assert ran_on and all(name.startswith("pool") for name in ran_on)  # code blocks: pool
