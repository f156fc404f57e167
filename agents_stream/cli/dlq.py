"""``agents-stream dlq show|replay``: read dead letters, and put them back to work.

``show`` reads ``<input>-dlq`` to its end (a throwaway consumer, nothing committed) and
prints per dead letter its source position, key, stage and error. ``replay`` produces the
chosen dead letters back to their source partition, key, value and headers as they were,
plus ``x-replay-of: <topic>/<partition>/<offset>``; the worker runs a replayed record
under that original identity, so calls its first attempt journaled are replayed, not
executed again (see :mod:`agents_stream.host.dlq`). Replaying one record twice is
harmless: the second copy finds its actions completed and skips them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import AgentsStreamError, ConfigurationError, KafkaIOError
from ..host.dlq import DLQ_HEADERS, replay_header, replay_of
from .common import add_app_args, app_and_broker, setup_logging


@dataclass(frozen=True)
class DeadLetter:
    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    def header(self, name: str) -> str:
        """The first value of ``name``: a record dead-lettered twice carries two sets of
        ``x-error-*`` headers, the first describing its original position."""
        for k, v in self.headers:
            if k == name and v is not None:
                return v.decode("utf-8", "replace")
        return ""

    def last_header(self, name: str) -> str:
        """The latest value of ``name`` (the most recent failure)."""
        found = ""
        for k, v in self.headers:
            if k == name and v is not None:
                found = v.decode("utf-8", "replace")
        return found

    @property
    def source(self) -> tuple[str, int, int] | None:
        """Original ``(topic, partition, offset)``: a replay's, else where it failed."""
        earlier = replay_of(self.headers)
        if earlier is not None:
            return earlier
        try:
            return (
                self.header("x-source-topic"),
                int(self.header("x-source-partition")),
                int(self.header("x-source-offset")),
            )
        except ValueError:
            return None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dlq",
        help="show or replay dead letters of an app",
        description=(
            "The dead letters of an App's inputs (<input>-dlq): show them, or replay them "
            "to their input under their original identity once the cause is fixed."
        ),
    )
    sub = parser.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND", required=True)
    show = sub.add_parser(
        "show",
        help="print the dead letters of the app's inputs",
        description=(
            "Print the dead letters of each input (<input>-dlq), one line each: where the "
            "record was (topic[partition]@offset; `dlq replay --offsets partition:offset` "
            "takes it), its key, the stage that failed and the error. Reads each DLQ to its end with a throwaway consumer "
            "(nothing is committed); waits up to --timeout (default 30 s) per DLQ."
        ),
    )
    add_app_args(show)
    _add_common(show)
    show.add_argument("--limit", type=int, default=None, help="print at most N per input")
    show.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    show.set_defaults(func=run_show)
    replay = sub.add_parser(
        "replay",
        help="produce dead letters back to their input under their original identity",
        description=(
            "Re-submit dead letters to their source partition with x-replay-of: the worker "
            "runs each under its original offset, so calls journaled before the failure are "
            "replayed, not executed again. Without --yes only lists what it would replay."
        ),
    )
    add_app_args(replay)
    _add_common(replay)
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--offsets",
        nargs="+",
        metavar="P:O",
        help="source positions (partition:offset, as `dlq show` prints them) to replay",
    )
    which.add_argument("--all", action="store_true", help="every dead letter of the input")
    replay.add_argument("--yes", action="store_true", help="produce (default: a dry run)")
    replay.set_defaults(func=run_replay)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic", default=None, help="input topic (default: every input of the app)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long reading each DLQ to its end may take before the command gives up "
        "with exit 1 (default: 30)",
    )


def run_show(args: argparse.Namespace) -> int:
    setup_logging(args.loglevel, tool=True)
    try:
        bootstrap, topics = _resolve(args)
        for topic in topics:
            letters = read_dead_letters(bootstrap, f"{topic}-dlq", timeout=args.timeout)
            if args.limit is not None:
                letters = letters[: args.limit]
            if not args.json:
                print(f"{topic}-dlq: {len(letters)} dead letter(s)")
            for letter in letters:
                print(json.dumps(describe(letter)) if args.json else format_letter(letter))
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def run_replay(args: argparse.Namespace) -> int:
    setup_logging(args.loglevel, tool=True)
    try:
        bootstrap, topics = _resolve(args)
        if len(topics) != 1:
            raise ConfigurationError(
                f"the app has several inputs ({', '.join(topics)}): choose one with --topic"
            )
        topic = topics[0]
        letters = read_dead_letters(bootstrap, f"{topic}-dlq", timeout=args.timeout)
        chosen = list(_select(letters, topic, None if args.all else _positions(args.offsets)))
        for letter in chosen:
            print(("replay " if args.yes else "would replay ") + format_letter(letter))
        if not args.yes:
            print(f"{len(chosen)} dead letter(s) selected; pass --yes to replay them")
            return 0
        produced = replay(bootstrap, topic, chosen, timeout=args.timeout)
        print(f"replayed {produced} dead letter(s) to {topic}")
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _resolve(args: argparse.Namespace) -> tuple[str, list[str]]:
    app, bootstrap = app_and_broker(args)
    inputs = list(app.input_topics)
    if args.topic is not None:
        if args.topic not in inputs:
            raise ConfigurationError(
                f"{args.topic!r} is not an input of app {app.id!r} (inputs: {', '.join(inputs)})"
            )
        return bootstrap, [args.topic]
    return bootstrap, inputs


