"""``agents-stream state tombstone`` deletes a corrupt journal slot (both key layouts) on
the partition it was read from, after which a cache rebuild no longer fails."""

from __future__ import annotations

import itertools
import re

import pytest
from confluent_kafka import Producer

from agents_stream.cli.main import main
from agents_stream.cli.state import read_latest
from agents_stream.durable.journal import ActionRef, CallEntry, CallStatus
from agents_stream.durable.keys import SEP, entry_key_bytes
from agents_stream.errors import AgentsStreamError
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.serde import default_journal_codec
from agents_stream.state.cache import PartitionCache
from agents_stream.state.recovery import rebuild_partition

pytestmark = pytest.mark.broker
_modules = itertools.count()

GARBAGE = b"\xc3\x01" + bytes(8) + b"\x02"  # unknown writer schema
ACTION = "Crashy.process#0"


def slot(*parts: object) -> bytes:
    return SEP.join(map(str, parts)).encode()


@pytest.fixture
def corrupt_app(broker, topic_factory, tmp_path, monkeypatch):
    """An app whose ActionState partition 1 holds a corrupt call slot in the v5 and in the
    legacy layout, next to good records that must survive."""
    monkeypatch.syspath_prepend(str(tmp_path))
    app_id = topic_factory("app")
    module = f"state_tombstone_app_{next(_modules)}"
    (tmp_path / f"{module}.py").write_text(
        f"from agents_stream import App\napp = App({app_id!r}, broker={broker.url!r})\n"
    )
    topic = f"{app_id}-action-state"
    TopicAdmin(broker.bootstrap).ensure([compacted(topic, 2)])
    codec = default_journal_codec()
    good = CallEntry(ActionRef("key-1", 0, ACTION, topic="in"), 1, "f", "d", CallStatus.PENDING)
    records = [
        (slot("c", "key-1", 0, "in", ACTION, 0), GARBAGE),
        (slot("c", "key-1", 0, ACTION, 0), GARBAGE),  # legacy layout, same slot
        (slot("c", "key-1", 3, "in", ACTION, 0), GARBAGE),  # another seq: kept
        (entry_key_bytes(good), codec.encode(good)),  # another index: kept
    ]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=1)
    assert producer.flush(30) == 0
    return f"{module}:app", topic, [key for key, _ in records]


def test_tombstone_deletes_the_slot_on_its_partition(broker, corrupt_app, tmp_path, capsys):
    spec, topic, keys = corrupt_app
    cache = PartitionCache(tmp_path / "cache")
    with pytest.raises(
        AgentsStreamError, match=re.escape("key='key-1' seq=0 action='Crashy.process#0'")
    ):
        rebuild_partition(broker.bootstrap, topic, 1, cache, default_journal_codec())
    assert cache.checkpoint == 0  # held at the unresolved record: a retry meets it again
    cache.close()

    args = ["state", "tombstone", "-A", spec, "--key", "key-1", "--seq", "0"]
    assert main([*args, "--action", ACTION, "--index", "0", "--topic", "in", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"2 record(s) of {topic} to delete:" in out
    assert f"[1] c | key-1 | 0 | in | {ACTION} | 0  undecodable" in out
    assert f"[1] c | key-1 | 0 | {ACTION} | 0  undecodable" in out
    assert "2 tombstone(s) produced" in out

    where: dict[bytes, int] = {}
    live = read_latest(broker.bootstrap, topic, where=where)
    assert set(live) == set(keys[2:]) and set(where.values()) == {1}

    # The other corrupt seq, the whole action run (no --index): the good call goes too.
    assert main([*args[:-1], "3", "--action", ACTION, "--yes"]) == 0
    assert main([*args, "--action", ACTION, "--yes"]) == 0
    assert read_latest(broker.bootstrap, topic) == {}
    # The same cache the failed rebuild left behind now catches up: the corrupt values
    # are superseded by their tombstones before the end of the partition.
    cache = PartitionCache(tmp_path / "cache")
    assert rebuild_partition(broker.bootstrap, topic, 1, cache, default_journal_codec()) == 8
    assert cache.checkpoint == 8
    assert [k for k in list(cache.db.keys()) if not k.startswith(b"\x00")] == []
    cache.close()
    assert main(["state", "show", "-A", spec, "--key", "key-1"]) == 1  # nothing left
    assert "error: no journal records of key 'key-1'" in capsys.readouterr().err


def test_without_yes_asks_and_a_no_deletes_nothing(broker, corrupt_app, monkeypatch, capsys):
    spec, topic, keys = corrupt_app
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    args = ["state", "tombstone", "-A", spec, "--key", "key-1", "--seq", "0", "--action", ACTION]
    assert main([*args, "--index", "0"]) == 1
    assert "nothing deleted" in capsys.readouterr().out
    assert set(read_latest(broker.bootstrap, topic)) == set(keys)

    assert main([*args, "--index", "7"]) == 1
    assert "no live record of that slot" in capsys.readouterr().err
