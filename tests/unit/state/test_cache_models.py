"""Cache helpers checked against simple reference models: legacy (topic-less) record
keys told apart by one regular expression (the reference is the field split it
replaced), and many prefixes scanned with one iterator."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
