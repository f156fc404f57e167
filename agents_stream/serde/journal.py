"""The journal codec: ActionState entries <-> Kafka record values.

This is the seam the Kafka store calls. Every entry kind is one branch of the
``ActionState`` record type (``schemas/ActionState/vN.avsc``); values are Avro in
single-object framing by default, or the Confluent wire format with a registry. Record
keys are not encoded here (see :func:`agents_stream.durable.keys.entry_key_bytes`); the key
is only parsed to say *which* slot a broken value belongs to.

Reading is version-tolerant: a value written by any released schema version decodes to
today's dataclasses. A call written before ``status`` existed (v1) is SUCCEEDED unless it
carries an exception, the rule the seed's readers applied. Fields added in v4 (timers,
key-state versions) read as their defaults from older writers: no timers, version -1.
"""

from __future__ import annotations

from typing import Any

from ..durable.errors import JournalDecodeError
from ..durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    ExceptionInfo,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    MemoryUpdate,
    SentEvent,
    TimerEntry,
    TimerUpdate,
    Truncation,
)
from ..durable.keys import decode_identity, identity_fields
from ..errors import ConfigurationError
from .avro import AvroSerde
from .errors import SerdeError, ValueDecodeError
from .registry import RegistryBinding
from .schemas import JOURNAL_RECORD_TYPE, load_versions

_NS = "agents_stream.journal."
CALL = _NS + "CallResult"
DONE = _NS + "ActionDone"
SNAPSHOT = _NS + "MemorySnapshot"
TRUNCATION = _NS + "Truncation"
TIMER = _NS + "Timer"
PROGRESS = _NS + "InputProgress"


class JournalCodec:
    """Encodes journal entries to value bytes and decodes them back, losslessly.

    Thread-safe once built; build it with :func:`default_journal_codec`.
    """

    def __init__(self, serde: AvroSerde) -> None:
        self.serde = serde

    def encode(self, entry: JournalEntry) -> bytes:
        """The record value of ``entry`` (its key comes from ``entry_key_bytes``)."""
        return self.serde.encode({"entry": to_datum(entry)})

    def decode(self, key: bytes, value: bytes) -> JournalEntry:
        """Decode a record value written by any released schema version.

        Args:
            key: the record key, used only to name the slot in errors.
            value: the record value (not a tombstone).

        Raises:
            JournalDecodeError: undecodable value; carries key, seq, action and call
                index parsed from ``key`` when the value itself is unreadable.
        """
        try:
            name, datum = self.serde.decode(value)["entry"]
            return from_datum(name, datum)
        except ValueDecodeError as exc:
            raise _decode_error(exc.reason, key) from exc
        except (SerdeError, KeyError, TypeError, ValueError) as exc:
            raise _decode_error(f"{type(exc).__name__}: {exc}", key) from exc

    def check(self, key: bytes, value: bytes) -> None:
        """Cheap validation for bulk replay: known framing and writer schema.

        A full decode costs ~20x a plain read; cache rebuilds check headers only, and a
        corrupt body still fails fast (naming the slot) when the entry is read.
        """
        try:
            self.serde.writer_of(value)
        except ValueDecodeError as exc:
            raise _decode_error(exc.reason, key) from exc


def default_journal_codec(
    schema_registry_url: str | None = None, topic: str | None = None
) -> JournalCodec:
    """The codec the store uses: newest ``ActionState`` schema, any older one readable.

    Args:
        schema_registry_url: switch writes to the Confluent wire format, registering
            the schema under ``<topic>-value`` on first write (``mock://`` for tests).
        topic: the ActionState topic; required with a registry.

    Raises:
        ConfigurationError: a registry URL without a topic.
        SchemaError: the schema files are missing or invalid.
    """
    registry = None
    if schema_registry_url:
        if not topic:
            raise ConfigurationError("a schema registry needs the ActionState topic name")
        registry = RegistryBinding(schema_registry_url, f"{topic}-value")
    return JournalCodec(AvroSerde(load_versions(JOURNAL_RECORD_TYPE), registry=registry))


def _decode_error(reason: str, key: bytes) -> JournalDecodeError:
    where: dict[str, Any] = {}
    try:
        parts = decode_identity(key)
    except (UnicodeDecodeError, AttributeError):
        parts = []
    fields = identity_fields(parts)
    if "key" in fields:
        where["key"] = fields["key"]
    if _ascii_int(fields.get("seq", "").removeprefix("-")):
        where["seq"] = int(fields["seq"])
    if "action" in fields:
        where["action"] = fields["action"]
    if parts[:1] in (["c"], ["t"]) and _ascii_int(fields.get("index", "")):
        where["index"] = int(fields["index"])
    return JournalDecodeError(reason, **where)


def _ascii_int(text: str) -> bool:
    # str.isdigit() accepts digits int() rejects (e.g. "²").
    return text.isascii() and text.isdigit()


