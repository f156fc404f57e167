"""The console's journal index and a key's history, fed records as the tailer would,
encoded with the real journal codec (no broker)."""

from __future__ import annotations

from agents_stream.console import pages
from agents_stream.console.history import key_history
from agents_stream.console.journal import JournalIndex, Located
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    TwoPhase,
    TwoPhaseCall,
)
from agents_stream.durable.keys import entry_key_bytes
from agents_stream.durable.output_identity import output_prefix
from agents_stream.serde.journal import JournalCodec, default_journal_codec

REF = ActionRef("u-17", 5, "Charges.process#0", 0, "orders")


def _call(index: int, status: CallStatus, worker: str, started: int = 1000) -> CallEntry:
    return CallEntry(REF, index, f"app.step{index}", f"d{index}", status,
                     result=b'"ok"' if status is CallStatus.SUCCEEDED else None,
                     call_id=REF.call_id("pay", index), started_ms=started,
                     finished_ms=started + 5, worker_id=worker)  # fmt: skip


def _index() -> tuple[JournalIndex, JournalCodec]:
    codec = default_journal_codec(None, "pay-action-state")
    return JournalIndex(codec.decode, "pay"), codec


def _put(index: JournalIndex, codec: JournalCodec, entry, offset: int) -> None:
    index.apply(entry_key_bytes(entry), codec.encode(entry), 0, offset)


def test_a_call_written_before_a_later_workers_call_is_shown_replayed():
    index, codec = _index()
    _put(index, codec, _call(0, CallStatus.SUCCEEDED, "host-1"), 0)
    _put(index, codec, _call(1, CallStatus.SUCCEEDED, "host-2"), 1)
    [run] = key_history("u-17", index.entries_of("u-17")).runs
    assert [c.replayed for c in run.calls] == [
        "replayed by host-2",
        "to be replayed by the next run",
    ]
    done = ActionDone(REF, outputs=(b'{"x":1}',), calls=2, finished_ms=9)
    _put(index, codec, done, 2)
    [run] = key_history("u-17", index.entries_of("u-17")).runs
    assert [c.replayed for c in run.calls] == ["replayed by host-2", ""]
    identity = f"{output_prefix('pay', done)}0"
    assert run.output_identities("pay") == [identity]
    assert index.find(identity) == "u-17"
    assert index.find(REF.call_id("pay", 1)) == "u-17"
    assert index.find("u-17") == "u-17" and index.find("nobody") is None


def test_pending_calls_oldest_first_until_their_outcome_or_tombstone():
    index, codec = _index()
    late, early = _call(1, CallStatus.PENDING, "w", 2000), _call(0, CallStatus.PENDING, "w", 1000)
    _put(index, codec, late, 0)
    _put(index, codec, early, 1)
    assert [c.index for c in index.pending()] == [0, 1]
    _put(index, codec, _call(0, CallStatus.SUCCEEDED, "w"), 2)  # reconciled: same slot
    index.apply(entry_key_bytes(late), None, 0, 3)  # tombstoned
    assert index.pending() == []
    assert index.stats()["SUCCEEDED"] == 1 and index.stats()["entries"] == 1


def test_an_unreadable_record_is_kept_with_its_position_and_reason():
    index, codec = _index()
    raw = entry_key_bytes(_call(0, CallStatus.SUCCEEDED, "w"))
    index.apply(raw, b"\x00\x00\x00\x00\x09not avro", 0, 41)
    [bad] = index.unreadable()
    assert (bad.key, bad.partition, bad.offset) == ("u-17", 0, 41) and bad.reason
    history = key_history("u-17", index.entries_of("u-17"))
    assert history.unreadable == [bad] and history.runs == []
    _put(index, codec, _call(0, CallStatus.SUCCEEDED, "w"), 42)  # a newer, readable value
    assert index.unreadable() == []
    assert isinstance(index.entries_of("u-17")[0], Located)
    index.apply(b"\xff\xfe", b"junk", 1, 0)  # not even a key this version knows
    assert index.unreadable()[0].key == "\ufffd\ufffd"


def test_who_settled_a_pending_call_is_read_off_its_pending_value():
    """The reconciler's outcome keeps the PENDING value's start time under another worker
    id; the run that wrote PENDING finishes it under its own; a call re-executed (no
    reconciler any more) starts anew. An outcome whose PENDING value was never read
    (compacted away) says nothing."""
    index, codec = _index()
    _put(index, codec, _call(0, CallStatus.PENDING, "host-1", 1000), 0)
    _put(index, codec, _call(1, CallStatus.PENDING, "host-1", 1000), 1)
    _put(index, codec, _call(2, CallStatus.PENDING, "host-1", 1000), 2)
    _put(index, codec, _call(0, CallStatus.SUCCEEDED, "host-2", 1000), 3)  # reconciled
    _put(index, codec, _call(1, CallStatus.SUCCEEDED, "host-1", 1000), 4)  # finished
    _put(index, codec, _call(2, CallStatus.SUCCEEDED, "host-2", 7000), 5)  # re-executed
    _put(index, codec, _call(3, CallStatus.SUCCEEDED, "host-2", 1000), 6)  # no PENDING read
    [run] = key_history("u-17", index.entries_of("u-17")).runs
    hows = [c.settled.how if c.settled else None for c in run.calls]
    assert hows == ["reconciler", "own run", "executed again", None]
    assert run.calls[0].settled.describe().startswith("settled by the reconciler on host-2")
    assert [(s.call.index, s.settled.how) for s in index.settled()] == [
        (2, "executed again"),
        (1, "own run"),
        (0, "reconciler"),
    ]
    page = pages.history_body(key_history("u-17", index.entries_of("u-17")), "pay", None)
    assert page.count('class="reconciled"') == 1 and "inferred, not journaled" in page
    listed = pages.pending_body(index.pending(), 9000, index.settled())
    assert "No PENDING call" in listed and "settled by the reconciler on host-2" in listed
    index.apply(entry_key_bytes(_call(0, CallStatus.SUCCEEDED, "w")), None, 0, 7)  # pruned
    [run] = key_history("u-17", index.entries_of("u-17")).runs
    assert [c.call.index for c in run.calls] == [1, 2, 3]
    assert len(index.settled()) == 3  # /pending's history outlives the slot


