"""PartitionOffsets against the definition: the committable position is the lowest
offset still in flight, else one past the highest offset started."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agents_stream.runtime.offsets import PartitionOffsets


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=60))
def test_committable_is_lowest_unfinished_offset(ops):
    offsets = PartitionOffsets()
    started: set[int] = set()
    open_: set[int] = set()
    for is_start, offset in ops:
        if is_start and offset not in open_:
            offsets.start(offset)
            started.add(offset)
            open_.add(offset)
        elif not is_start and offset in open_:
            offsets.finish(offset)
            open_.discard(offset)
        expected = min(open_) if open_ else (max(started) + 1 if started else None)
        assert offsets.committable() == expected
        assert offsets.in_flight == len(open_)
        if expected is not None and expected % 3 == 0:
            offsets.committed = expected
            assert offsets.committable() is None
            offsets.committed = -1
