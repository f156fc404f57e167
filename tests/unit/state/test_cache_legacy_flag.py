"""The cache knows whether its partition holds pre-v5 (topic-less) entries, durably."""

from __future__ import annotations

from pathlib import Path

from agents_stream.durable import keys
from agents_stream.durable.journal import ActionRef, ref_identity
from agents_stream.state.cache import LEGACY_KEY, PartitionCache

V5 = ActionRef("k", 3, "A.f#0", 0, "orders")
LEGACY = ActionRef("k", 3, "A.f#0", 0, "")


def test_flag_follows_applied_keys_and_survives_reopening(tmp_path: Path) -> None:
    cache = PartitionCache(tmp_path / "p0")
    assert not cache.has_legacy
    cache.apply([(keys.done_key(V5), b"x"), (keys.memory_key("k#1"), b"m")], 2)
    assert not cache.has_legacy  # a memory key with '#' is not a record entry
    cache.apply([(keys.call_key(LEGACY, 0), b"y")], 3)
    assert cache.has_legacy
    cache.close()
    assert PartitionCache(tmp_path / "p0").has_legacy


def test_a_cache_written_before_the_flag_is_scanned_once(tmp_path: Path) -> None:
    cache = PartitionCache(tmp_path / "p0")
    cache.db[keys.encode_identity(ref_identity("t", LEGACY, 1))] = b"z"
    del cache.db[LEGACY_KEY]  # as an older version left it
    cache.close()
    reopened = PartitionCache(tmp_path / "p0")
    assert reopened.has_legacy and reopened.db.get(LEGACY_KEY) == b"1"
    reopened.close()

    clean = PartitionCache(tmp_path / "p1")
    clean.db[keys.done_key(V5)] = b"x"
    del clean.db[LEGACY_KEY]
    clean.close()
    assert not PartitionCache(tmp_path / "p1").has_legacy
