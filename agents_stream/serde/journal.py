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

Errors are never swallowed. A value that does not decode raises
:class:`~agents_stream.durable.errors.JournalDecodeError`, an entry that does not encode
:class:`~.errors.JournalEncodeError`; both name the slot (key, seq, action, call index),
the schema and what failed. The one fallback is documented and narrow: an entry the
generated encoder declines with :class:`~.compiled.Misfit` (a value outside its fast
shape) is encoded by fastavro, counted in :attr:`JournalCodec.misfits` and logged once
per entry kind. Any other exception out of generated code raises; fastavro is then only
asked whether the entry fits, to say whether the value or the code is wrong.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..durable.errors import JournalDecodeError
from ..durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    CompletionGroup,
    ExceptionInfo,
    InputProgress,
    JournalEntry,
    MemorySnapshot,
    MemoryUpdate,
    SentEvent,
    TimerEntry,
    TimerUpdate,
    Truncation,
    TwoPhase,
    TwoPhaseCall,
)
from ..durable.keys import decode_identity, identity_fields
from ..errors import ConfigurationError
from .avro import AvroSerde
from .compiled import (
    _V,
    Misfit,
    ObjectBinding,
    ObjectDecoder,
    ObjectEncoder,
    compile_object_codec,
    compile_projection,
)
from .errors import (
    JournalEncodeError,
    RegistryError,
    SerdeError,
    ValueDecodeError,
    ValueEncodeError,
)
from .framing import single_object_header
from .registry import RegistryBinding
from .schemas import JOURNAL_RECORD_TYPE, load_versions

log = logging.getLogger("agents_stream.serde")

_NS = "agents_stream.journal."
CALL = _NS + "CallResult"
DONE = _NS + "ActionDone"
SNAPSHOT = _NS + "MemorySnapshot"
TRUNCATION = _NS + "Truncation"
TIMER = _NS + "Timer"
PROGRESS = _NS + "InputProgress"
GROUP = _NS + "CompletionGroup"
TWO_PHASE = _NS + "TwoPhaseCall"


