"""JSON log lines and the truncation counter, without a broker."""

from __future__ import annotations

import io
import json
import logging

from agents_stream.runtime.logs import JsonFormatter, record_fields
from agents_stream.runtime.metrics import TruncationCounter


def test_json_lines_carry_record_fields():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("plain %s", "line")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("about a record", exc_info=True, extra=record_fields("in", 2, 41, "k\n1"))
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "plain line" and first["level"] == "WARNING"
    assert first["logger"] == "test.json" and first["ts"].endswith("+00:00")
    assert "topic" not in first
    assert (second["topic"], second["partition"], second["offset"], second["key"]) == (
        "in", 2, 41, "k\n1",
    )  # fmt: skip
    assert "ValueError: boom" in second["exc_info"]


def test_truncation_counter_counts_per_agent():
    counter = TruncationCounter()
    logger = logging.getLogger("agents_stream.durable.test")
    logger.addHandler(counter)
    try:
        for _ in range(2):
            logger.warning(
                "non-deterministic replay: key=%r seq=%s action=%s call_index=%s",
                "k", 3, "Pay.process#0", 1,
            )  # fmt: skip
        logger.warning("something else %s", 1)
    finally:
        logger.removeHandler(counter)
    assert counter.counts == {"Pay": 2}


def test_json_lines_name_the_process_of_a_supervised_worker(monkeypatch):
    # worker --processes N starts each child with its index in the environment.
    record = logging.LogRecord("agents_stream.worker", logging.INFO, __file__, 1, "hi", (), None)
    assert "process" not in json.loads(JsonFormatter().format(record))
    monkeypatch.setenv("AGENTS_STREAM_PROCESS_INDEX", "1")
    assert json.loads(JsonFormatter().format(record))["process"] == 1
