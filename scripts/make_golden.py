"""Write golden ActionState values, one file per (schema version, case), into tests/data/.

Golden files are written once, when a schema version is released, and then committed and
never regenerated: ``tests/unit/serde/test_golden.py`` must decode them forever, which is
what proves a reader still understands every released writer. Existing files are left
untouched; run this after adding ``schemas/ActionState/vN.avsc`` to add vN's cases.

    .venv/bin/python scripts/make_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    CompletionGroup,
    ExceptionInfo,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    MemoryUpdate,
    SentEvent,
    TimerEntry,
    TimerUpdate,
    Truncation,
    TwoPhase,
    TwoPhaseCall,
)
from agents_stream.serde.avro import AvroSerde
from agents_stream.serde.journal import JournalCodec
from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden" / JOURNAL_RECORD_TYPE
REF = ActionRef("user-1", 42, "Scoring.process#1", partition=3)
TOPIC_REF = ActionRef("user-1", 43, "Scoring.process#0", partition=3, topic="user-events")
ERROR = ExceptionInfo("payments.CardDeclined", "card declined", "Traceback (most recent...)")

# (name, first version able to write it, entry). Each case is written by every version
# from that one on; fields a version lacks are simply not written.
CASES: list[tuple[str, int, JournalEntry]] = [
    (
        "call-succeeded",
        1,
        CallEntry(REF, 0, "scoring.fetch", "a1", CallStatus.SUCCEEDED, b'{"v":1}'),
    ),
    ("call-failed", 1, CallEntry(REF, 1, "payments.charge", "b2", CallStatus.FAILED, None, ERROR)),
    (
        "action-done",
        1,
        ActionDone(
            REF,
            (MemoryUpdate("score", b"0.5"), MemoryUpdate("stale", None)),
            (b'{"score":0.5}',),
            (SentEvent("Scored", b'{"user":"user-1"}'),),
            calls=2,
            finished_ms=1_700_000_000_500,
        ),
    ),
    ("memory-snapshot", 1, MemorySnapshot("user-1", {"score": b"0.5"}, 42, 1, 3)),
    ("truncation", 1, Truncation(REF, 1, "scoring.b", "x", "scoring.a", "y", 2, 1_700_000_000_900)),
    ("call-pending", 2, CallEntry(REF, 2, "payments.refund", "c3", CallStatus.PENDING)),
    (
        "call-audited",
        3,
        CallEntry(
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
        ),
    ),
    ("timer", 4, TimerEntry("user-1", "event", 1_700_000_060_000, "Scoring", partition=3)),
    (
        "action-done-timers",
        4,
        ActionDone(
            REF,
            (MemoryUpdate("score", b"0.5"),),
            calls=1,
            finished_ms=1_700_000_000_500,
            timers=(
                TimerUpdate("processing", 1_700_000_030_000),
                TimerUpdate("event", 1_700_000_060_000, deleted=True),
            ),
            memory_version=7,
        ),
    ),
    (
        "memory-snapshot-versioned",
        4,
        MemorySnapshot("user-1", {"score": b"0.5"}, 42, 1, 3, version=7),
    ),
    (
        "call-topic",
        5,
        CallEntry(TOPIC_REF, 0, "scoring.fetch", "e5", CallStatus.SUCCEEDED, b'{"v":2}'),
    ),
    (
        "action-done-topic",
        5,
        ActionDone(TOPIC_REF, (MemoryUpdate("score", b"0.7"),), calls=1, memory_version=8),
    ),
    ("truncation-topic", 5, Truncation(TOPIC_REF, 0, "s.b", "x", "s.a", "y", 1, 1_700_000_001_000)),
    ("input-progress", 5, InputProgress("user-events", 3, 1234, 1_700_000_002_000, "worker-7")),
    (
        "action-done-partly-emitted-topic",
        6,
        ActionDone(
            TOPIC_REF,
            outputs=(b'{"n":0}', b'{"n":1}', b'{"n":2}'),
            calls=1,
            finished_ms=1_700_000_003_000,
            emitted=False,
            emitted_outputs=(0, 2),
        ),
    ),
    (
        "completion-group",
        7,
        CompletionGroup(
            "user-events",
            3,
            "a1b2c3d4e5f6-1f",
            (
                ActionDone(
                    TOPIC_REF, outputs=(b'{"n":0}',), calls=1, finished_ms=1_700_000_004_000
                ),
                ActionDone(
                    ActionRef("user-2", 44, "Scoring.process#0", partition=3, topic="user-events"),
                    outputs=(b'{"n":1}', b'{"n":2}'),
                    emitted=False,
                    finished_ms=1_700_000_004_001,
                ),
            ),
            1_700_000_004_002,
        ),
    ),
    (
        "two-phase-prepared",
        8,
        TwoPhaseCall(
            TOPIC_REF,
            1,
            "payments.Charge",
            "f6",
            TwoPhase.PREPARED,
            b'\x1e\x01{"$dc":["payments:Charge",{"order":"o-1","cents":1999}]}',
            b'{"hold":"h-1"}',
            call_id="payments:user-events:user-1:43:Scoring.process#0:1",
            prepared_ms=1_700_000_005_000,
            worker_id="worker-7",
        ),
    ),
    (
        "two-phase-committed",
        8,
        TwoPhaseCall(
            TOPIC_REF,
            1,
            "payments.Charge",
            "f6",
            TwoPhase.COMMITTED,
            b'\x1e\x01{"$dc":["payments:Charge",{"order":"o-1","cents":1999}]}',
            b'{"hold":"h-1"}',
            call_id="payments:user-events:user-1:43:Scoring.process#0:1",
            round=1,
            prepared_ms=1_700_000_005_000,
            settled_ms=1_700_000_005_500,
            attempts=2,
            last_error="psp.Timeout: capture timed out",
            worker_id="worker-7",
        ),
    ),
]


def main() -> int:
    versions = load_versions(JOURNAL_RECORD_TYPE)
    OUT.mkdir(parents=True, exist_ok=True)
    for version in versions:
        codec = JournalCodec(AvroSerde(versions, writer=version))
        for name, since, entry in CASES:
            if version.version < since:
                continue
            path = OUT / f"v{version.version}-{name}.bin"
            if path.exists():
                continue  # released vectors are immutable
            path.write_bytes(codec.encode(entry))
            print(f"wrote {path.relative_to(OUT.parents[3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
