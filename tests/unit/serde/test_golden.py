"""Golden ActionState values written by every released schema version stay readable.

The files in tests/data/golden/ were written once by scripts/make_golden.py and are never
regenerated: if this test fails, a reader change broke records already on topics.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    MemorySnapshot,
    TimerEntry,
    TimerUpdate,
    Truncation,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.serde import default_journal_codec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden" / JOURNAL_RECORD_TYPE
REF = ActionRef("user-1", 42, "Scoring.process#1", partition=3)
REF_V1_CALL = ActionRef("user-1", 42, "Scoring.process#1")  # calls had no partition before v3
ERROR = ExceptionInfo("payments.CardDeclined", "card declined", "Traceback (most recent...)")


def decode(name: str):
    data = (GOLDEN / name).read_bytes()
    # Key bytes only matter for error messages; any slot key will do.
    return default_journal_codec().decode(b"c\x1fuser-1\x1f42\x1fScoring.process#1\x1f0", data)


def test_every_released_version_has_golden_files():
    versions = load_versions(JOURNAL_RECORD_TYPE)
    for version in versions:
        files = sorted(GOLDEN.glob(f"v{version.version}-*.bin"))
        assert files, f"no golden vectors for {version.label}: run scripts/make_golden.py"
        for path in files:
            assert path.read_bytes()[2:10] == version.fingerprint, path.name


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.bin")), ids=lambda p: p.stem)
def test_every_golden_file_decodes(path):
    entry = decode(path.name)
    assert entry_key_bytes(entry)  # a complete, keyable entry


@pytest.mark.parametrize("version", [1, 2])
def test_old_call_records_without_partition(version):
    ok = decode(f"v{version}-call-succeeded.bin")
    assert ok == CallEntry(REF_V1_CALL, 0, "scoring.fetch", "a1", CallStatus.SUCCEEDED, b'{"v":1}')
    failed = decode(f"v{version}-call-failed.bin")
    assert failed == CallEntry(
        REF_V1_CALL, 1, "payments.charge", "b2", CallStatus.FAILED, None, ERROR
    )


def test_v1_exception_record_reads_as_failed_and_result_as_succeeded():
    assert decode("v1-call-failed.bin").status is CallStatus.FAILED
    assert decode("v1-call-failed.bin").exception == ERROR
    assert decode("v1-call-succeeded.bin").status is CallStatus.SUCCEEDED


def test_pending_since_v2():
    assert decode("v2-call-pending.bin").status is CallStatus.PENDING
    assert decode("v3-call-pending.bin").status is CallStatus.PENDING
    assert decode("v4-call-pending.bin").status is CallStatus.PENDING


def test_v3_audit_fields():
    entry = decode("v3-call-audited.bin")
    assert entry == CallEntry(
        REF,
        3,
        "payments.charge",
        "d4",
        CallStatus.SUCCEEDED,
        b'{"ok":true}',
        call_id="scoring:user-1:42:Scoring.process#1:3",
        started_ms=1_700_000_000_000,
        finished_ms=1_700_000_000_250,
        attempts=2,
        worker_id="worker-7",
    )


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_other_entry_kinds(version):
    done = decode(f"v{version}-action-done.bin")
    assert isinstance(done, ActionDone) and done.ref == REF and done.calls == 2
    assert [u.value for u in done.memory_updates] == [b"0.5", None]
    assert done.outputs == (b'{"score":0.5}',) and done.emitted is True
    snap = decode(f"v{version}-memory-snapshot.bin")
    assert snap == MemorySnapshot("user-1", {"score": b"0.5"}, 42, 1, 3)
    trunc = decode(f"v{version}-truncation.bin")
    assert trunc == Truncation(REF, 1, "scoring.b", "x", "scoring.a", "y", 2, 1_700_000_000_900)


def test_v4_timers_and_key_state_versions():
    assert decode("v4-timer.bin") == TimerEntry(
        "user-1", "event", 1_700_000_060_000, "Scoring", partition=3
    )
    done = decode("v4-action-done-timers.bin")
    assert done.timers == (
        TimerUpdate("processing", 1_700_000_030_000),
        TimerUpdate("event", 1_700_000_060_000, deleted=True),
    )
    assert done.memory_version == 7
    snap = decode("v4-memory-snapshot-versioned.bin")
    assert snap == MemorySnapshot("user-1", {"score": b"0.5"}, 42, 1, 3, version=7)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_pre_v4_records_have_no_timers_or_versions(version):
    done = decode(f"v{version}-action-done.bin")
    assert done.timers == () and done.memory_version == -1
    assert decode(f"v{version}-memory-snapshot.bin").version == -1


def test_v5_topic_identity_and_progress_marker():
    from agents_stream.durable.journal import InputProgress

    topic_ref = ActionRef("user-1", 43, "Scoring.process#0", partition=3, topic="user-events")
    assert decode("v5-call-topic.bin").ref == topic_ref
    assert decode("v5-action-done-topic.bin").ref == topic_ref
    assert decode("v5-truncation-topic.bin").ref == topic_ref
    assert decode("v5-input-progress.bin") == InputProgress(
        "user-events", 3, 1234, 1_700_000_002_000, "worker-7"
    )
    # entries written before v5 carry no topic: the store maps them to the binding's topic
    assert decode("v4-call-audited.bin").ref.topic == ""


def test_v6_outputs_partly_emitted():
    done = decode("v6-action-done-partly-emitted-topic.bin")
    assert (done.emitted, done.emitted_outputs) == (False, (0, 2))
    assert done.outputs == (b'{"n":0}', b'{"n":1}', b'{"n":2}')
    # written before v6: no output known durable on its own
    assert decode("v5-action-done-topic.bin").emitted_outputs == ()
    assert decode("v1-action-done.bin").emitted_outputs == ()


def test_v7_completion_group():
    from agents_stream.durable.journal import CompletionGroup, expand

    group = decode("v7-completion-group.bin")
    assert isinstance(group, CompletionGroup)
    assert (group.topic, group.partition, group.group) == ("user-events", 3, "a1b2c3d4e5f6-1f")
    first, second = expand(group)
    assert first.ref == ActionRef(
        "user-1", 43, "Scoring.process#0", partition=3, topic="user-events"
    )
    assert first.outputs == (b'{"n":0}',) and first.emitted
    assert second.ref.key == "user-2" and not second.emitted
    assert entry_key_bytes(group) == b"g\x1fuser-events\x1f3\x1fa1b2c3d4e5f6-1f"


def test_two_phase_obligations_since_v8():
    from agents_stream.durable.journal import TwoPhase, TwoPhaseCall

    prepared = decode("v8-two-phase-prepared.bin")
    assert isinstance(prepared, TwoPhaseCall)
    assert prepared.phase is TwoPhase.PREPARED and prepared.phase.open
    assert prepared.prepared == b'{"hold":"h-1"}' and prepared.round == 0
    assert prepared.ref.topic == "user-events" and prepared.index == 1
    committed = decode("v8-two-phase-committed.bin")
    assert committed.phase is TwoPhase.COMMITTED and not committed.phase.open
    assert (committed.round, committed.attempts, committed.settled_ms) == (1, 2, 1_700_000_005_500)
    assert committed.last_error.startswith("psp.Timeout")
