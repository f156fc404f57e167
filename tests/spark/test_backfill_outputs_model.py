"""A model of guarantee 4 across a backfill and the worker after it (no Spark, no broker).

Over random partitions whose journal a dead worker left in any state (no completion,
completed and marked emitted, completed but not marked, partly emitted), a backfill runs
the partition (its outputs to the agent's own topic, or elsewhere), its sends land in a
model of the topic and its journal and markers in the journal; then a worker (the same
runner) takes the partition over. Reference: every output of every completed action is
in the topic exactly once, whatever the backfill did with its own copy.
"""

from __future__ import annotations

import json
from collections import Counter
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action
from agents_stream.durable import ActionRef
from agents_stream.durable.journal import ActionDone, JournalEntry
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.durable.output_identity import output_prefix
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.jobs import backfill_task
from agents_stream.spark.jobs.backfill_task import BackfillTask, InputRecord, run_partition

CODEC = default_journal_codec()
ACTION = "Fanout.process#0"


class Fanout(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        for j in range(event.input["k"]):
            ctx.send_event(OutputEvent(output={"n": event.input["n"], "j": j}))


APP = App("bf-model", output_scan_window=0)
APP.agent(Fanout, input="bf-in", output="bf-out")

# What a dead worker left per record: nothing, a completion marked emitted, one not
# marked, or one whose outputs at these indexes are known sent.
left = st.one_of(
    st.just("none"),
    st.just("marked"),
    st.just("unmarked"),
    st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True),
)


def _task(emits: bool) -> BackfillTask:
    return BackfillTask(
        APP, 0, APP.id, APP.action_state_topic, "unused:9092", write_journal=True, emits=emits
    )


def _run(
    emits: bool, records: list[InputRecord], journal: dict[bytes, JournalEntry]
) -> tuple[list[dict], list[JournalEntry]]:
    """One host's pass over the partition: its rows and what it journaled."""
    written: list[JournalEntry] = []

    def capture(task, partition, log, codec) -> None:
        written.extend(item for item in log if not isinstance(item, tuple))

    snapshot = [(k, CODEC.encode(e)) for k, e in journal.items()]
    with mock.patch.object(backfill_task, "_write_journal", capture):
        rows = run_partition(_task(emits), 0, records, snapshot)
    return rows, written


def _ids(done: ActionDone, indexes) -> list[str]:
    return [f"{output_prefix(APP.id, done)}{j}" for j in indexes]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), left), min_size=1, max_size=6),
    st.booleans(),
)
def test_every_output_reaches_the_topic_once(plan, backfill_emits):
    records, journal, topic = [], {}, Counter()
    for offset, (k, state) in enumerate(plan):
        records.append(
            InputRecord(0, offset, f"k{offset % 2}", json.dumps({"n": offset, "k": k}).encode())
        )
        if state == "none":
            continue
        ref = ActionRef(f"k{offset % 2}", offset, ACTION, 0, "bf-in")
        outputs = tuple(json.dumps({"n": offset, "j": j}).encode() for j in range(k))
        sent = [j for j in state if j < k] if isinstance(state, list) else []
        done = ActionDone(
            ref,
            outputs=outputs,
            finished_ms=1_700_000_000_000 + offset,
            emitted=state == "marked",
            emitted_outputs=tuple(sorted(sent)),
        )
        journal[entry_key_bytes(done)] = done
        topic.update(_ids(done, range(k) if done.emitted else sent))

    # The backfill: sends only into the agent's topic, then its markers.
    rows, written = _run(backfill_emits, records, journal)
    for entry in written:
        journal[entry_key_bytes(entry)] = entry
    for row in rows:
        topic.update(row["send_ids"])
        for key, value in zip(row["mark_keys"], row["mark_values"], strict=True):
            journal[key] = CODEC.decode(key, value)
        assert len(row["outputs"]) == json.loads(records[row["input_offset"]].value)["k"]

    # The worker takes the partition over: it sends what is not in the topic yet.
    rows, written = _run(True, records, journal)
    assert not [e for e in written if not isinstance(e, ActionDone)], "nothing ran again"
    for row in rows:
        topic.update(row["send_ids"])
        for key, value in zip(row["mark_keys"], row["mark_values"], strict=True):
            journal[key] = CODEC.decode(key, value)

    dones = [e for e in journal.values() if isinstance(e, ActionDone)]
    assert len(dones) == len(records)
    expected = Counter(i for d in dones for i in _ids(d, range(len(d.outputs))))
    assert topic == expected
    assert all(d.emitted for d in dones)

    # A third host finds nothing left to send.
    rows, _ = _run(True, records, journal)
    assert all(row["sends"] == [] for row in rows)
