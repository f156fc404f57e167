"""``agents-stream state show`` says when a completed action's outputs are not all known
to be in the output topic (in flight, or a send that failed: a replay sends them)."""

from __future__ import annotations

from agents_stream.cli.state import format_key, format_stats
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    TwoPhase,
    TwoPhaseCall,
)

REF = ActionRef("user-1", 7, "Scoring.process#0", 0, "in")


def line(done: ActionDone) -> str:
    [shown] = format_key([done])
    return shown


def test_emission_of_outputs_is_shown_only_when_incomplete() -> None:
    outputs = (b"1", b"2", b"3")
    assert line(ActionDone(REF, outputs=outputs, calls=2)).endswith("(2 calls, 3 outputs)")
    assert line(ActionDone(REF, calls=1, emitted=False)).endswith("(1 calls, 0 outputs)")
    assert line(ActionDone(REF, outputs=outputs, emitted=False)).endswith(
        "(0 calls, 3 outputs, not emitted)"
    )
    partly = ActionDone(REF, outputs=outputs, emitted=False, emitted_outputs=(0, 2))
    assert line(partly).endswith("(0 calls, 3 outputs, 1 not emitted (2 in the log))")


def _obligation(index: int, phase, **kw) -> TwoPhaseCall:
    return TwoPhaseCall(REF, index, "app.Charge", "d", phase, b"\x01target", b'{"hold":"h"}',
                        call_id=REF.call_id("pay", index), **kw)  # fmt: skip


def test_two_phase_calls_show_their_phase_beside_the_call_and_alone_once_pruned() -> None:
    """Issue 65: a call slot with an obligation has its phase, round, attempts and last
    error on the line below it; an obligation whose slot is gone is a line of its own."""
    slot = CallEntry(REF, 0, "app.Charge", "d", CallStatus.SUCCEEDED, b'{"hold":"h"}')
    entries = [
        slot,
        _obligation(0, TwoPhase.COMMITTED, round=1, attempts=2, last_error="psp.Timeout: slow"),
        _obligation(2, TwoPhase.ABORTING),
        ActionDone(REF, calls=1),
    ]
    lines = format_key(entries)
    assert lines[1].startswith("    call 0  app.Charge  SUCCEEDED")
    assert lines[2] == (
        "      two-phase COMMITTED  round 1  attempts 2  last error psp.Timeout: slow"
    )
    assert lines[3] == (
        "    two-phase call 2  app.Charge  ABORTING  round 0  attempts 0  (no call slot)"
    )
    [alone] = format_key([_obligation(1, TwoPhase.PREPARED)])[1:]  # a run of only that
    assert "PREPARED" in alone and "(no call slot)" in alone


def test_stats_count_two_phase_calls_by_phase_only_when_there_are_any() -> None:
    assert not any("two-phase" in line for line in format_stats([ActionDone(REF)]))
    entries = [
        _obligation(0, TwoPhase.PREPARED),
        _obligation(1, TwoPhase.ABORTING),
        _obligation(2, TwoPhase.COMMITTED),
        _obligation(3, TwoPhase.COMMITTED),
    ]
    assert format_stats(entries)[-1] == (
        "two-phase calls: 1 PREPARED, 2 COMMITTED, 1 ABORTING, 0 ABORTED (2 waiting)"
    )
