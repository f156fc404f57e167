"""The record error policy every host applies (agents_stream/host/policy.py)."""

from __future__ import annotations

import logging

import pytest

from agents_stream.durable.errors import JournalDecodeError
from agents_stream.host.policy import Verdict, classify, judge, record_where

FATAL = JournalDecodeError("garbage", key="k", seq=3, action="A.process#0", index=1)


@pytest.mark.parametrize(
    ("exc", "on_error", "can_dead_letter", "verdict"),
    [
        (FATAL, "dlq", True, Verdict.FATAL),  # on_error cannot skip an untrusted journal
        (FATAL, "fail", True, Verdict.FATAL),
        (ValueError("x"), "fail", True, Verdict.FAIL),
        (ValueError("x"), "dlq", False, Verdict.FAIL),  # nowhere to put it
        (ValueError("x"), "dlq", True, Verdict.DEAD_LETTER),
    ],
)
def test_classify(exc, on_error, can_dead_letter, verdict):
    assert classify(exc, on_error, can_dead_letter=can_dead_letter) is verdict
    assert verdict.stops is (verdict is not Verdict.DEAD_LETTER)


def test_record_where_names_topic_partition_offset_key():
    assert record_where("orders", 3, 1207, "user-1") == "orders[3]@1207 key='user-1'"


def test_judge_logs_once_per_verdict(caplog):
    logger = logging.getLogger("test.policy")
    what = "action of Pay raised on " + record_where("orders", 0, 9, "k")
    with caplog.at_level(logging.INFO, logger="test.policy"):
        assert judge(logger, FATAL, what, "dlq", host="worker") is Verdict.FATAL
        assert judge(logger, ValueError("no"), what, "fail", host="Faust app").stops
        dead = judge(
            logger, ValueError("no"), what, "dlq", host="worker", dead_letter_to="orders-dlq"
        )
        dropped = judge(
            logger, ValueError("no"), "timer action of Pay raised", "dlq", host="worker"
        )
    assert dead is dropped is Verdict.DEAD_LETTER
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 4
    assert lines[0][0] == "CRITICAL" and lines[0][1].startswith(f"{what}: cannot decode journal")
    assert lines[0][1].endswith("; stopping the worker")
    assert lines[1][0] == "CRITICAL" and "stopping the Faust app (on_error='fail')" in lines[1][1]
    assert lines[2] == ("ERROR", f"{what}: ValueError('no') -> orders-dlq")
    assert lines[3] == ("ERROR", "timer action of Pay raised: ValueError('no') -> dropped")
