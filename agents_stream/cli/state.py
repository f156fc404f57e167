"""``agents-stream state show|stats|tombstone``: inspect (and repair) the ActionState topic.

Reads ``<app id>-action-state`` from the beginning with a throwaway consumer (no group
offsets are committed), keeping the latest value per record key the way compaction
will (a tombstone deletes), and decodes values written by any schema version.
End offsets are the high watermarks that fetches report (partition EOF), never
ListOffsets, which some Kafka-protocol brokers answer wrongly.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from typing import Any

from ..durable.errors import JournalDecodeError
from ..durable.journal import (
    ActionDone,
    CallEntry,
    CallStatus,
    JournalEntry,
    MemorySnapshot,
    TimerEntry,
    Truncation,
    TwoPhase,
    TwoPhaseCall,
    action_ordinal,
    expand,
)
from ..durable.values import MAGIC, VERSION
from ..errors import AgentsStreamError
from ..serde.journal import JournalCodec, default_journal_codec
from .common import add_app_args, app_and_broker, setup_logging
from .state_read import add_read_args, identity, read_latest
from .state_tombstone import register_tombstone

_SHORT = 60


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "state",
        help="inspect the ActionState topic of an app",
        description=(
            "Inspect (and repair) <app id>-action-state, the journal of an App: show one "
            "key's records, count the entries, or tombstone journal slots that stop the worker."
        ),
    )
    sub = parser.add_subparsers(dest="state_command", metavar="SUBCOMMAND", required=True)
    show = sub.add_parser(
        "show",
        help="print the ActionStates of one key",
        description=(
            "Print what the journal holds for one record key: per input record (seq) and "
            "action, whether it completed, each code block's call index, function, status "
            "and result or exception, a two-phase call's phase (PREPARED, COMMITTED, "
            "ABORTING, ABORTED), round, attempts and last error, truncations, the key's "
            "memory and pending timers. "
            "Reads <app id>-action-state from the beginning to its end with a throwaway "
            "consumer (nothing is committed); waits up to --timeout (default 30 s)."
        ),
    )
    add_app_args(show)
    show.add_argument("key", nargs="?", default=None, metavar="KEY", help="record key (as str)")
    show.add_argument(
        "--key", dest="key_option", default=None, metavar="KEY", help="the same, as an option"
    )
    add_read_args(show)
    show.set_defaults(func=run_show)
    stats = sub.add_parser(
        "stats",
        help="count calls per action and status",
        description=(
            "Count the journal's live entries: per action, code blocks by status "
            "(PENDING, SUCCEEDED, FAILED), completed runs and truncations; then the keys "
            "with memory, the pending timers and the two-phase calls by phase. Reads "
            "<app id>-action-state to its end with a throwaway consumer (nothing is "
            "committed); waits up to --timeout (default 30 s)."
        ),
    )
    add_app_args(stats)
    add_read_args(stats)
    stats.set_defaults(func=run_stats)
    register_tombstone(sub)


def run_show(args: argparse.Namespace) -> int:
    if (args.key is None) == (args.key_option is None):
        print("error: give one key: state show KEY (or --key KEY)", file=sys.stderr)
        return 2
    if args.key is None:
        args.key = args.key_option

    def wanted(raw_key: bytes) -> bool:
        parts = identity(raw_key)
        # A completion group (v7) holds several keys' ActionDones: read, then filtered.
        return len(parts) >= 2 and (parts[1] == args.key or parts[0] == "g")

    result = _read(args, wanted)
    if result is None:
        return 1
    topic, entries = result
    entries = [e for e in entries if entry_of_key(e, args.key)]
    if not entries:
        # Not found is an error (exit 1), as grep's: a script must not read it as a key
        # with an empty history.
        print(
            f"error: no journal records of key {args.key!r} in {topic}: the app never saw "
            "that key, or its completed records were pruned after their commit "
            "(prune_completed) and it keeps no memory",
            file=sys.stderr,
        )
        return 1
    print(f"ActionStates of key {args.key!r} in {topic}:")
    for line in format_key(entries):
        print(line)
    return 0


def run_stats(args: argparse.Namespace) -> int:
    result = _read(args, lambda _: True)
    if result is None:
        return 1
    topic, entries = result
    print(f"ActionState statistics of {topic}:")
    for line in format_stats(entries):
        print(line)
    return 0


def _read(args: argparse.Namespace, wanted: Any) -> tuple[str, list[JournalEntry]] | None:
    setup_logging(args.loglevel, tool=True)
    try:
        app, bootstrap = app_and_broker(args)
        topic = app.action_state_topic
        codec = default_journal_codec(app.schema_registry_url, topic)
        values = read_latest(bootstrap, topic, timeout=args.timeout, wanted=wanted)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return topic, decode_all(codec, values)


def decode_all(codec: JournalCodec, values: dict[bytes, bytes]) -> list[JournalEntry]:
    """Decode live values; undecodable ones are reported on stderr, not fatal."""
    entries: list[JournalEntry] = []
    for key, value in values.items():
        try:
            entries.extend(expand(codec.decode(key, value)))  # a group: its ActionDones
        except JournalDecodeError as exc:
            print(f"warning: {exc}", file=sys.stderr)
    return entries


def entry_of_key(entry: JournalEntry, key: str) -> bool:
    """Whether ``entry`` belongs to record key ``key``."""
    ref = getattr(entry, "ref", None)
    return (ref.key if ref is not None else getattr(entry, "key", None)) == key


def format_key(entries: list[JournalEntry]) -> list[str]:
    """Lines for ``state show``: actions by (seq, ordinal), their calls by index; a
    call with a two-phase obligation (v8) has a line of it below, an obligation whose
    slot is gone (pruned) a line of its own."""
    # Runs by (seq, action, input topic): two topics' records at one offset are two runs.
    calls: dict[tuple[int, str, str], list[CallEntry]] = defaultdict(list)
    done: dict[tuple[int, str, str], ActionDone] = {}
    truncations: dict[tuple[int, str, str], list[Truncation]] = defaultdict(list)
    obligations: dict[tuple[int, str, str], dict[int, TwoPhaseCall]] = defaultdict(dict)
    memory: list[MemorySnapshot] = []
    timers: list[TimerEntry] = []
    for entry in entries:
        if isinstance(entry, CallEntry):
            calls[(entry.ref.seq, entry.ref.action, entry.ref.topic)].append(entry)
        elif isinstance(entry, ActionDone):
            done[(entry.ref.seq, entry.ref.action, entry.ref.topic)] = entry
        elif isinstance(entry, Truncation):
            truncations[(entry.ref.seq, entry.ref.action, entry.ref.topic)].append(entry)
        elif isinstance(entry, TwoPhaseCall):
            obligations[(entry.ref.seq, entry.ref.action, entry.ref.topic)][entry.index] = entry
        elif isinstance(entry, TimerEntry):
            timers.append(entry)
        elif isinstance(entry, MemorySnapshot):
            memory.append(entry)
    lines = []
    runs = sorted(
        {*calls, *done, *truncations, *obligations},
        key=lambda r: (r[2], r[0], action_ordinal(r[1]), r[1]),
    )
    for run in runs:
        seq, action, topic = run
        finished = done.get(run)
        state = (
            f"completed ({finished.calls} calls, {len(finished.outputs)} outputs"
            f"{_unsent(finished)})"
            if finished
            else "in progress"
        )
        where = f"topic {topic}  " if topic else ""
        lines.append(f"  {where}seq {seq}  action {action}  {state}")
        owed = dict(obligations.get(run, {}))
        for call in sorted(calls[run], key=lambda c: c.index):
            lines.append(
                f"    call {call.index}  {call.function_id}  {call.status.value}  {_outcome(call)}"
            )
            obligation = owed.pop(call.index, None)
            if obligation is not None:
                lines.append(f"      two-phase {_two_phase(obligation)}")
        for index in sorted(owed):  # the slot is gone, the obligation is not
            x = owed[index]
            lines.append(
                f"    two-phase call {index}  {x.function_id}  {_two_phase(x)}  (no call slot)"
            )
        for cut in truncations[run]:
            lines.append(
                f"    truncated at call {cut.index}: now {cut.expected_function_id}, "
                f"journal had {cut.recorded_function_id} ({cut.dropped} dropped)"
            )
    for snap in memory:
        values = ", ".join(f"{k}={short_payload(v)}" for k, v in sorted(snap.values.items()))
        lines.append(f"  memory (after seq {snap.applied_seq}): {values or '(empty)'}")
    for timer in sorted(timers, key=lambda t: (t.kind, t.ts)):
        lines.append(f"  timer {timer.kind} at {timer.ts} for {timer.agent or '?'}")
    return lines


def _two_phase(x: TwoPhaseCall) -> str:
    """An obligation's phase, round, attempts and last error, for ``state show``."""
    shown = f"{x.phase.value}  round {x.round}  attempts {x.attempts}"
    if x.last_error:
        shown += f"  last error {short_payload(x.last_error.encode())}"
    return shown


