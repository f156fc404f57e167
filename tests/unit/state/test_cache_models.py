"""Cache helpers checked against simple reference models: legacy (topic-less) record
keys told apart by one regular expression (the reference is the field split it
replaced), many prefixes scanned with one iterator, and the index of live call slots."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.state import cache as cache_module
from agents_stream.state.cache import _RECORD_KINDS, PartitionCache, _is_legacy


def reference(key: bytes) -> bool:
    if not key or key[0] not in _RECORD_KINDS:
        return False
    parts = key.split(b"\x1f", 4)
    return len(parts) > 3 and b"#" in parts[3]


fields = st.lists(st.binary(max_size=6) | st.sampled_from([b"#", b"A.f#0", b"orders", b""]))
kinds = st.sampled_from([b"c", b"a", b"t", b"m", b"", b"\x00"])


@given(kinds, fields)
def test_the_match_agrees_with_the_field_split(kind: bytes, parts: list[bytes]) -> None:
    key = b"\x1f".join([kind, *parts]) if kind or parts else b""
    assert _is_legacy(key) == reference(key)


def test_replayed_batches_are_settled_before_a_logged_write(tmp_path: Path) -> None:
    cache = PartitionCache(tmp_path / "p0")
    cache.apply([(b"a\x1fk\x1f1\x1forders\x1fA.f#0", b"x")], 1, replay=True)
    assert cache._unsettled
    cache.apply([(b"a\x1fk\x1f2\x1forders\x1fA.f#0", b"y")], 2)
    assert not cache._unsettled
    cache.close()
    reopened = PartitionCache(tmp_path / "p0")
    assert reopened.checkpoint == 2 and len(list(reopened.db.keys())) == 4
    reopened.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.binary(min_size=1, max_size=5), max_size=30),
    st.lists(st.binary(max_size=3), max_size=8),
)
def test_keys_under_many_prefixes_is_one_scan_per_prefix(
    tmp_path_factory: pytest.TempPathFactory, stored: list[bytes], prefixes: list[bytes]
) -> None:
    cache = PartitionCache(tmp_path_factory.mktemp("keys"))
    cache.apply([(k, b"v") for k in stored], 1)
    try:
        expected = [k for p in sorted(prefixes) for k, _ in cache.scan(p)]
        assert cache.keys_under(prefixes) == expected
    finally:
        cache.close()


RUNS = [b"c\x1fk%d\x1f%d\x1forders\x1fA.p#0\x1f" % (k, s) for k in range(3) for s in (1, 12)]
slot_ops = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(RUNS),
            st.sampled_from([b"0", b"1", b"10"]),
            st.booleans(),  # put (True) or delete
        ),
        max_size=8,
    ),
    max_size=6,
)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot_ops, st.integers(min_value=1, max_value=8))
def test_the_live_slot_index_agrees_with_rocksdb(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[bytes, bytes, bool]]],
    limit: int,
) -> None:
    """Reference: the prefix scan. The index must never say "no slot" where RocksDB has
    one (the run's calls would re-execute); below its limit it is exact; past it, it is
    dropped and every lookup scans. Batches may write a key twice (the last wins)."""
    path = tmp_path_factory.mktemp("slots")
    cache = PartitionCache(path)
    saved, cache_module.SLOT_INDEX_LIMIT = cache_module.SLOT_INDEX_LIMIT, limit
    try:
        for offset, batch in enumerate(batches, 1):
            cache.apply([(run + i, b"v" if put else None) for run, i, put in batch], offset)
            for run in RUNS:
                live = bool(cache.scan(run))
                if cache._slots is not None:
                    assert cache.may_hold_calls(run) == live
                else:
                    assert cache.may_hold_calls(run)
        cache.close()
        reopened = PartitionCache(path)
        for run in RUNS:
            live = bool(reopened.scan(run))
            assert reopened.may_hold_calls(run) == live or reopened._slots is None
            assert reopened.may_hold_calls(run) or not live
        reopened.close()
    finally:
        cache_module.SLOT_INDEX_LIMIT = saved
