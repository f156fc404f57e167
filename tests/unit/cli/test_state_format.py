"""``agents-stream state show`` says when a completed action's outputs are not all known
to be in the output topic (in flight, or a send that failed: a replay sends them)."""

from __future__ import annotations

from agents_stream.cli.state import format_key
from agents_stream.durable.journal import ActionDone, ActionRef

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
