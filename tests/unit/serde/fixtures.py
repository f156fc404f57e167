"""Sample journal entries and hypothesis strategies shared by the serde tests."""

from __future__ import annotations

from hypothesis import strategies as st

from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    JournalEntry,
    MemorySnapshot,
    MemoryUpdate,
    SentEvent,
    Truncation,
)

REF = ActionRef("user-1", 42, "Scoring.process#1", partition=3)


def sample_entries() -> list[JournalEntry]:
    """One of every entry kind, with every optional field set somewhere."""
    return [
        CallEntry(REF, 0, "mod.fetch", "d1", CallStatus.SUCCEEDED, result=b'{"a":1}'),
        CallEntry(
            REF,
            1,
            "mod.pay",
            "d2",
            CallStatus.FAILED,
            exception=ExceptionInfo("builtins.ValueError", "bad", "Traceback..."),
            call_id="app:user-1:42:Scoring.process#1:1",
            started_ms=1_700_000_000_000,
            finished_ms=1_700_000_000_250,
            attempts=3,
            worker_id="worker-7",
        ),
        CallEntry(REF, 2, "mod.charge", "d3", CallStatus.PENDING, result=b"\x00\xff\x00"),
        ActionDone(
            REF,
            memory_updates=(MemoryUpdate("score", b"0.5"), MemoryUpdate("old", None)),
            outputs=(b'{"score":0.5}', b"\x00"),
            events=(SentEvent("Scored", b'{"x":1}'),),
            calls=3,
            finished_ms=123,
            emitted=False,
        ),
        ActionDone(REF),
        MemorySnapshot("user-1", {"score": b"0.5", "n": b"2"}, applied_seq=42, applied_ordinal=1),
        MemorySnapshot("user-2"),
        Truncation(REF, 1, "mod.a", "x", "mod.b", "y", dropped=2, at_ms=99),
    ]


_text = st.text(max_size=20)
_blob = st.binary(max_size=40)
_long = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_int = st.integers(min_value=-(2**31), max_value=2**31 - 1)
refs = st.builds(ActionRef, _text, _long, _text, _int)
exceptions = st.builds(ExceptionInfo, _text, _text, _text)

call_entries = st.builds(
    CallEntry,
    ref=refs,
    index=_int,
    function_id=_text,
    args_digest=_text,
    status=st.sampled_from(CallStatus),
    result=st.none() | _blob,
    exception=st.none() | exceptions,
    call_id=_text,
    started_ms=_long,
    finished_ms=_long,
    attempts=_int,
    worker_id=_text,
)
journal_entries = st.one_of(
    call_entries,
    st.builds(
        ActionDone,
        ref=refs,
        memory_updates=st.lists(st.builds(MemoryUpdate, _text, st.none() | _blob), max_size=3).map(
            tuple
        ),
        outputs=st.lists(_blob, max_size=3).map(tuple),
        events=st.lists(st.builds(SentEvent, _text, _blob), max_size=3).map(tuple),
        calls=_int,
        finished_ms=_long,
        emitted=st.booleans(),
        emitted_outputs=st.lists(st.integers(0, 2**31 - 1), max_size=3).map(tuple),
    ),
    st.builds(
        MemorySnapshot,
        key=_text,
        values=st.dictionaries(_text, _blob, max_size=3),
        applied_seq=_long,
        applied_ordinal=_int,
        partition=_int,
    ),
    st.builds(Truncation, refs, _int, _text, _text, _text, _text, _int, _long),
)
