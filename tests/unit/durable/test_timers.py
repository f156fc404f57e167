"""Durable timers in the runner, against the in-memory store: registration journaled with
the ActionDone, firings as pseudo-records, key-state versions, replay after crashes."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents_stream import (
    Agent,
    CodeBlockViolation,
    InputEvent,
    OutputEvent,
    RunnerContext,
    TimerEvent,
    action,
)
from agents_stream.durable import ActionRunner, ContextConfig, RecordInput
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    MemorySnapshot,
    MemoryUpdate,
    TimerEntry,
    TimerUpdate,
    Tombstone,
    action_ordinal,
    entry_key,
)
from agents_stream.durable.payload import JSON
from agents_stream.durable.values import decode_value, encode_value
from agents_stream.state import InMemoryActionStateStore

POOL = ThreadPoolExecutor(4)
CFG = ContextConfig(app_id="app", worker_id="w1", codec=JSON, executor=POOL)
EFFECTS: list[tuple] = []


def effect(tag: str, n: int) -> int:
    EFFECTS.append((tag, n))
    return n


class Crash(Exception):
    pass


CRASH_AFTER_FIRST_CALL = {"on": False}


class Reminders(Agent):
    @action(InputEvent)
    @staticmethod
    def schedule(event: InputEvent, ctx: RunnerContext) -> None:
        value = event.input
        if "processing" in value:
            ctx.timers.register_processing_time(value["processing"])
        if "event" in value:
            ctx.timers.register_event_time(value["event"])
        if "cancel" in value:
            ctx.timers.delete_event_time(value["cancel"])
        ctx.short_term_memory.set("n", ctx.short_term_memory.get("n", 0) + 1)

    @action(TimerEvent)
    @staticmethod
    def remind(event: TimerEvent, ctx: RunnerContext) -> None:
        first = ctx.execute(effect, f"{event.kind}-a", event.timestamp)
        if CRASH_AFTER_FIRST_CALL["on"]:
            raise Crash("killed mid-firing")
        ctx.execute(effect, f"{event.kind}-b", event.timestamp)
        n = ctx.short_term_memory.get("n", 0)
        ctx.short_term_memory.set("fired", ctx.short_term_memory.get("fired", 0) + 1)
        ctx.send_event(OutputEvent(output={"key": event.key, "ts": first, "n": n}))


@pytest.fixture(autouse=True)
def _reset():
    EFFECTS.clear()
    CRASH_AFTER_FIRST_CALL["on"] = False


def runner(store, hook=None) -> ActionRunner:
    return ActionRunner(Reminders, store, CFG, on_timers=hook)


def record(seq: int, value: dict, key: str = "k") -> RecordInput:
    return RecordInput(key=key, seq=seq, value=value, partition=2)


def timer(kind: str, ts: int, key: str = "k") -> TimerEntry:
    return TimerEntry(key, kind, ts, "Reminders", partition=2)


def test_registration_is_journaled_with_the_action_done():
    store = InMemoryActionStateStore()
    seen: list[TimerEntry] = []
    asyncio.run(runner(store, seen.extend).run(record(0, {"processing": 500, "event": 700})))
    done, *writes, snap = store.log
    assert isinstance(done, ActionDone)
    assert done.timers == (TimerUpdate("processing", 500), TimerUpdate("event", 700))
    assert writes == [timer("processing", 500), timer("event", 700)]
    assert isinstance(snap, MemorySnapshot) and snap.version == done.memory_version == 0
    assert store.timers(2) == [timer("processing", 500), timer("event", 700)]
    assert seen == [timer("processing", 500), timer("event", 700)]  # after the ack


def test_firing_runs_timer_actions_then_removes_timer_and_its_entries():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"event": 700})))
    outcome = asyncio.run(r.run_timer("k", 2, "event", 700))
    assert outcome.timer_fired and outcome.actions_run == 1
    assert outcome.outputs == [{"key": "k", "ts": 700, "n": 1}]
    assert EFFECTS == [("event-a", 700), ("event-b", 700)]
    assert store.timers(2) == []
    # the firing's call and done entries are pruned with the timer, memory is kept
    assert not [k for k in (entry_key(e) for e in store.entries()) if k[0] != "m" and k[2] == -701]
    assert decode_value(store.memory("k", 2).values["fired"]) == 1
    # fired once: a second firing of the same timer is a no-op
    again = asyncio.run(r.run_timer("k", 2, "event", 700))
    assert not again.timer_fired and EFFECTS == [("event-a", 700), ("event-b", 700)]


def test_firing_action_ids_and_seq():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"processing": 5})))
    CRASH_AFTER_FIRST_CALL["on"] = True
    with pytest.raises(Crash):
        asyncio.run(r.run_timer("k", 2, "processing", 5))
    [call] = [e for e in store.entries() if getattr(e, "ref", None) and e.ref.seq < 0]
    assert call.ref == ActionRef("k", -6, "Reminders.remind#p0", 2)
    assert action_ordinal("Reminders.remind#p1") == 1 == action_ordinal("A.b#e1")
    assert call.call_id == "app:k:-6:Reminders.remind#p0:0"


def test_interrupted_firing_replays_its_calls():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"processing": 5})))
    CRASH_AFTER_FIRST_CALL["on"] = True
    with pytest.raises(Crash):
        asyncio.run(r.run_timer("k", 2, "processing", 5))
    assert store.timers(2) == [timer("processing", 5)]  # still registered
    CRASH_AFTER_FIRST_CALL["on"] = False
    outcome = asyncio.run(runner(store).run_timer("k", 2, "processing", 5))
    assert outcome.timer_fired and outcome.calls_replayed == 1 and outcome.calls_executed == 1
    assert EFFECTS == [("processing-a", 5), ("processing-b", 5)]  # each ran once


def test_timers_are_guarded_inside_code_blocks():
    class Sneaky(Agent):
        @action(InputEvent)
        @staticmethod
        def process(event: InputEvent, ctx: RunnerContext) -> None:
            ctx.execute(lambda: ctx.timers.register_processing_time(1))

    store = InMemoryActionStateStore()
    with pytest.raises(CodeBlockViolation, match=r"timers\.register_processing_time"):
        asyncio.run(ActionRunner(Sneaky, store, CFG).run(record(0, {})))
    assert store.timers(2) == []


def test_delete_and_reregister():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"event": 700})))
    asyncio.run(r.run(record(1, {"cancel": 700})))
    assert store.timers(2) == []
    assert not asyncio.run(r.run_timer("k", 2, "event", 700)).timer_fired
    asyncio.run(r.run(record(2, {"event": 700})))
    assert asyncio.run(r.run_timer("k", 2, "event", 700)).timer_fired


def test_stale_entries_of_an_orphaned_firing_are_cleared_on_reregistration():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"event": 700})))
    asyncio.run(r.run_timer("k", 2, "event", 700))
    # a crash between the timer tombstone and the pruning left the firing's done behind
    orphan = ActionDone(ActionRef("k", -701, "Reminders.remind#e0", 2), calls=2)
    store.append([orphan], 2)
    asyncio.run(r.run(record(1, {"event": 700})))
    assert store.done(orphan.ref) is None
    EFFECTS.clear()
    assert asyncio.run(r.run_timer("k", 2, "event", 700)).actions_run == 1
    assert EFFECTS == [("event-a", 700), ("event-b", 700)]


def test_memory_versions_order_firings_and_records():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(10, {"processing": 5})))  # v0
    asyncio.run(r.run_timer("k", 2, "processing", 5))  # v1 (seq -6 < 10)
    done = store.done(ActionRef("k", 10, "Reminders.schedule#0", 2))
    assert done.memory_version == 0 and store.memory("k", 2).version == 1
    # re-consuming record 10 (not committed) must not apply its memory update again
    before = store.memory("k", 2)
    outcome = asyncio.run(r.run(record(10, {"processing": 5})))
    assert outcome.actions_skipped == 1 and store.memory("k", 2) == before
    # nor re-register the timer that already fired
    assert store.timers(2) == []


def test_recovery_rewrites_effects_when_the_snapshot_was_lost():
    store = InMemoryActionStateStore()
    asyncio.run(runner(store).run(record(0, {"processing": 500})))
    # crash after the ActionDone was durable, before the timer and snapshot were
    done = store.done(ActionRef("k", 0, "Reminders.schedule#0", 2))
    lost = InMemoryActionStateStore([done])
    seen: list[TimerEntry] = []
    outcome = asyncio.run(runner(lost, seen.extend).run(record(0, {"processing": 500})))
    assert outcome.actions_skipped == 1
    assert lost.timers(2) == [timer("processing", 500)] and seen == lost.timers(2)
    snap = lost.memory("k", 2)
    assert snap.version == 0 and snap.values == {"n": encode_value(1)}


def test_recovery_of_a_deletion():
    store = InMemoryActionStateStore()
    r = runner(store)
    asyncio.run(r.run(record(0, {"event": 700})))
    asyncio.run(r.run(record(1, {"cancel": 700})))
    done = store.done(ActionRef("k", 1, "Reminders.schedule#0", 2))
    snap_before = MemorySnapshot("k", {"n": b"1"}, 0, 0, 2, version=0)
    lost = InMemoryActionStateStore([done, timer("event", 700), snap_before])
    asyncio.run(runner(lost).run(record(1, {"cancel": 700})))
    assert lost.timers(2) == [] and lost.memory("k", 2).version == 1


def test_old_unversioned_records_fall_back_to_seq_order():
    store = InMemoryActionStateStore([MemorySnapshot("k", {"n": b"4"}, 3, 0, 2)])
    done = ActionDone(ActionRef("k", 3, "Reminders.schedule#0", 2), (MemoryUpdate("n", b"4"),))
    assert done.memory_version == -1
    store.append([done], 2)
    asyncio.run(runner(store).run(record(3, {})))
    assert store.memory("k", 2).values == {"n": b"4"}  # (3, 0) already applied
    assert store.memory("k", 2).version == -1


def test_registering_own_timer_inside_its_firing_is_ignored():
    class Again(Agent):
        @action(TimerEvent)
        @staticmethod
        def again(event: TimerEvent, ctx: RunnerContext) -> None:
            ctx.timers.register_event_time(event.timestamp)
            ctx.timers.register_event_time(event.timestamp + 10)

    store = InMemoryActionStateStore([TimerEntry("k", "event", 5, "Again", 2)])
    asyncio.run(ActionRunner(Again, store, CFG).run_timer("k", 2, "event", 5))
    assert store.timers(2) == [TimerEntry("k", "event", 15, "Again", 2)]


def test_timer_validation_and_tombstone_store_instruction():
    store = InMemoryActionStateStore([timer("event", 1)])
    store.append([Tombstone(entry_key(timer("event", 1)))], 2)
    assert store.timers(2) == [] and store.log == [("delete", entry_key(timer("event", 1)))]

    class Bad(Agent):
        @action(InputEvent)
        @staticmethod
        def process(event: InputEvent, ctx: RunnerContext) -> None:
            ctx.timers.register_processing_time(1.5)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="epoch ms"):
        asyncio.run(ActionRunner(Bad, store, CFG).run(record(0, {})))