def test_lookups_by_call_id_and_output_identity_check_the_stored_entry():
    """Neither is kept in a map of its own: each is parsed into the slot it names, which
    must hold that very call or action run (keys may contain ':' and '/')."""
    index, codec = _index()
    ref = ActionRef("a:b/c", 7, "Charges.process#1", 1, "orders")
    call = CallEntry(ref, 2, "app.f", "d", CallStatus.SUCCEEDED, b"1",
                     call_id=ref.call_id("pay", 2), worker_id="w")  # fmt: skip
    done = ActionDone(ref, outputs=(b"1", b"2"), calls=3, finished_ms=77)
    legacy = ActionRef("old", 3, "Charges.process#0")
    old = CallEntry(legacy, 0, "app.f", "d", CallStatus.SUCCEEDED, b"1",
                    call_id=legacy.call_id("pay", 0))  # fmt: skip
    for offset, entry in enumerate((call, done, old)):
        index.apply(entry_key_bytes(entry), codec.encode(entry), 1, offset)
    assert index.find(ref.call_id("pay", 2)) == "a:b/c"
    assert index.find(legacy.call_id("pay", 0)) == "old"
    assert index.find(ref.call_id("pay", 3)) is None  # no such slot
    prefix = output_prefix("pay", done)
    for identity in (f"{prefix}1", prefix, prefix[:-1]):
        assert index.find(identity) == "a:b/c", identity
    assert index.find(output_prefix("pay", ActionDone(ref, finished_ms=78))) is None
    assert index.find("pay/orders/x/7/Charges.process#1/77/0") is None
    index.apply(entry_key_bytes(done), None, 1, 3)  # pruned: its outputs are no longer found
    assert index.find(prefix) is None and index._outputs == {}
    stats = index.stats()
    assert (stats["entries"], stats["keys"], stats["SUCCEEDED"]) == (2, 2, 2)
    assert "completed" not in stats


def _obligation(index: int, phase: TwoPhase, partition: int = 0, **kw) -> TwoPhaseCall:
    key = REF.key if partition == 0 else f"{REF.key}-p{partition}"
    ref = ActionRef(key, REF.seq, REF.action, partition, REF.topic)
    return TwoPhaseCall(ref, index, "app.Charge", "d", phase, b"\x01\x01{}", b'{"hold":"h"}',
                        call_id=ref.call_id("pay", index), **kw)  # fmt: skip


def test_two_phase_calls_show_their_phase_and_the_overview_counts_those_waiting():
    """Issue 65: an obligation (``x`` key) is indexed under its record key: the key's
    page shows its phase beside its call (alone once the slot is gone), and the overview
    counts open ones (PREPARED, ABORTING) per partition until they are settled."""
    index, codec = _index()
    _put(index, codec, _call(0, CallStatus.SUCCEEDED, "w"), 0)
    _put(index, codec, _obligation(0, TwoPhase.PREPARED), 1)
    _put(index, codec, _obligation(1, TwoPhase.ABORTING, attempts=2, last_error="psp.Down"), 2)
    other = _obligation(0, TwoPhase.PREPARED, partition=1)
    index.apply(entry_key_bytes(other), codec.encode(other), 1, 0)
    assert index.two_phase_waiting() == {0: 2, 1: 1}
    assert index.stats()["two-phase"] == 3
    [run] = key_history("u-17", index.entries_of("u-17")).runs
    assert run.calls[0].obligation is not None
    assert run.calls[0].obligation.phase is TwoPhase.PREPARED
    assert [x.index for x in run.orphan_obligations] == [1]
    page = pages.history_body(key_history("u-17", index.entries_of("u-17")), "pay", None)
    assert "<th>two-phase</th>" in page and "<b>PREPARED</b> · round 0" in page
    assert "whose call slot is gone" in page and "last error: psp.Down" in page

    _put(index, codec, _obligation(0, TwoPhase.COMMITTED, settled_ms=5), 3)  # settled
    index.apply(entry_key_bytes(_obligation(1, TwoPhase.ABORTING)), None, 0, 4)  # pruned
    assert index.two_phase_waiting() == {1: 1}

    def overview(waiting, stats):
        return pages.overview_body([], "pay-action-state", stats, True, None, None, "",
                                   [], [], waiting)  # fmt: skip

    shown = overview(index.two_phase_waiting(), index.stats())
    assert "Two-phase calls waiting (1)" in shown and "<td>1</td><td>1</td>" in shown
    assert "every prepared call is settled" in overview({}, {"two-phase": 1})
    assert "Two-phase" not in overview({}, {})
