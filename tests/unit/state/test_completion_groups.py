"""Completion groups (journal v7) in the RocksDB cache, against a model.

A group record holds several input records' ActionDones under one key. The cache must
find each member under its own done key (the record is not fresh), keep the membership
across a reopening and a rebuild (replay), and hand the group's key back for a tombstone
exactly when its last member is pruned: never before (a member's completion would be
gone while its record is uncommitted), and not forgotten (a group left forever).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.durable import keys
from agents_stream.durable.groups import grouped_dones
from agents_stream.durable.journal import ActionDone, ActionRef, CompletionGroup
from agents_stream.serde.journal import default_journal_codec
from agents_stream.state.cache import PartitionCache

CODEC = default_journal_codec()
TOPIC = "orders"


def members_of(key: bytes, value: bytes) -> list[bytes]:
    group = CODEC.decode(key, value)
    assert isinstance(group, CompletionGroup)
    return [keys.done_key(d.ref) for d in group.dones]


def done(seq: int, key: str | None = None, topic: str = TOPIC) -> ActionDone:
    return ActionDone(ActionRef(key or f"k{seq % 3}", seq, "A.run#0", 0, topic), calls=0)


def group_record(seqs: list[int]) -> tuple[bytes, bytes, CompletionGroup]:
    (group,), alone = grouped_dones([done(s) for s in seqs], 0)
    assert not alone
    return keys.entry_key_bytes(group), CODEC.encode(group), group


def cache_at(path: Path) -> PartitionCache:
    return PartitionCache(path, members_of=members_of)


def prune(cache: PartitionCache, records: list[tuple[int, str]], topic: str = TOPIC) -> list:
    """What the store tombstones when ``records`` are committed (prune_records)."""
    doomed = cache.record_keys(records, topic)
    if doomed is None:
        doomed = cache.keys_under(
            [p for s, k in records for p in keys.record_prefixes(k, s, topic)]
        )
    return cache.pruned(doomed, records, topic)


def is_virtual(cache: PartitionCache, key: bytes) -> bool:
    return cache.group_of(key) is not None and key not in cache._standalone


def test_members_are_found_under_their_done_keys(tmp_path: Path) -> None:
    cache = cache_at(tmp_path / "p0")
    key, value, group = group_record([10, 11, 12])
    cache.apply([(key, value)], 1)
    for member in group.dones:
        done_key = keys.done_key(member.ref)
        assert cache.group_of(done_key) == key
        assert is_virtual(cache, done_key)
        assert not cache.holds_nothing_of(member.ref.key, member.ref.seq)
        assert cache.get(done_key) is None  # no row of its own: read from the group
    assert cache.holds_nothing_of("k0", 13)


def test_the_group_is_returned_once_its_last_member_is_pruned(tmp_path: Path) -> None:
    cache = cache_at(tmp_path / "p0")
    key, value, _ = group_record([10, 11, 12])
    cache.apply([(key, value)], 1)
    assert prune(cache, [(10, "k1"), (11, "k2")]) == []
    assert prune(cache, [(12, "k1")]) == []  # not a member: k0 is
    assert prune(cache, [(12, "k0")], "other-topic") == []
    assert prune(cache, [(12, "k0")]) == [key]
    assert cache.holds_nothing_of("k0", 12)
    cache.apply([(key, None)], 2)  # the tombstone
    assert not cache.rocksdb_scan(keys.GROUPS_PREFIX)


def test_membership_survives_a_reopening_and_a_rebuild(tmp_path: Path) -> None:
    cache = cache_at(tmp_path / "p0")
    key, value, group = group_record([20, 21])
    cache.apply([(key, value)], 1)
    cache.close()
    reopened = cache_at(tmp_path / "p0")
    assert reopened.group_of(keys.done_key(group.dones[1].ref)) == key
    reopened.close()
    rebuilt = cache_at(tmp_path / "p1")
    rebuilt.replay([key], [value], 1)
    rebuilt.settle()
    assert rebuilt.group_of(keys.done_key(group.dones[0].ref)) == key
    assert not rebuilt.holds_nothing_of("k2", 20)


def test_a_member_with_a_row_of_its_own_is_tombstoned_by_key(tmp_path: Path) -> None:
    """An emitted marker (the Faust host, backfill) is a standalone ActionDone under the
    member's done key: that row is in the topic and is pruned with a tombstone."""
    cache = cache_at(tmp_path / "p0")
    key, value, group = group_record([30, 31])
    cache.apply([(key, value)], 1)
    marker = keys.done_key(group.dones[0].ref)
    cache.apply([(marker, CODEC.encode(group.dones[0]))], 2)
    assert not is_virtual(cache, marker)
    assert cache.get(marker) is not None
    cache.close()
    reopened = cache_at(tmp_path / "p0")
    assert not is_virtual(reopened, marker)
    # Pruned: the marker's own row is tombstoned, the group once both are gone.
    assert prune(reopened, [(30, "k0")]) == [marker]
    assert prune(reopened, [(31, "k1")]) == [key]


def test_members_below_a_marker_are_dropped_on_assignment(tmp_path: Path) -> None:
    cache = cache_at(tmp_path / "p0")
    low, low_value, _ = group_record([1, 2])
    high, high_value, _ = group_record([3, 9])
    cache.apply([(low, low_value), (high, high_value)], 2)
    assert cache.drop_below("other", 10) == []
    assert cache.drop_below(TOPIC, 4) == [low]  # 3 dropped, 9 is not committed
    assert cache.group_of(keys.done_key(done(9).ref)) == high
    assert prune(cache, [(9, "k0")]) == [high]


