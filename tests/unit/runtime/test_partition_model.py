"""Partition.accept against a model of a client that hands over a partition's records
with holes: whatever the client skips and whatever offsets hold no record (compaction,
transaction markers), every record from where the partition's first record is expected
is accepted exactly once, in offset order, and the committable offset never passes a
record that was not accepted.

The client skips records only across a rebalance (librdkafka handing a kept partition's
records over with a hole at a cooperative rebalance): a batch with a hole comes after a
rebalance callback, which is what lets a partition whose gap was found real check for
gaps again (one seek per partition per rebalance)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.runtime.partition import Partition


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], set[int], int, int]:
    size = draw(st.integers(1, 40))
    # Offsets holding no record (a compacted key, a transaction marker).
    empty = draw(st.sets(st.integers(0, size - 1), max_size=size // 2))
    records = [o for o in range(size) if o not in empty]
    # Records the client skips when it fetches them for the first time.
    skipped = draw(st.sets(st.sampled_from(records), max_size=len(records))) if records else set()
    first = draw(st.integers(0, size - 1))
    batch = draw(st.integers(1, 8))
    return records, skipped, first, batch


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_record_is_accepted_once_in_order(scenario) -> None:
    records, skipped, first, batch = scenario
    fetch = [first]  # the client's fetch position, moved by a seek
    seeks: list[int] = []
    part = Partition(
        "t", 0, host=None, watermarks=None, first_expected=first, arm_at=None,
        seek=lambda p, offset: seeks.append(offset), stats=defaultdict(int),
    )  # fmt: skip
    dropped_once = set(skipped)
    accepted: list[int] = []
    end = (records[-1] + 1) if records else first
    generation = 0
    for _ in range(4 * len(records) + 8):  # consume calls
        # One consume: up to ``batch`` records from the fetch position; the first time a
        # skipped record is fetched the client leaves it out.
        handed: list[int] = []
        hole = False
        position = fetch[0]
        for offset in (o for o in records if o >= position):
            if len(handed) == batch:
                break
            position = offset + 1
            if offset in dropped_once:
                dropped_once.discard(offset)
                hole = True
                continue
            handed.append(offset)
        if hole:
            generation += 1  # the hole came with a rebalance
        fetch[0] = max(position, fetch[0])
        for offset in handed:
            if part.accept(offset, generation):
                accepted.append(offset)
                part.finish(offset, "k", True)
                committable = part.offsets.committable()
                if committable is not None:
                    missing = [o for o in records if first <= o < committable and o not in accepted]
                    assert not missing, f"committable {committable} passes {missing}"
        if not handed and fetch[0] >= end:
            part.at_end(fetch[0], generation)  # a partition EOF
        if seeks:  # the batch is over: the seeks run before the next consume
            fetch[0] = seeks.pop()
            seeks.clear()
            part.seeks_issued()
    wanted = [o for o in records if o >= first]
    assert accepted == wanted
