"""``agents-stream state tombstone``: delete journal slots that stop the worker.

A journal value that no schema can read (``JournalDecodeError``, naming key, seq, action
and call index) stops the worker by design. This command deletes that slot: it reads the
ActionState topic to its end, finds the live record keys of the slot in both key layouts
(v5 with the input topic, and the legacy one without; :mod:`agents_stream.durable.keys`),
shows them, and after confirmation (or ``--yes``) produces a tombstone for each to the
partition it was read from (the ActionState partition is the input record's partition).

What happens next: the worker's cache rebuild applies the tombstone as a delete, and the
action runs again for that input record from the deleted slot on (without ``--index``:
from its first call), so a call whose result was lost is executed again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..durable.errors import JournalDecodeError
from ..durable.keys import SEP, identity_fields
from ..errors import AgentsStreamError
from ..serde.journal import JournalCodec, default_journal_codec
from .common import add_app_args, app_and_broker, setup_logging
from .state_read import add_read_args, identity, read_latest


def register_tombstone(sub: Any) -> None:
    parser = sub.add_parser(
        "tombstone",
        help="delete the journal records of one slot (e.g. a corrupt one that stops the worker)",
        description="Deletes one journal slot (key, seq, action, from call --index on) "
        "that stops the worker, e.g. a record no schema can read (the worker's "
        "JournalDecodeError names it): shows the slot's live records, then, confirmed or "
        "with --yes, writes a tombstone for each. The action runs again from that slot on, "
        "so a call whose result is deleted is executed again.",
    )
    add_app_args(parser)
    parser.add_argument("--key", required=True, help="record key (as str)")
    parser.add_argument("--seq", required=True, type=int, help="input offset (seq)")
    parser.add_argument("--action", required=True, help="action id, e.g. Scoring.process#0")
    parser.add_argument(
        "--index", type=int, help="call index (default: every record of the action run)"
    )
    parser.add_argument("--topic", help="input topic (default: any; legacy keys have none)")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_read_args(parser)
    parser.set_defaults(func=run_tombstone)


def matches(raw_key: bytes, args: argparse.Namespace) -> bool:
    """Whether ``raw_key`` is a per-record entry of the slot selected by ``args``."""
    fields = identity_fields(identity(raw_key))
    if fields.get("kind") is None or fields.get("key") != args.key:
        return False
    if fields.get("seq") != str(args.seq) or fields.get("action") != args.action:
        return False
    if args.topic is not None and fields["topic"] not in ("", args.topic):
        return False
    if args.index is not None:
        return fields["kind"] == "c" and fields.get("index") == str(args.index)
    return True


def run_tombstone(args: argparse.Namespace) -> int:
    setup_logging(args.loglevel, tool=True)
    try:
        app, bootstrap = app_and_broker(args)
        topic = app.action_state_topic
        codec = default_journal_codec(app.schema_registry_url, topic)
        where: dict[bytes, int] = {}
        found = read_latest(
            bootstrap,
            topic,
            timeout=args.timeout,
            wanted=lambda key: matches(key, args),
            where=where,
        )
        if not found:
            print(f"no live record of that slot in {topic}", file=sys.stderr)
            return 1
        print(f"{len(found)} record(s) of {topic} to delete:")
        for key in sorted(found):
            print(f"  [{where[key]}] {describe(key, found[key], codec)}")
        if not args.yes and not _confirm(f"produce {len(found)} tombstone(s)?"):
            print("nothing deleted")
            return 1
        produce_tombstones(bootstrap, topic, [(key, where[key]) for key in sorted(found)])
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(found)} tombstone(s) produced")
    return 0


def describe(key: bytes, value: bytes, codec: JournalCodec) -> str:
    """One line: the key's fields and what the value decodes to (or that it does not)."""
    shown = key.decode(errors="replace").replace(SEP, " | ")
    try:
        entry = codec.decode(key, value)
    except JournalDecodeError as exc:
        return f"{shown}  undecodable ({len(value)} bytes): {exc}"
    return f"{shown}  {type(entry).__name__}"


def produce_tombstones(
    bootstrap: str, topic: str, targets: list[tuple[bytes, int]], *, timeout: float = 30.0
) -> None:
    """Produce a tombstone (null value) for each (key, partition) and wait for the acks."""
    from ..kafka.config import producer_config
    from ..kafka.producer import AckingProducer

    producer = AckingProducer(producer_config(bootstrap))
    try:
        futures = [producer.send(topic, None, key=key, partition=p) for key, p in targets]
        for fut in futures:
            fut.result(timeout)
    finally:
        producer.close()


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False
