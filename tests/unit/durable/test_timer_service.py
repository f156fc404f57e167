"""The worker's TimerService schedule (agents_stream.runtime.timers)."""

from __future__ import annotations

from agents_stream.durable.journal import TimerEntry
from agents_stream.runtime.timers import TimerService


def t(kind: str, ts: int, key: str = "k", agent: str = "A", partition: int = 0) -> TimerEntry:
    return TimerEntry(key, kind, ts, agent, partition)


def test_due_timers_pop_in_time_order_once():
    svc = TimerService()
    svc.load("A", 0, [t("event", 30), t("event", 10), t("processing", 5)], armed=True)
    svc.add([t("event", 10)])  # duplicate of a scheduled timer
    assert svc.due_event("A", 20) == [t("event", 10)]
    assert svc.due_event("A", 20) == []
    assert svc.due_event("B", 100) == []  # other agent
    assert svc.due_processing(4) == [] and svc.due_processing(5) == [t("processing", 5)]
    assert svc.due_event("A", 30) == [t("event", 30)] and svc.pending() == 0


def test_held_partitions_fire_only_once_armed():
    svc = TimerService()
    svc.load("A", 1, [t("processing", 5, partition=1)], armed=False)
    assert svc.due_processing(100) == []
    assert svc.arm("A", 1) and not svc.arm("A", 1)
    assert svc.due_processing(100) == [t("processing", 5, partition=1)]


def test_unowned_and_revoked_partitions_are_ignored():
    svc = TimerService()
    svc.add([t("event", 1)])  # partition 0 not loaded: not ours
    assert svc.pending() == 0
    svc.load("A", 0, [t("event", 1)], armed=True)
    svc.drop("A", 0)
    assert svc.due_event("A", 10) == [] and svc.pending() == 0
    assert not svc.arm("A", 0)
