"""Cache helpers checked against simple reference models: legacy (topic-less) record
keys told apart by one regular expression (the reference is the field split it
replaced), many prefixes scanned with one iterator, and the index of live per-record
entries (the reference is RocksDB itself, read without the index)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.durable import keys
from agents_stream.durable.journal import ActionRef
from agents_stream.state import cache as cache_module
from agents_stream.state.cache import _RECORD_KINDS, PartitionCache, _is_legacy, _record_of


def reference(key: bytes) -> bool:
    if not key or key[0] not in _RECORD_KINDS:
        return False
    parts = key.split(b"\x1f", 4)
    return len(parts) > 3 and b"#" in parts[3] and not parts[2].startswith(b"-")


fields = st.lists(
    st.binary(max_size=6) | st.sampled_from([b"#", b"A.f#0", b"orders", b"", b"-5", b"12"])
)
kinds = st.sampled_from([b"c", b"a", b"t", b"m", b"", b"\x00"])


@given(kinds, fields)
def test_the_match_agrees_with_the_field_split(kind: bytes, parts: list[bytes]) -> None:
    key = b"\x1f".join([kind, *parts]) if kind or parts else b""
    assert _is_legacy(key) == reference(key)


def test_timer_firings_do_not_flag_the_partition_legacy(tmp_path: Path) -> None:
    """A timer firing is keyed without a topic (seq -(ts + 1)); an input record's
    pre-v5 entry flags the partition, and the flag outlives a reopening."""
    firing = ActionRef("k", -1_700_000_000_001, "A.on_timer#t0", 0, "")
    cache = PartitionCache(tmp_path / "p0")
    cache.apply([(keys.done_key(firing), b"v"), (keys.call_key(firing, 0), b"v")], 1)
    assert not cache.has_legacy
    cache.apply([(keys.done_key(ActionRef("k", 7, "A.p#0", 0, "")), b"v")], 2)
    assert cache.has_legacy
    cache.close()
    assert PartitionCache(tmp_path / "p0").has_legacy


def test_replayed_batches_are_settled_before_a_live_write(tmp_path: Path) -> None:
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


# Entries of a few input records: v5 keys of two topics sharing key and seq, a legacy
# (topic-less) layout, ActionDones of actions whose ids prefix one another (#1, #10).
# A key holding the separator too: its record id is what parsing its keys gives.
RECORDS = [(b"k%d" % k, b"%d" % s) for k in range(2) for s in (1, 12, -5)] + [(b"k\x1f1", b"12")]
TAILS = [
    b"orders\x1fA.p#0",
    b"orders2\x1fA.p#0",
    b"orders\x1fA.p#1",
    b"orders\x1fA.p#10",
    b"refunds\x1fA.p#0",
    b"A.p#0",
]
KEYS = [
    kind + b"\x1f" + key + b"\x1f" + seq + b"\x1f" + tail + index
    for key, seq in RECORDS
    for tail in TAILS
    for kind, index in ((b"a", b""), (b"c", b"\x1f0"), (b"c", b"\x1f1"), (b"t", b"\x1f0"))
] + [b"m\x1fk0", b"r\x1fk0\x1f0"]
PROBES = sorted(
    {
        p
        for k in KEYS
        for p in (k, k[: k.rfind(b"\x1f") + 1], k[: k.find(b"\x1f", k.find(b"\x1f", 2) + 1) + 1])
    }
    | {b"c\x1f", b"a\x1fk0\x1f", b"c\x1fk1\x1f1"}
)
writes = st.lists(
    st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), max_size=10),  # put / delete
    max_size=6,
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes,
    st.lists(st.booleans(), min_size=6, max_size=6),
    st.integers(1, 12),
    st.sampled_from([0.0, 3600.0]),
)
def test_the_live_entry_index_agrees_with_rocksdb(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[bytes, bool]]],
    replayed: list[bool],
    limit: int,
    reload_after: float,
) -> None:
    """The index must never say "absent" where RocksDB has an entry (the record's
    actions or calls would run again): reads through it (get, scan, keys_under) equal
    RocksDB's own. Below its limit "may hold" is exact; past it, or after a replayed
    batch until settle(), there is no index and every read goes to RocksDB, until a
    pruning write indexes what lives again. Batches may write a key twice (the last
    wins)."""
    path = tmp_path_factory.mktemp("index")
    cache = PartitionCache(path)
    saved, cache_module.SLOT_INDEX_LIMIT = cache_module.SLOT_INDEX_LIMIT, limit
    # Index again at the first pruning write after a drop (the worker waits 10 s).
    saved_after, cache_module.INDEX_RELOAD_AFTER = cache_module.INDEX_RELOAD_AFTER, reload_after

    def check(c: PartitionCache) -> None:
        for probe in PROBES:
            rows = c.rocksdb_scan(probe)
            assert c.scan(probe) == rows
            assert c.get(probe) == c.db.get(probe)
            if c._slots is not None and _record_of(probe) is not None:
                assert c.may_hold(probe) == bool(rows)  # exact
            else:
                assert c.may_hold(probe)  # no index, or no record named: RocksDB answers
        for group in (PROBES[::3], PROBES[1::4], [p for p in PROBES if p.count(b"\x1f") >= 3]):
            assert c.keys_under(group) == [k for p in sorted(group) for k, _ in c.rocksdb_scan(p)]

    def check_pruning(c: PartitionCache) -> None:
        # "Nothing of this record" (a fresh record runs without reading the journal) is
        # never said of a record with a live call, done or truncation entry, of any
        # topic or layout; with an index it is said of every other record.
        for key, seq in RECORDS:
            rows = [
                r
                for kind in (b"c", b"a", b"t")
                for r in c.rocksdb_scan(kind + b"\x1f" + key + b"\x1f" + seq + b"\x1f")
            ]
            known = c._slots is not None and b"\x1f" not in key
            assert c.holds_nothing_of(key.decode(), int(seq)) == (known and not rows)
        # Input records: pruning never sees a timer firing's (negative) seq.
        records = [(int(seq), key.decode()) for key, seq in RECORDS if int(seq) >= 0]
        for topic in ("orders", "refunds"):
            for legacy in (False, True):
                found = c.record_keys(records, topic, legacy=legacy)
                if c._slots is None:
                    assert found is None
                    continue
                expected = [
                    k
                    for seq, key in records
                    for p in keys.record_prefixes(key, seq, topic)
                    for k, _ in c.rocksdb_scan(p)
                ]
                if legacy:
                    expected += [
                        k
                        for seq, key in records
                        for p in keys.record_prefixes(key, seq)
                        for k, _ in c.rocksdb_scan(p)
                        if keys.is_legacy(keys.decode_identity(k))
                    ]
                assert sorted(found) == sorted(expected)

    try:
        for offset, (batch, replay) in enumerate(zip(batches, replayed, strict=False), 1):
            cache.apply([(k, b"v" if put else None) for k, put in batch], offset, replay=replay)
            check(cache)
            check_pruning(cache)
            cache.settle()
            check(cache)
            check_pruning(cache)
        cache.close()
        reopened = PartitionCache(path)
        check(reopened)
        reopened.close()
    finally:
        cache_module.SLOT_INDEX_LIMIT = saved
        cache_module.INDEX_RELOAD_AFTER = saved_after


def test_the_index_answers_without_rocksdb_and_says_when_it_is_gone(tmp_path: Path) -> None:
    cache = PartitionCache(tmp_path / "p0")
    done = b"a\x1fk\x1f7\x1forders\x1fA.p#1"
    cache.apply([(done, b"v"), (b"c\x1fk\x1f7\x1forders\x1fA.p#1\x1f0", b"v")], 1)
    assert cache.may_hold(done) and cache.may_hold(b"c\x1fk\x1f7\x1forders\x1fA.p#1\x1f")
    assert not cache.may_hold(b"a\x1fk\x1f7\x1forders\x1fA.p#10")  # a prefix of it is live
    assert not cache.may_hold(b"c\x1fk\x1f7\x1forders\x1fA.p#0\x1f")
    assert not cache.holds_nothing_of("k", 7) and cache.holds_nothing_of("k", 8)
    assert not cache.holds_nothing_of("k\x1f7", 8)  # its record id would not parse back
    assert not cache.may_hold(b"a\x1fk\x1f8\x1forders\x1fA.p#1")
    assert cache.may_hold(b"c\x1f")  # names no record: RocksDB answers
    cache.apply([(done, None)], 2, replay=True)
    assert cache._slots is None and cache.may_hold(b"a\x1fk\x1f8\x1forders\x1fA.p#1")
    cache.settle()
    assert not cache.may_hold(done)
    cache.close()


_KEYS = st.sampled_from(
    [
        b"c\x1fk\x1f1\x1forders\x1fA.p#0\x1f0",
        b"a\x1fk\x1f1\x1forders\x1fA.p#0",
        b"c\x1fk\x1f2\x1fA.p#0\x1f0",  # legacy layout
        b"a\x1fj\x1f-3\x1fA.p#t0",  # a timer firing's: not legacy
        b"m\x1fk",
    ]
)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(_KEYS, st.none() | st.binary(max_size=4)), max_size=6)))
def test_a_replay_in_columns_is_apply_of_the_pairs(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[bytes, bytes | None]]]
) -> None:
    pairs, columns = (PartitionCache(tmp_path_factory.mktemp(n)) for n in ("pairs", "columns"))
    try:
        for n, batch in enumerate(batches, start=1):
            pairs.apply(batch, n, replay=True)
            columns.replay([k for k, _ in batch], [v for _, v in batch], n)
        for cache in (pairs, columns):
            cache.settle()
        assert dict(columns.db.items()) == dict(pairs.db.items())
        assert (columns.checkpoint, columns.has_legacy) == (pairs.checkpoint, pairs.has_legacy)
        assert columns._slots == pairs._slots
    finally:
        pairs.close()
        columns.close()


def test_an_index_dropped_past_its_limit_comes_back_once_pruning_shrinks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst of live records must not leave the partition reading RocksDB for good;
    an operator sees both changes in the log."""
    caplog.set_level("INFO", logger="agents_stream.state")
    monkeypatch.setattr(cache_module, "SLOT_INDEX_LIMIT", 2)
    monkeypatch.setattr(cache_module, "INDEX_RELOAD_AFTER", 3600.0)
    cache = PartitionCache(tmp_path / "p0")
    done = [f"a\x1fk\x1f{seq}\x1forders\x1fA.p#0".encode() for seq in range(3)]
    cache.apply([(k, b"v") for k in done], 1)
    assert cache._slots is None  # three records live, over the limit
    assert "over 2 input records with live journal entries" in caplog.text
    cache.apply([(done[0], None), (done[1], None)], 2)
    assert cache._slots is None  # not again before INDEX_RELOAD_AFTER
    monkeypatch.setattr(cache_module, "INDEX_RELOAD_AFTER", 0.0)
    cache.apply([(b"a\x1fk\x1f9\x1forders\x1fA.p#0", b"v")], 3)
    assert cache._slots is None  # a write that prunes nothing does not look
    cache.apply([(done[2], None)], 4)
    assert cache._slots is not None
    assert "live-entry index loaded again (2 records)" in caplog.text
    assert not cache.may_hold(done[2]) and cache.may_hold(b"a\x1fk\x1f9\x1forders\x1fA.p#0")
    cache.close()
