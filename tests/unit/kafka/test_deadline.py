"""The worker's own deadline on blocking client calls (kafka/deadline.py), no broker:
a call that never returns in time is given up on, counted and reported, and the next
call that returns in time clears the report."""

from __future__ import annotations

import logging
import threading

import pytest

from agents_stream.kafka.deadline import Blocked, Deadline


def test_a_call_past_its_deadline_is_given_up_and_reported(caplog):
    seen: list[tuple[str, float]] = []
    deadline = Deadline(on_blocked=lambda op, s: seen.append((op, s)))
    release = threading.Event()
    with caplog.at_level(logging.WARNING, "agents_stream.kafka"):
        with pytest.raises(Blocked) as caught:
            deadline.call("transaction send offsets", 0.2, release.wait)
        assert caught.value.operation == "transaction send offsets"
        assert caught.value.seconds >= 0.2
        assert deadline.blocked == "transaction send offsets"
        assert deadline.count == deadline.in_a_row == deadline.abandoned == 1
        assert [op for op, _ in seen] == ["transaction send offsets"]
        assert "has blocked for" in caplog.text
        # The stuck call returns at last: logged, no longer counted as abandoned.
        release.set()
        for _ in range(100):
            if deadline.abandoned == 0:
                break
            threading.Event().wait(0.02)
        assert deadline.abandoned == 0
        assert "returned after" in caplog.text
    # A call that returns in time clears the report; results and errors pass through.
    assert deadline.call("transaction commit", 1.0, lambda: 7) == 7
    assert deadline.blocked is None and deadline.in_a_row == 0 and deadline.count == 1
    with pytest.raises(ValueError):
        deadline.call("transaction abort", 1.0, int, "x")
