"""Backfill tasks on their own (no Spark session): a fatal error fails the task instead of
becoming a per-row failure, and inputs below the completed-through marker are skipped."""

from __future__ import annotations

import json

import pytest

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import ActionRef, CallStatus
from agents_stream.durable.errors import NonDeterminismError
from agents_stream.durable.journal import CallEntry, InputProgress
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.errors import TaskRecordError
from agents_stream.spark.jobs.backfill_task import BackfillTask, InputRecord, run_partition

RAN: list[int] = []


def charge(n: int) -> int:
    RAN.append(n)
    return n


class Charger(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.execute(charge, event.input["n"])


def task(strict: bool = False, committed=()) -> BackfillTask:
    app = App("bf-unit", strict_determinism=strict)
    app.agent(Charger, input="bf-in")
    return BackfillTask(app, 0, app.id, app.action_state_topic, "unused:9092", committed=committed)


def records(n: int) -> list[InputRecord]:
    return [InputRecord(0, o, f"k{o}", json.dumps({"n": o}).encode()) for o in range(n)]


def snapshot(*entries) -> list[tuple[bytes, bytes]]:
    codec = default_journal_codec()
    return [(entry_key_bytes(e), codec.encode(e)) for e in entries]


def test_fatal_errors_fail_the_task_naming_the_record():
    ref = ActionRef("k0", 0, "Charger.process#0", 0, "bf-in")
    other = CallEntry(ref, 0, "somewhere:else", "digest", CallStatus.SUCCEEDED, result=b"1")
    with pytest.raises(
        TaskRecordError, match=r"^NonDeterminismError: .*\(topic bf-in, partition 0, offset 0\)$"
    ) as info:
        run_partition(task(strict=True), 0, records(1), snapshot(other))
    assert isinstance(info.value.__cause__, NonDeterminismError)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("bf-in", 0, 0)


def test_inputs_below_the_marker_or_committed_offset_are_skipped():
    RAN.clear()
    marker = InputProgress("bf-in", 0, 3)
    rows = run_partition(task(), 0, records(5), snapshot(marker))
    assert sorted(RAN) == [3, 4]  # distinct keys: run at once
    assert [r["completed"] for r in sorted(rows, key=lambda r: r["input_offset"])] == [
        True, True, True, False, False,
    ]  # fmt: skip
    RAN.clear()
    run_partition(task(committed=((0, 2),)), 0, records(5), [])  # no marker: group offsets
    assert sorted(RAN) == [2, 3, 4]


class Counter(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.short_term_memory.set("n", ctx.short_term_memory.get("n", 0) + 1)


def test_keyless_inputs_have_no_memory_as_in_the_worker():
    app = App("bf-keyless", on_error="dlq")
    app.agent(Counter, input="bf-in")
    bf = BackfillTask(app, 0, app.id, app.action_state_topic, "unused:9092")
    keyed = InputRecord(0, 0, "k", b"{}")
    keyless = InputRecord(0, 1, "", b"{}", keyless=True)
    rows = sorted(run_partition(bf, 0, [keyed, keyless], []), key=lambda r: r["input_offset"])
    assert rows[0]["error"] is None
    assert "KeylessRecordError" in rows[1]["error"]


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        ctx.send_event(OutputEvent(output={"n": event.input["n"]}))
        ctx.send_event(OutputEvent(output={"twice": event.input["n"] * 2}))


def _echo_task(emits: bool) -> BackfillTask:
    app = App("bf-echo", output_scan_window=0)
    app.agent(Echo, input="bf-in", output="bf-out")
    return BackfillTask(app, 0, app.id, app.action_state_topic, "unused:9092", emits=emits)


def _marks(row) -> list:
    codec = default_journal_codec()
    return [codec.decode(k, v) for k, v in zip(row["mark_keys"], row["mark_values"], strict=True)]


def test_outputs_for_the_agents_topic_carry_identities_and_markers():
    rows = sorted(
        run_partition(_echo_task(True), 0, records(3), []), key=lambda r: r["input_offset"]
    )
    for row in rows:
        offset = row["input_offset"]
        assert row["sends"] == row["outputs"] and len(row["outputs"]) == 2
        prefix = f"bf-echo/bf-in/0/{offset}/Echo.process#0/"
        assert [i[: len(prefix)] for i in row["send_ids"]] == [prefix, prefix]
        assert [i.rsplit("/", 1)[1] for i in row["send_ids"]] == ["0", "1"]
        (mark,) = _marks(row)
        assert mark.emitted and mark.ref.seq == offset


def test_outputs_kept_from_the_agents_topic_leave_the_action_unmarked():
    for row in run_partition(_echo_task(False), 0, records(2), []):
        assert len(row["outputs"]) == 2
        assert row["sends"] == row["send_ids"] == row["mark_keys"] == []


def test_outputs_marked_in_the_snapshot_are_not_sent_again():
    first = _echo_task(True)
    rows = run_partition(first, 0, records(1), [])
    (mark,) = _marks(rows[0])
    (again,) = run_partition(first, 0, records(1), snapshot(mark))
    assert again["actions_skipped"] == 1 and len(again["outputs"]) == 2
    assert again["sends"] == [] and again["mark_keys"] == []


def test_every_output_row_names_its_identity_in_action_order():
    """Whatever the destination, each output has the worker's identity: the record's
    actions in the order they ran, each output's index within its action."""
    for emits in (False, True):
        rows = run_partition(_echo_task(emits), 0, records(2), [])
        for row in rows:
            prefix = f"bf-echo/bf-in/0/{row['input_offset']}/Echo.process#0/"
            assert [i[: len(prefix)] for i in row["output_ids"]] == [prefix, prefix]
            assert [i.rsplit("/", 1)[1] for i in row["output_ids"]] == ["0", "1"]
            if emits:
                assert row["output_ids"] == row["send_ids"]
    (replayed,) = run_partition(
        _echo_task(False),
        0,
        records(1),
        snapshot(*_marks(run_partition(_echo_task(True), 0, records(1), [])[0])),
    )
    assert replayed["actions_skipped"] == 1 and len(replayed["output_ids"]) == 2
