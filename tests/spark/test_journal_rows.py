"""Journal rows (executor-side decoding, no Spark): every golden schema version decodes
to a row, payloads show as JSON only when they are JSON, garbage becomes a row that names
the slot, and the report renders an SVG chart."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.frames.journal_rows import (
    JOURNAL_ARROW_SCHEMA,
    action_name,
    decode_batches,
    decode_record,
    payload_json,
)
from agents_stream.spark.jobs.report import render_html, svg_bar_chart

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "ActionState"
SLOT = b"c\x1fuser-1\x1f42\x1fScoring.process#1\x1f0"


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.bin")), ids=lambda p: p.stem)
def test_golden_values_decode_to_rows(path):
    row = decode_record(default_journal_codec(), SLOT, path.read_bytes())
    assert row["kind"] != "undecodable", row.get("error")
    if row["kind"] in ("call", "done", "truncation"):
        # v5 "-topic" cases name input record 43 of topic user-events; so does a v7
        # completion group's first ActionDone
        seq = 43 if path.stem.endswith(("-topic", "completion-group")) else 42
        assert (row["key"], row["seq"], row["action_name"]) == ("user-1", seq, "Scoring.process")
    if "call-pending" in path.name:
        assert row["status"] == "PENDING"
    if "call-failed" in path.name:
        assert row["status"] == "FAILED" and row["exception_type"]
    if "two-phase" in path.name:  # v8 obligations: a call-shaped row with its phase
        assert row["kind"] == "two_phase" and row["index"] == 1
        assert row["phase"] == ("PREPARED" if "prepared" in path.name else "COMMITTED")
        assert row["result_json"] == '{"hold":"h-1"}' and "status" not in row


def test_a_two_phase_obligation_is_a_row_like_its_call():
    value = (GOLDEN / "v8-two-phase-committed.bin").read_bytes()
    batch = pa.RecordBatch.from_pylist(
        [{"key": b"x", "value": value, "partition": 1, "offset": 4, "timestamp_ms": 5}]
    )
    [out] = list(decode_batches([batch]))
    [row] = out.to_pylist()
    assert out.schema == JOURNAL_ARROW_SCHEMA
    fields = decode_record(default_journal_codec(), b"x", value)
    assert {k: v for k, v in row.items() if v is not None} == {
        **fields, "partition": 1, "offset": 4, "timestamp_ms": 5,
    }  # fmt: skip
    assert (row["kind"], row["phase"], row["round"], row["attempts"]) == (
        "two_phase", "COMMITTED", 1, 2,
    )  # fmt: skip
    assert row["finished_ms"] == 1_700_000_005_500 and row["last_error"].startswith("psp.Timeout")


def test_a_completion_group_is_a_row_per_action_done():
    value = (GOLDEN / "v7-completion-group.bin").read_bytes()
    batch = pa.RecordBatch.from_pylist(
        [{"key": b"g", "value": value, "partition": 3, "offset": 9, "timestamp_ms": 5}]
    )
    [out] = list(decode_batches([batch], include_raw=True))
    rows = out.to_pylist()
    assert [(r["kind"], r["key"], r["seq"], r["offset"]) for r in rows] == [
        ("done", "user-1", 43, 9),
        ("done", "user-2", 44, 9),
    ]
    assert all(r["raw_value"] == value for r in rows)


def test_garbage_names_its_slot_and_batches_keep_the_schema():
    row = decode_record(default_journal_codec(), SLOT, b"\x00junk", include_raw=True)
    assert row["kind"] == "undecodable" and row["raw_value"] == b"\x00junk"
    assert (row["key"], row["seq"], row["action"], row["index"]) == (
        "user-1",
        42,
        "Scoring.process#1",
        0,
    )
    batch = pa.RecordBatch.from_pylist(
        [{"key": SLOT, "value": b"\x00junk", "partition": 1, "offset": 7, "timestamp_ms": 5}]
    )
    [out] = list(decode_batches([batch]))
    assert out.schema == JOURNAL_ARROW_SCHEMA
    assert out.to_pylist()[0]["offset"] == 7


def test_payloads_and_names():
    assert payload_json(b'{"a":1}') == '{"a":1}'
    assert payload_json(b"\x80\x04pickle") is None
    assert action_name("Agent.run#12") == "Agent.run"


def test_svg_chart_and_html_report():
    svg = svg_bar_chart("Calls", [("A.run SUCCEEDED", 10), ("A.run FAILED", 2)])
    assert svg.startswith("<svg") and svg.count("<rect") == 2 and "#c0392b" in svg
    page = render_html("t", {"x": 1}, [("rows", [{"a": "<b>"}], ["a"])], [svg])
    assert "&lt;b&gt;" in page and "<svg" in page


def test_payload_json_shows_exact_value_encoding_as_its_tagged_json():
    import json

    from agents_stream.durable.payload import JSON

    text = payload_json(JSON.encode({1: 5, "t": (1, 2)}))
    assert json.loads(text) == {"$d": [[1, 5], ["t", {"$t": [1, 2]}]]}