def _unsent(done: ActionDone) -> str:
    """What ``state show`` says about outputs not known to be in the output topic (a run
    in flight, or a failed send: a replay sends them)."""
    if done.emitted or not done.outputs:
        return ""
    if done.emitted_outputs:
        landed = len(done.emitted_outputs)
        return f", {len(done.outputs) - landed} not emitted ({landed} in the log)"
    return ", not emitted"


def format_stats(entries: list[JournalEntry]) -> list[str]:
    """Lines for ``state stats``: per action, calls by status and completed runs; keys
    with memory, pending timers, and two-phase obligations by phase when there are any."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for entry in entries:
        if isinstance(entry, CallEntry):
            counts[_action_name(entry.ref.action)][entry.status.value] += 1
        elif isinstance(entry, ActionDone):
            counts[_action_name(entry.ref.action)]["completed"] += 1
        elif isinstance(entry, Truncation):
            counts[_action_name(entry.ref.action)]["truncations"] += 1
    columns = [s.value for s in CallStatus] + ["completed", "truncations"]
    width = max([len("action"), *(len(a) for a in counts)])
    lines = ["  ".join([f"{'action':<{width}}", *(f"{c:>11}" for c in columns)])]
    for action in sorted(counts):
        row = counts[action]
        lines.append("  ".join([f"{action:<{width}}", *(f"{row[c]:>11}" for c in columns)]))
    keys = sum(isinstance(e, MemorySnapshot) for e in entries)
    lines.append(f"keys with memory: {keys}")
    lines.append(f"pending timers: {sum(isinstance(e, TimerEntry) for e in entries)}")
    phases = Counter(e.phase for e in entries if isinstance(e, TwoPhaseCall))
    if phases:  # v8: obligations by phase (PREPARED and ABORTING still owe a call)
        by_phase = ", ".join(f"{phases[p]} {p.value}" for p in TwoPhase)
        waiting = sum(n for p, n in phases.items() if p.open)
        lines.append(f"two-phase calls: {by_phase} ({waiting} waiting)")
    return lines


def _action_name(action: str) -> str:
    # Runs of one action differ only in their ordinal; stats aggregate over them.
    name, sep, ordinal = action.rpartition("#")
    return name if sep and ordinal.isdigit() else action


def _outcome(call: CallEntry) -> str:
    if call.exception is not None:
        return f"exception {call.exception.type}: {short_payload(call.exception.message.encode())}"
    if call.result is not None:
        return f"result {short_payload(call.result)}"
    return ""


def short_payload(data: bytes | None, limit: int = _SHORT, absent: str = "(deleted)") -> str:
    """A journaled payload as text: the tagged JSON of the exact value encoding, else
    UTF-8, else hex; at most ``limit`` characters."""
    if data is None:
        return absent
    if data[:2] == MAGIC + VERSION:  # the exact value encoding: show its tagged JSON
        data = data[2:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + data.hex()
    return text if len(text) <= limit else text[: limit - 3] + "..."