def test_groups_hold_input_records_of_one_topic_only() -> None:
    firing = ActionDone(ActionRef("k", -5, "A.t#e0", 0, TOPIC))
    legacy = ActionDone(ActionRef("k", 5, "A.run#0", 0, ""))
    groups, alone = grouped_dones(
        [done(1), done(2, topic="b"), firing, legacy, done(3), done(4, topic="b")], 0
    )
    assert {g.topic: [d.ref.seq for d in g.dones] for g in groups} == {TOPIC: [1, 3], "b": [2, 4]}
    assert alone == [firing, legacy]
    assert len({g.group for g in groups}) == 2  # unique keys


# -- interleavings against a model -------------------------------------------------------
# Operations on one partition: a round of finished records written as a group, the
# commit of every record below an offset (pruned), a reopening (a restart), a rebuild
# from the topic (what the cache was sent, replayed). The model: the set of records whose
# completion must be found (written, not pruned) and the groups that must live.

ops = st.lists(
    st.one_of(
        st.tuples(st.just("group"), st.integers(2, 5)),
        st.tuples(st.just("commit"), st.integers(0, 4)),
        st.tuples(st.just("reopen"), st.just(0)),
        st.tuples(st.just("rebuild"), st.just(0)),
    ),
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops, st.booleans())
def test_completion_commit_prune_and_restart_against_a_model(
    tmp_path: Path, steps, small_index: bool
) -> None:
    """``small_index``: past SLOT_INDEX_LIMIT the live-entry index is dropped and pruning
    finds a group's members without it."""
    from agents_stream.state import cache as cache_module

    limit = cache_module.SLOT_INDEX_LIMIT
    cache_module.SLOT_INDEX_LIMIT = 3 if small_index else limit
    try:
        _model(tmp_path, steps)
    finally:
        cache_module.SLOT_INDEX_LIMIT = limit


def _model(tmp_path: Path, steps) -> None:
    import tempfile

    root = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example
    opened: list[PartitionCache] = []
    try:
        _run_model(root, steps, opened)
    finally:
        for cache in opened:
            try:
                cache.close()
            except Exception:
                pass  # closed already


def _run_model(root: Path, steps, opened: list[PartitionCache]) -> None:
    def cache_at(path: Path) -> PartitionCache:
        opened.append(PartitionCache(path, members_of=members_of))
        return opened[-1]

    path = root / "p0"
    cache = cache_at(path)
    topic_log: list[tuple[bytes, bytes | None]] = []  # what reached the topic, in order
    next_seq = 0
    committed = 0
    live: dict[int, str] = {}  # seq -> key of records whose completion must be found
    groups: dict[bytes, set[int]] = {}  # model: group key -> member seqs not pruned
    rebuilds = 0

    def send(records: list[tuple[bytes, bytes | None]]) -> None:
        topic_log.extend(records)
        cache.apply(records, len(topic_log))

    for op, n in steps:
        if op == "group":
            seqs = list(range(next_seq, next_seq + n))
            next_seq += n
            key, value, group = group_record(seqs)
            send([(key, value)])
            groups[key] = set(seqs)
            live.update({d.ref.seq: d.ref.key for d in group.dones})
        elif op == "commit":
            position = min(next_seq, committed + n)
            records = [(s, live[s]) for s in sorted(live) if s < position]
            committed = max(committed, position)
            emptied = [k for k in prune(cache, records) if k.startswith(keys.GROUPS_PREFIX)]
            for seq, _ in records:
                del live[seq]
                for members in groups.values():
                    members.discard(seq)
            expected = {k for k, m in groups.items() if not m}
            assert set(emptied) == expected  # exactly the groups with no member left
            for key in emptied:
                del groups[key]
            send([(k, None) for k in emptied])
        else:
            cache.close()
            if op == "reopen":  # a restart: the same cache from disk
                cache = cache_at(path)
            else:  # a rebuild from the topic, into a fresh cache (another member)
                rebuilds += 1
                path = root / f"rebuilt{rebuilds}"
                cache = cache_at(path)
                if topic_log:
                    cache.replay(
                        [k for k, _ in topic_log], [v for _, v in topic_log], len(topic_log)
                    )
                cache.settle()
            # The assignment's sweep: below the completed-through marker (the commits').
            emptied = cache.drop_below(TOPIC, committed)
            assert set(emptied) == {k for k, m in groups.items() if not m}
            for key in emptied:
                del groups[key]
            send([(k, None) for k in emptied])
        for seq, key in live.items():
            group_key = cache.group_of(keys.done_key(ActionRef(key, seq, "A.run#0", 0, TOPIC)))
            assert group_key is not None and cache.db.get(group_key) is not None, seq
        assert {k for k, _ in cache.rocksdb_scan(keys.GROUPS_PREFIX)} == set(groups)
    cache.close()


def test_a_codec_pinned_before_v7_writes_no_groups() -> None:
    from agents_stream.serde.avro import AvroSerde
    from agents_stream.serde.journal import JournalCodec
    from agents_stream.serde.schemas import JOURNAL_RECORD_TYPE, load_versions

    versions = load_versions(JOURNAL_RECORD_TYPE)
    assert CODEC.writes_groups
    assert not JournalCodec(AvroSerde(versions[:6])).writes_groups  # a release rolled to
