"""Guarantee 5, at the worker: a corrupted journal record stops the worker at once with
the slot's key, sequence number, action and call index; the input stays uncommitted."""

from __future__ import annotations

import pytest

from agents_stream.kafka.admin import TopicAdmin, TopicSpec, compacted
from agents_stream.testing.topics import produce

pytestmark = [pytest.mark.broker, pytest.mark.fault]

SLOT = b"c\x1fkey-1\x1f0\x1fCrashy.process#0\x1f0"


@pytest.mark.parametrize(
    ("value", "when"),
    [
        (b"\xc3\x01" + bytes(8) + b"\x02", "assignment"),  # unknown writer schema
        (None, "read"),  # valid header, damaged body: found when the slot is read
    ],
)
def test_corrupt_journal_record_fails_fast_naming_the_slot(
    broker, topic_factory, worker_factory, tmp_path, value, when
):
    from agents_stream.serde.journal import default_journal_codec

    env = {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
    }
    env["AS_EFFECTS_DB"] = str(tmp_path / "effects.sqlite")
    state_topic = f"{env['AS_APP_ID']}-action-state"
    TopicAdmin(broker.bootstrap).ensure([TopicSpec(env["AS_INPUT"], 1), compacted(state_topic, 1)])
    if value is None:
        from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus

        good = default_journal_codec().encode(
            CallEntry(
                ActionRef("key-1", 0, "Crashy.process#0"),
                0,
                "f",
                "d",
                CallStatus.SUCCEEDED,
                result=b"1",
            )
        )
        value = good[:12] + b"\xff" * 3  # header intact, body cut and garbled
    produce(broker.bootstrap, state_topic, [(SLOT.decode(), value)], raw=True)
    produce(broker.bootstrap, env["AS_INPUT"], [("key-1", {"scenario": "calls", "n": 1})])

    worker = worker_factory("tests.apps.crashy:app", env)
    assert worker.proc.wait(90) != 0, worker.log()
    log = worker.log()
    assert "key='key-1' seq=0 action='Crashy.process#0' call_index=0" in log, log
