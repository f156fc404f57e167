"""Completion groups (journal v7): which ActionDones travel together, under which key.

The ActionDones of the records of one input partition that finished together (a lane
round, a host's group commit) are written as one :class:`CompletionGroup` record: one
produce, one delivery report, one RocksDB row and, once every record of the group is
committed, one tombstone, instead of one of each per record. What a group holds reads
exactly as standalone ActionDones do (their refs are theirs), so recovery, pruning and
every reader find a record's completion under its own identity either way.

A group is bounded (records and bytes) so that it stays far below a topic's
``max.message.bytes``; a group the broker refuses all the same is appended again one
ActionDone at a time by the lane (``RecordLane._serially``), as before v7.
"""

from __future__ import annotations

import itertools
import secrets
import time

from .journal import ActionDone, CompletionGroup

# A group's records and bytes (outputs and memory values; the rest of an ActionDone is
# ~100 bytes): well under Kafka's default max.message.bytes (1 MiB).
GROUP_RECORDS = 500
GROUP_BYTES = 256 * 1024

# Unique per process, so that two writers' groups never share a key (compaction would
# fold one into the other): a random token, then a counter.
_TOKEN = secrets.token_hex(6)
_ids = itertools.count()


def group_id() -> str:
    return f"{_TOKEN}-{next(_ids):x}"


def _size(done: ActionDone) -> int:
    size = 100 + sum(map(len, done.outputs))
    for update in done.memory_updates:
        size += len(update.name) + len(update.value or b"")
    return size


def grouped_dones(
    dones: list[ActionDone], partition: int
) -> tuple[list[CompletionGroup], list[ActionDone]]:
    """``dones`` (of ``partition``) as completion groups of at least two, by input
    topic and bounded in size, and the ActionDones left to append on their own (timer
    firings', pre-v5 refs', a topic's only one)."""
    by_topic: dict[str, list[ActionDone]] = {}
    alone: list[ActionDone] = []
    for done in dones:  # journal.groupable, inlined: once per finished record
        ref = done.ref
        if ref.seq >= 0 and ref.topic and "\x1f" not in ref.key:
            members = by_topic.get(ref.topic)
            if members is None:
                by_topic[ref.topic] = [done]
            else:
                members.append(done)
        else:
            alone.append(done)
    groups: list[CompletionGroup] = []
    now = int(time.time() * 1000)
    for topic, members in by_topic.items():
        if len(members) <= GROUP_RECORDS:
            size = 100 * len(members) + sum([len(o) for d in members for o in d.outputs])
            if size <= GROUP_BYTES and not any([d.memory_updates for d in members]):
                _close(groups, alone, topic, partition, members, now)  # the common case
                continue
        chunk: list[ActionDone] = []
        size = 0
        for done in members:
            grown = size + _size(done)
            if chunk and (len(chunk) >= GROUP_RECORDS or grown > GROUP_BYTES):
                _close(groups, alone, topic, partition, chunk, now)
                chunk, grown = [], _size(done)
            chunk.append(done)
            size = grown
        _close(groups, alone, topic, partition, chunk, now)
    return groups, alone


def _close(
    groups: list[CompletionGroup],
    alone: list[ActionDone],
    topic: str,
    partition: int,
    chunk: list[ActionDone],
    now: int,
) -> None:
    if len(chunk) >= 2:
        groups.append(CompletionGroup(topic, partition, group_id(), tuple(chunk), now))
    else:
        alone.extend(chunk)