def to_datum(entry: JournalEntry) -> tuple[str, dict[str, Any]]:
    """The union branch ``(record name, fields)`` of ``entry`` (newest schema's shape)."""
    if isinstance(entry, CallEntry):
        exc = entry.exception
        return CALL, {
            **_ref(entry.ref),
            "index": entry.index,
            "function_id": entry.function_id,
            "args_digest": entry.args_digest,
            "status": entry.status.value,
            "result": entry.result,
            "exception": None
            if exc is None
            else {
                "type": exc.type,
                "message": exc.message,
                "traceback": exc.traceback,
                "args": exc.args,
            },
            "call_id": entry.call_id,
            "started_ms": entry.started_ms,
            "finished_ms": entry.finished_ms,
            "attempts": entry.attempts,
            "worker_id": entry.worker_id,
        }
    if isinstance(entry, ActionDone):
        return DONE, {
            **_ref(entry.ref),
            "memory_updates": [{"name": u.name, "value": u.value} for u in entry.memory_updates],
            "outputs": list(entry.outputs),
            "events": [{"type": e.type, "payload": e.payload} for e in entry.events],
            "calls": entry.calls,
            "finished_ms": entry.finished_ms,
            "emitted": entry.emitted,
            "timers": [{"kind": t.kind, "ts": t.ts, "deleted": t.deleted} for t in entry.timers],
            "memory_version": entry.memory_version,
        }
    if isinstance(entry, MemorySnapshot):
        return SNAPSHOT, {
            "key": entry.key,
            "values": entry.values,
            "applied_seq": entry.applied_seq,
            "applied_ordinal": entry.applied_ordinal,
            "partition": entry.partition,
            "version": entry.version,
        }
    if isinstance(entry, TimerEntry):
        return TIMER, {
            "key": entry.key,
            "partition": entry.partition,
            "kind": entry.kind,
            "ts": entry.ts,
            "agent": entry.agent,
        }
    if isinstance(entry, InputProgress):
        return PROGRESS, {
            "topic": entry.topic,
            "partition": entry.partition,
            "offset": entry.offset,
            "at_ms": entry.at_ms,
            "worker_id": entry.worker_id,
        }
    if isinstance(entry, Truncation):
        return TRUNCATION, {
            **_ref(entry.ref),
            "index": entry.index,
            "expected_function_id": entry.expected_function_id,
            "expected_args_digest": entry.expected_args_digest,
            "recorded_function_id": entry.recorded_function_id,
            "recorded_args_digest": entry.recorded_args_digest,
            "dropped": entry.dropped,
            "at_ms": entry.at_ms,
        }
    raise TypeError(f"not a journal entry: {type(entry).__name__}")


def from_datum(name: str, d: dict[str, Any]) -> JournalEntry:
    """Rebuild the dataclass of a decoded union branch (reader-schema shape)."""
    if name == CALL:
        exc = d["exception"]
        status = d["status"]
        if status is None:  # written before v2: the seed's rule
            status = "FAILED" if exc is not None else "SUCCEEDED"
        return CallEntry(
            ref=_ref_of(d),
            index=d["index"],
            function_id=d["function_id"],
            args_digest=d["args_digest"],
            status=CallStatus(status),
            result=d["result"],
            exception=None
            if exc is None
            else ExceptionInfo(exc["type"], exc["message"], exc["traceback"], exc.get("args")),
            call_id=d["call_id"],
            started_ms=d["started_ms"],
            finished_ms=d["finished_ms"],
            attempts=d["attempts"],
            worker_id=d["worker_id"],
        )
    if name == DONE:
        return ActionDone(
            ref=_ref_of(d),
            memory_updates=tuple(MemoryUpdate(u["name"], u["value"]) for u in d["memory_updates"]),
            outputs=tuple(d["outputs"]),
            events=tuple(SentEvent(e["type"], e["payload"]) for e in d["events"]),
            calls=d["calls"],
            finished_ms=d["finished_ms"],
            emitted=d["emitted"],
            timers=tuple(
                TimerUpdate(t["kind"], t["ts"], t["deleted"]) for t in d.get("timers", ())
            ),
            memory_version=d.get("memory_version", -1),
        )
    if name == SNAPSHOT:
        return MemorySnapshot(
            key=d["key"],
            values=dict(d["values"]),
            applied_seq=d["applied_seq"],
            applied_ordinal=d["applied_ordinal"],
            partition=d["partition"],
            version=d.get("version", -1),
        )
    if name == TIMER:
        return TimerEntry(
            key=d["key"], kind=d["kind"], ts=d["ts"], agent=d["agent"], partition=d["partition"]
        )
    if name == PROGRESS:
        return InputProgress(
            topic=d["topic"],
            partition=d["partition"],
            offset=d["offset"],
            at_ms=d["at_ms"],
            worker_id=d["worker_id"],
        )
    if name == TRUNCATION:
        return Truncation(
            ref=_ref_of(d),
            index=d["index"],
            expected_function_id=d["expected_function_id"],
            expected_args_digest=d["expected_args_digest"],
            recorded_function_id=d["recorded_function_id"],
            recorded_args_digest=d["recorded_args_digest"],
            dropped=d["dropped"],
            at_ms=d["at_ms"],
        )
    raise ValueDecodeError(f"unknown journal record {name!r}")


def _ref(ref: ActionRef) -> dict[str, Any]:
    return {
        "key": ref.key,
        "seq": ref.seq,
        "action": ref.action,
        "partition": ref.partition,
        "topic": ref.topic,
    }


def _ref_of(d: dict[str, Any]) -> ActionRef:
    return ActionRef(d["key"], d["seq"], d["action"], d["partition"], d.get("topic", ""))
