"""A backfill task runs the records of distinct keys at once, a key's in offset order,
as the worker does (no Spark session: the task function on its own).

Before, a task ran its partition's records one at a time: with calls that take 200 ms
(a model, a payment API) a partition of a million inputs took more than two days.
"""

from __future__ import annotations

import json
import random
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.spark.jobs.backfill_task import BackfillTask, InputRecord, run_partition

BARRIER: list[threading.Barrier] = []


def meet_peers(key: str) -> str:
    BARRIER[0].wait()
    return key


class Meeting(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output=ctx.execute(meet_peers, event.key)))


def _task(agent: type[Agent], concurrency: int, **app: object) -> BackfillTask:
    bound = App("bf-conc", output_scan_window=0, **app)  # type: ignore[arg-type]
    bound.agent(agent, input="bf-in", output="bf-out")
    return BackfillTask(
        bound, 0, bound.id, bound.action_state_topic, "unused:9092", emits=True,
        concurrency=concurrency,
    )  # fmt: skip


def test_calls_of_distinct_keys_are_in_progress_together():
    """Eight records, each call waiting for all eight to be running: only a task that
    runs them at once finishes them; one at a time, every call gives up."""
    records = [InputRecord(0, o, f"k{o}", b"{}") for o in range(8)]
    BARRIER[:] = [threading.Barrier(8, timeout=20)]
    rows = run_partition(_task(Meeting, 8), 0, records, [])
    assert [r["error"] for r in rows] == [None] * 8
    assert [json.loads(r["outputs"][0]) for r in rows] == [f"k{o}" for o in range(8)]
    BARRIER[:] = [threading.Barrier(8, timeout=0.5)]
    rows = run_partition(_task(Meeting, 1), 0, records, [])
    assert all("BrokenBarrierError" in (r["error"] or "") for r in rows)


SEEN: list[tuple[str, int]] = []


def slow_lookup(key: str, offset: int, pause: float) -> int:
    time.sleep(pause)
    SEEN.append((key, offset))
    return offset


class Tally(Agent):
    """Each record of a key sees the count its key's earlier records left in memory."""

    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        if event.input.get("fail"):
            raise ValueError(f"bad input at {event.offset}")
        ctx.execute(slow_lookup, event.key, event.offset, event.input["pause"])
        count = ctx.short_term_memory.get("count", 0) + 1
        ctx.short_term_memory.set("count", count)
        ctx.send_event(OutputEvent(output={"key": event.key, "count": count}))


def _comparable(row: dict) -> tuple:
    # Identities and markers carry the action's finish time: compare what they name.
    ids = [i.rsplit("/", 2)[0] + "/" + i.rsplit("/", 1)[1] for i in row["send_ids"]]
    return (
        row["input_offset"], row["key"], row["outputs"], row["error"], row["actions_run"],
        row["calls_executed"], row["sends"], ids, len(row["mark_keys"]),
    )  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    keys=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24),
    failing=st.sets(st.integers(0, 23), max_size=3),
    concurrency=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_concurrent_task_matches_one_at_a_time(keys, failing, concurrency, seed):
    """Against the reference (the same records one at a time): the same rows in offset
    order, memory counted per key in offset order, each key's calls in offset order."""
    rnd = random.Random(seed)
    records = [
        InputRecord(
            0,
            o,
            k,
            json.dumps({"pause": rnd.choice([0, 0.001, 0.003]), "fail": o in failing}).encode(),
        )
        for o, k in enumerate(keys)
    ]
    SEEN.clear()
    expected = run_partition(_task(Tally, 1), 0, records, [])
    SEEN.clear()
    rows = run_partition(_task(Tally, concurrency), 0, records, [])
    assert [_comparable(r) for r in rows] == [_comparable(r) for r in expected]
    for key in set(keys):
        mine = [o for k, o in SEEN if k == key]
        assert mine == sorted(mine), (key, SEEN)