class JournalCodec:
    """Encodes journal entries to value bytes and decodes them back, losslessly.

    Calls and completions (nearly every record) take code generated for their schema
    branch that goes straight between the dataclass and the bytes; every other entry, a
    value the generated code declines (a Misfit), and a record of an older writer take
    the general path (dicts through :class:`AvroSerde`), which the fast path is tested
    against.

    Thread-safe once built; build it with :func:`default_journal_codec`.

    Attributes:
        misfits: entry kind name -> entries the generated encoder declined (encoded, or
            refused, by fastavro); the first of each kind is logged.
    """

    def __init__(self, serde: AvroSerde) -> None:
        self.serde = serde
        self._fast_enc: dict[type, tuple[int, ObjectEncoder]] = {}
        self._fast_dec: dict[bytes, Any] = {}
        self._heads: dict[type, bytes] = {}
        if serde.compiled and serde.writer.canonical == serde.reader.canonical:
            self._fast_enc, decoders = _fast_codecs(serde.reader.parsed)
            # Keyed by frame + branch index: one lookup tells framing, writer and kind.
            prefix = single_object_header(serde.reader.fingerprint)
            self._fast_dec = {prefix + _V[i << 1]: dec for i, dec in decoders.items()}
        self._projections: dict[tuple[type, tuple[str, ...]], tuple[bytes, Any] | None] = {}
        self._label = serde.reader.label
        self.misfits: dict[str, int] = {}
        self._flips = _emitted_flips(serde.writer.parsed)

    def encode(self, entry: JournalEntry) -> bytes:
        """The record value of ``entry`` (its key comes from ``entry_key_bytes``)."""
        cls = entry.__class__
        if cls is ActionDone and self._flips:
            return self._encode_done(entry)  # type: ignore[arg-type]
        return self._encode(entry)

    def _encode(self, entry: JournalEntry) -> bytes:
        fast = self._fast_enc.get(entry.__class__)
        if fast is not None:
            head = self._heads.get(entry.__class__)
            if head is None:  # the header may need the registry: not before the first write
                head = self._heads[entry.__class__] = self.serde.header() + _V[fast[0] << 1]
            try:
                return fast[1](head, entry)
            except Misfit as exc:  # outside the fast shape: fastavro writes it or says why
                self._misfit(entry, exc)
                general = self.serde.encode_fastavro  # not the dict path's Misfit again
            except Exception as exc:  # a wrong value or a codec bug: raised, never hidden
                raise self._fast_failed(entry, exc) from exc
        else:
            general = self.serde.encode
        try:
            return general({"entry": to_datum(entry)})
        except ValueEncodeError as exc:
            raise _encode_error(entry, str(exc)) from exc
        except (AttributeError, TypeError, ValueError, KeyError) as exc:  # to_datum
            reason = f"not encodable with {self.serde.writer.label}: {type(exc).__name__}: {exc}"
            raise _encode_error(entry, reason) from exc

    def _misfit(self, entry: JournalEntry, exc: Misfit) -> None:
        kind = entry.__class__.__name__
        seen = self.misfits.get(kind, 0)
        self.misfits[kind] = seen + 1
        if not seen:
            log.warning(
                "%s %s is outside the compiled encoder's fast shape of %s (%s): encoded by "
                "fastavro (logged once per kind; JournalCodec.misfits counts them)",
                kind, _where_text(entry), self.serde.writer.label, exc,
            )  # fmt: skip

    def _fast_failed(self, entry: JournalEntry, exc: Exception) -> JournalEncodeError:
        """The error for a failure of the generated encoder other than a Misfit. fastavro
        is asked whether the entry fits the schema, only to say which of the value and
        the code is wrong: its bytes are never written instead."""
        failed = f"the compiled encoder raised {type(exc).__name__}: {exc}"
        try:
            self.serde.encode_fastavro({"entry": to_datum(entry)})
        except Exception as reference:  # the value is wrong: fastavro's words
            said = str(reference)
            if not isinstance(reference, ValueEncodeError):  # to_datum's own error
                label = self.serde.writer.label
                said = f"value does not fit {label}: {type(reference).__name__}: {reference}"
            return _encode_error(entry, f"{said} ({failed})")
        return _encode_error(
            entry,
            f"{failed} on a value that fits {self.serde.writer.label} (fastavro encodes "
            "it): a bug of agents_stream.serde.compiled; nothing written",
        )

    def _encode_done(self, done: ActionDone) -> bytes:
        """An ActionDone; its emitted marker (the same entry with ``emitted=True``, which
        ``runner._emitted`` copies with the bytes this left on it) by flipping that one
        byte rather than encoding the entry, outputs and all, a second time."""
        if done.emitted:
            cached = done.__dict__.get(_UNEMITTED)
            if cached is not None and cached[0] is self:  # this codec's framing
                marker = _flip_emitted(cached[1], done)
                if marker is not None:
                    return marker
            return self._encode(done)
        value = self._encode(done)
        done.__dict__[_UNEMITTED] = (self, value)  # frozen: a cache, not a field
        return value

    def decode(self, key: bytes, value: bytes) -> JournalEntry:
        """Decode a record value written by any released schema version.

        Args:
            key: the record key, used only to name the slot in errors.
            value: the record value (not a tombstone).

        Raises:
            JournalDecodeError: undecodable value; carries key, seq, action and call
                index parsed from ``key`` when the value itself is unreadable.
        """
        if value.__class__ is bytes:  # slices of other buffers would not be bytes
            decoder = self._fast_dec.get(value[:11])
            if decoder is not None:
                try:
                    entry, end = decoder(value, 11)
                except Exception as exc:  # IndexError, struct.error, UnicodeDecodeError, ...
                    reason = f"corrupt body ({self._label}): {type(exc).__name__}: {exc}"
                    raise _decode_error(reason, key) from exc
                if end != len(value):
                    if end > len(value):
                        reason = f"corrupt body ({self._label}): length past the end"
                    else:
                        reason = f"{len(value) - end} trailing bytes after the body ({self._label})"
                    raise _decode_error(reason, key)
                return entry  # type: ignore[no-any-return]
        try:
            name, datum = self.serde.decode(value)["entry"]
            return from_datum(name, datum)
        except ValueDecodeError as exc:
            raise _decode_error(exc.reason, key) from exc
        except RegistryError:
            raise  # the registry's fault (unreachable), not the record's: said as such
        except (SerdeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            reason = f"not a journal entry of {self._label}: {type(exc).__name__}: {exc}"
            raise _decode_error(reason, key) from exc

    def projection(
        self, kind: type[JournalEntry], fields: tuple[str, ...]
    ) -> tuple[bytes, ObjectDecoder] | None:
        """A decoder of some Avro fields of one entry kind, for readers that need a few
        fields of every record (an audit counting calls): ``(head, decoder)``.

        Only for records this codec's own schema wrote: those start with ``head`` (frame
        and union branch, 11 bytes), and ``decoder(value, 11)`` returns ``(the fields in
        the order asked, end)``. Like the full decode it raises, or returns an end other
        than ``len(value)``, on a body that does not decode (let :meth:`decode` say
        why); it fails on exactly those. ``fields`` are the record's own Avro fields
        (an entry's ref is flattened there: ``key``, ``seq``, ``action``, ``topic``...).
        None when there is no compiled path (a registry frames the records)."""
        name = {CallEntry: CALL, ActionDone: DONE}.get(kind)
        if name is None or not self._fast_dec:
            return None
        cached = self._projections.get((kind, fields))
        if cached is not None or (kind, fields) in self._projections:
            return cached
        found = None
        branches = self.serde.reader.parsed["fields"][0]["type"]
        for index, branch in enumerate(branches):
            if isinstance(branch, dict) and branch.get("name") == name and index < 64:
                decoder = compile_projection(branch, fields, _bindings())
                if decoder is not None:
                    head = single_object_header(self.serde.reader.fingerprint) + _V[index << 1]
                    found = (head, decoder)
        self._projections[(kind, fields)] = found
        return found

    @property
    def writes_groups(self) -> bool:
        """Whether the writer schema has the CompletionGroup branch (v7+): a codec
        pinned to an older newest version (``AGENTS_STREAM_SCHEMAS_DIR``, a release
        being rolled to) writes completions one ActionDone at a time."""
        branches = self.serde.writer.parsed["fields"][0]["type"]
        return any(isinstance(b, dict) and b.get("name") == GROUP for b in branches)

    def current_header(self) -> bytes:
        """The frame prefix of records this codec writes without a registry (records
        that start with it need no :meth:`check`); ``b""`` when a registry frames them
        (its schema id is only known once registered)."""
        if self.serde.registry is not None:
            return b""
        return single_object_header(self.serde.writer.fingerprint)

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


def _where(entry: Any) -> dict[str, Any]:
    """The slot fields of ``entry`` that it has (an entry that fails to encode may be
    malformed: nothing here may raise)."""
    where: dict[str, Any] = {}
    ref = getattr(entry, "ref", None)
    for name, holder in (("key", ref), ("seq", ref), ("action", ref), ("key", entry)):
        value = getattr(holder, name, None)
        if value is not None and name not in where:
            where[name] = value
    if isinstance(entry, CallEntry | Truncation) and isinstance(entry.index, int):
        where["index"] = entry.index
    return where


def _where_text(entry: Any) -> str:
    where = _where(entry)
    return f"(key={where.get('key')!r} seq={where.get('seq')} action={where.get('action')!r}" + (
        f" call_index={where['index']})" if "index" in where else ")"
    )


def _encode_error(entry: Any, reason: str) -> JournalEncodeError:
    where = _where(entry)
    key = where.get("key")
    return JournalEncodeError(
        reason,
        key=None if key is None else str(key),
        seq=where.get("seq"),
        action=where.get("action"),
        index=where.get("index"),
    )


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
        return DONE, _done_datum(entry)
    if isinstance(entry, CompletionGroup):
        return GROUP, {
            "topic": entry.topic,
            "partition": entry.partition,
            "group": entry.group,
            "at_ms": entry.at_ms,
            "dones": [_done_datum(d) for d in entry.dones],
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
    return _other_datum(entry)


def _done_datum(entry: ActionDone) -> dict[str, Any]:
    return {
        **_ref(entry.ref),
        "memory_updates": [{"name": u.name, "value": u.value} for u in entry.memory_updates],
        "outputs": list(entry.outputs),
        "events": [{"type": e.type, "payload": e.payload} for e in entry.events],
        "calls": entry.calls,
        "finished_ms": entry.finished_ms,
        "emitted": entry.emitted,
        "timers": [{"kind": t.kind, "ts": t.ts, "deleted": t.deleted} for t in entry.timers],
        "memory_version": entry.memory_version,
        "emitted_outputs": list(entry.emitted_outputs),
    }


def _other_datum(entry: JournalEntry) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, TwoPhaseCall):
        return TWO_PHASE, {
            **_ref(entry.ref),
            "index": entry.index,
            "call_id": entry.call_id,
            "function_id": entry.function_id,
            "args_digest": entry.args_digest,
            "phase": entry.phase.value,
            "target": entry.target,
            "prepared": entry.prepared,
            "round": entry.round,
            "prepared_ms": entry.prepared_ms,
            "settled_ms": entry.settled_ms,
            "attempts": entry.attempts,
            "last_error": entry.last_error,
            "worker_id": entry.worker_id,
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
        return _done_of(d)
    if name == GROUP:
        return CompletionGroup(
            topic=d["topic"],
            partition=d["partition"],
            group=d["group"],
            dones=tuple(_done_of(x) for x in d["dones"]),
            at_ms=d["at_ms"],
        )
    return _other_of(name, d)


def _done_of(d: dict[str, Any]) -> ActionDone:
    return ActionDone(
        ref=_ref_of(d),
        memory_updates=tuple(MemoryUpdate(u["name"], u["value"]) for u in d["memory_updates"]),
        outputs=tuple(d["outputs"]),
        events=tuple(SentEvent(e["type"], e["payload"]) for e in d["events"]),
        calls=d["calls"],
        finished_ms=d["finished_ms"],
        emitted=d["emitted"],
        timers=tuple(TimerUpdate(t["kind"], t["ts"], t["deleted"]) for t in d.get("timers", ())),
        memory_version=d.get("memory_version", -1),
        emitted_outputs=tuple(d.get("emitted_outputs", ())),
    )


def _other_of(name: str, d: dict[str, Any]) -> JournalEntry:
    if name == TWO_PHASE:
        return TwoPhaseCall(
            ref=_ref_of(d),
            index=d["index"],
            function_id=d["function_id"],
            args_digest=d["args_digest"],
            phase=TwoPhase(d["phase"]),
            target=d["target"],
            prepared=d["prepared"],
            call_id=d["call_id"],
            round=d["round"],
            prepared_ms=d["prepared_ms"],
            settled_ms=d["settled_ms"],
            attempts=d["attempts"],
            last_error=d["last_error"],
            worker_id=d["worker_id"],
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


# Generated decoders build frozen dataclasses as their __init__ would (one
# object.__setattr__ per field) in one step, for classes _checked_dataclass accepted.
_new = object.__new__
_setattr = object.__setattr__


def _checked_dataclass(cls: type, names: Sequence[str]) -> bool:
    # Building through __dict__ is only the same object when __init__ does nothing else.
    return (
        dataclasses.is_dataclass(cls)
        and not hasattr(cls, "__post_init__")
        and "__slots__" not in cls.__dict__
        and [f.name for f in dataclasses.fields(cls)] == list(names)
        and all(f.init for f in dataclasses.fields(cls))
    )


def _builder(cls: type, fields: dict[str, str]) -> Any:
    """``build`` of an ObjectBinding: field -> expression over decoded field values."""
    name = f"_{cls.__name__}"

    def build(local: Mapping[str, str]) -> str:
        items = ", ".join(f"{k!r}: {expr.format(**local)}" for k, expr in fields.items())
        if _checked_dataclass(cls, list(fields)):
            # _make inlined (no Python frame): the variable is unique per generated record.
            obj = "_o" + "_".join(local.values())[:40].replace(",", "")
            return f"(_setattr({obj} := _new({name}), '__dict__', {{{items}}}), {obj})[1]"
        return f"{name}(**{{{items}}})"

    return build


_REF_GET = {
    "key": "{o}.ref.key",
    "seq": "{o}.ref.seq",
    "action": "{o}.ref.action",
    "partition": "{o}.ref.partition",
    "topic": "{o}.ref.topic",
}
_REF_BUILD = (
    "(_setattr(_ref := _new(_ActionRef), '__dict__', {{'key': {key}, 'seq': {seq}, "
    "'action': {action}, 'partition': {partition}, 'topic': {topic}}}), _ref)[1]"
)


# An entry's strings with few distinct values: encoded once per value (compiled.py).
_RECURRING = frozenset({"action", "topic"})


def _bindings() -> dict[str, ObjectBinding]:
    env = {
        "_new": _new,
        "_setattr": _setattr,
        "_ActionRef": ActionRef,
        "_CallEntry": CallEntry,
        "_ExceptionInfo": ExceptionInfo,
        "_ActionDone": ActionDone,
        "_MemoryUpdate": MemoryUpdate,
        "_SentEvent": SentEvent,
        "_TimerUpdate": TimerUpdate,
        "_STATUS": {s.value: s for s in CallStatus},
        "_FAILED": CallStatus.FAILED,
        "_SUCCEEDED": CallStatus.SUCCEEDED,
    }
    ref_build = _REF_BUILD
    if not _checked_dataclass(ActionRef, list(_REF_GET)):
        ref_build = "_ActionRef({key}, {seq}, {action}, {partition}, {topic})"

    def plain(cls: type, *names: str) -> ObjectBinding:
        return ObjectBinding(cls, build=_builder(cls, {n: f"{{{n}}}" for n in names}), env=env)

    call_build = _builder(
        CallEntry,
        {
            "ref": ref_build,
            "index": "{index}",
            "function_id": "{function_id}",
            "args_digest": "{args_digest}",
            # null only from a writer before v2 (the seed's rule, as in from_datum)
            "status": "(_STATUS[{status}] if {status} is not None else "
            "_FAILED if {exception} is not None else _SUCCEEDED)",
            "result": "{result}",
            "exception": "{exception}",
            "call_id": "{call_id}",
            "started_ms": "{started_ms}",
            "finished_ms": "{finished_ms}",
            "attempts": "{attempts}",
            "worker_id": "{worker_id}",
        },
    )
    done_build = _builder(
        ActionDone,
        {
            "ref": ref_build,
            "memory_updates": "tuple({memory_updates})",
            "outputs": "tuple({outputs})",
            "events": "tuple({events})",
            "calls": "{calls}",
            "finished_ms": "{finished_ms}",
            "emitted": "{emitted}",
            "timers": "tuple({timers})",
            "memory_version": "{memory_version}",
            "emitted_outputs": "tuple({emitted_outputs})",
        },
    )
    group_build = _builder(
        CompletionGroup,
        {
            "topic": "{topic}",
            "partition": "{partition}",
            "group": "{group}",
            "dones": "tuple({dones})",
            "at_ms": "{at_ms}",
        },
    )
    return {
        GROUP: ObjectBinding(
            CompletionGroup, build=group_build, env={**env, "_CompletionGroup": CompletionGroup}
        ),
        CALL: ObjectBinding(
            CallEntry,
            get={**_REF_GET, "status": "{o}.status.value"},
            build=call_build,
            env=env,
            recurring=_RECURRING | {"function_id", "worker_id"},
        ),
        _NS + "ExceptionInfo": plain(ExceptionInfo, "type", "message", "traceback", "args"),
        DONE: ObjectBinding(
            ActionDone, get=_REF_GET, build=done_build, env=env, recurring=_RECURRING
        ),
        _NS + "MemoryUpdate": plain(MemoryUpdate, "name", "value"),
        _NS + "SentEvent": plain(SentEvent, "type", "payload"),
        _NS + "TimerUpdate": plain(TimerUpdate, "kind", "ts", "deleted"),
    }


_UNEMITTED = "_unemitted_value"


def _emitted_flips(parsed: Any) -> bool:
    """Whether the writer schema's ActionDone ends with ``emitted, timers,
    memory_version, topic``, the layout :func:`_flip_emitted` counts back through."""
    try:
        branches = parsed["fields"][0]["type"]
        done = next(b for b in branches if isinstance(b, dict) and b.get("name") == DONE)
        tail = [(f["name"], f["type"]) for f in done["fields"][-4:]]
    except (KeyError, IndexError, TypeError, StopIteration):
        return False
    return (
        [n for n, _ in tail] == ["emitted", "timers", "memory_version", "topic"]
        and [t for n, t in tail if n != "timers"] == ["boolean", "long", "string"]
        and isinstance(tail[1][1], dict)
        and tail[1][1].get("type") == "array"
    )


def _varint_len(zigzag: int) -> int:
    return max(1, (zigzag.bit_length() + 6) // 7)


def _flip_emitted(value: bytes, done: ActionDone) -> bytes | None:
    """``value`` (``done`` encoded with ``emitted=False``) with ``emitted=True``; None
    when the tail is not the expected one (then the entry is encoded)."""
    if done.timers:
        return None
    topic = done.ref.topic.encode("utf-8", "surrogatepass")
    version = done.memory_version
    # After the boolean: an empty array (one 0 byte), two zigzag varints, the topic.
    tail = (
        1
        + _varint_len((version << 1) ^ (version >> 63))
        + _varint_len(len(topic) << 1)
        + len(topic)
    )
    at = len(value) - tail - 1
    if at < 0 or value[at] != 0 or value[at + 1] != 0 or not value.endswith(topic):
        return None
    return value[:at] + b"\x01" + value[at + 1 :]


def _fast_codecs(parsed: Any) -> tuple[dict[type, tuple[int, Any]], dict[int, Any]]:
    """Object codecs of the union branches that have bindings (calls and completions).

    Returns class -> (branch index, encoder) and branch index -> decoder.
    """
    encoders: dict[type, tuple[int, Any]] = {}
    decoders: dict[int, Any] = {}
    try:
        branches = parsed["fields"][0]["type"]
    except (KeyError, IndexError, TypeError):
        return encoders, decoders
    bindings = _bindings()
    named = {b["name"]: b for b in branches if isinstance(b, dict) and "name" in b}
    for index, branch in enumerate(branches):
        name = branch.get("name") if isinstance(branch, dict) else None
        if name not in (CALL, DONE, GROUP) or index >= 64:
            continue
        codec = compile_object_codec(_inlined(branch, named), bindings)
        if codec is not None:
            encoders[bindings[name].cls] = (index, codec[0])
            decoders[index] = codec[1]
    return encoders, decoders


def _inlined(schema: Any, named: dict[str, Any]) -> Any:
    """``schema`` self-contained: a reference to another branch of the union (a group's
    ``dones`` name ActionDone) replaced by that branch's definition, as the compiler
    needs (it compiles one branch at a time)."""
    if isinstance(schema, str):
        return named.get(schema, schema)
    if isinstance(schema, list):
        return [_inlined(s, named) for s in schema]
    if isinstance(schema, dict):
        return {
            k: _inlined(v, named) if k in ("type", "items", "values", "fields") else v
            for k, v in schema.items()
        }
    return schema


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