def _positions(specs: list[str]) -> set[tuple[int, int]]:
    out = set()
    for spec in specs:
        for item in spec.split(","):
            partition, sep, offset = item.strip().partition(":")
            try:
                out.add((int(partition), int(offset)))
            except ValueError:
                raise ConfigurationError(
                    f"--offsets {item!r}: expected partition:offset, e.g. 0:17"
                ) from None
            if not sep:
                raise ConfigurationError(f"--offsets {item!r}: expected partition:offset")
    return out


def _select(
    letters: list[DeadLetter], topic: str, positions: set[tuple[int, int]] | None
) -> Iterator[DeadLetter]:
    """Each source record at most once (a record may have been dead-lettered twice)."""
    seen: set[tuple[int, int]] = set()
    for letter in letters:
        source = letter.source
        if source is None or source[0] != topic:
            continue
        position = source[1], source[2]
        if position in seen or (positions is not None and position not in positions):
            continue
        seen.add(position)
        yield letter
    if positions is not None and positions - seen:
        missing = ", ".join(f"{p}:{o}" for p, o in sorted(positions - seen))
        raise ConfigurationError(f"no dead letter of {topic} at {missing} (see `dlq show`)")


def describe(letter: DeadLetter) -> dict[str, Any]:
    source = letter.source
    return {
        "source": None if source is None else {"topic": source[0], "partition": source[1],
                                               "offset": source[2]},
        "dlq_partition": letter.dlq_partition,
        "dlq_offset": letter.dlq_offset,
        "key": None if letter.key is None else letter.key.decode("utf-8", "backslashreplace"),
        "stage": letter.last_header("x-error-stage"),
        "error_type": letter.last_header("x-error-type"),
        "error_message": letter.last_header("x-error-message"),
        "failed_at_ms": letter.last_header("x-failed-at-ms"),
        "replay_of": replay_of(letter.headers) is not None,
    }  # fmt: skip


def format_letter(letter: DeadLetter) -> str:
    d = describe(letter)
    src = d["source"]
    where = f"{src['topic']}[{src['partition']}]@{src['offset']}" if src else "?"
    message = d["error_message"].splitlines()[0] if d["error_message"] else ""
    return (
        f"  {where} key={d['key']!r} stage={d['stage']} {d['error_type']}: {message[:200]}"
        f"{' (a replay)' if d['replay_of'] else ''}"
    )


def read_dead_letters(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[DeadLetter]:
    """Every record of ``topic`` up to the end each partition's fetch reports."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from ..kafka.admin import REACH_TIMEOUT, TopicAdmin
    from ..kafka.config import reader_config

    # Reaches the cluster first: a refused login or certificate ends in one line naming
    # the setting, at once (the consumer below would wait out the timeout, then raise).
    # An unreachable cluster is said within the CLI's start-up budget, not --timeout.
    TopicAdmin(bootstrap, min(timeout, REACH_TIMEOUT)).partition_counts([topic])
    consumer = Consumer(
        reader_config(
            bootstrap, {"group.id": f"agents-stream-dlq-cli-{uuid.uuid4().hex}", "log_level": 0}
        )
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error else "no partitions"
            raise KafkaIOError(f"cannot read topic {topic!r}: {reason}")
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
        consumer.assign(parts)
        pending = {tp.partition for tp in parts}
        out: list[DeadLetter] = []
        deadline = time.monotonic() + timeout
        ends: dict[int, int] = {}
        while pending:
            if time.monotonic() > deadline:
                raise KafkaIOError(f"end of {topic!r} not reached in {timeout}s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaIOError(f"reading {topic!r}: {err}", code=err.code())
                # The high watermark as first seen (see host/output_log.py: read
                # committed, the EOF stays below a high watermark that moves on).
                end = ends.get(msg.partition())
                if end is None:
                    end = ends[msg.partition()] = consumer.get_watermark_offsets(
                        TopicPartition(topic, msg.partition()), cached=True
                    )[1]
                if msg.offset() >= end:
                    pending.discard(msg.partition())
                continue
            out.append(
                DeadLetter(
                    msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers() or []
                )
            )
        return sorted(out, key=lambda d: (d.dlq_partition, d.dlq_offset))
    finally:
        consumer.close()


def replay(bootstrap: str, topic: str, letters: list[DeadLetter], *, timeout: float = 30.0) -> int:
    """Produce ``letters`` to their source partition of ``topic``; returns the count acked.

    The original key, value and headers are kept; the dead-letter headers are replaced by
    ``x-replay-of`` naming the original position (kept across repeated failures).
    """
    from ..kafka.config import producer_config
    from ..kafka.producer import AckingProducer

    producer = AckingProducer(producer_config(bootstrap))
    try:
        futures = []
        for letter in letters:
            source = letter.source
            assert source is not None and source[0] == topic
            headers = [(k, v or b"") for k, v in letter.headers if k not in DLQ_HEADERS]
            headers.append(replay_header(*source))
            futures.append(
                producer.send(
                    topic, letter.value, key=letter.key, partition=source[1], headers=headers
                )
            )
        for fut in futures:
            fut.result(timeout)
        return len(futures)
    finally:
        producer.close()
