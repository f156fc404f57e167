"""Avro bodies in either framing, resolved against the newest reader schema.

Writers always use one schema (the newest released version by default). Readers accept
records written by any released version: the writer schema is found from the frame
(fingerprint table or registry id) and fastavro's schema resolution maps it onto the
reader, filling defaults for fields the writer did not have.

The hot paths (encoding with the writer, decoding a record whose writer is the reader) run
code generated for the schema (:mod:`.compiled`); fastavro remains the reference it is
tested against. It takes over for a schema the compiler declines (logged at
construction) and for a datum the generated encoder declines with :class:`.Misfit` (a
value outside its fast shape: counted in ``misfits``, logged once). Any other failure of
generated code raises :class:`ValueEncodeError` / :class:`ValueDecodeError` naming the
schema; fastavro's bytes never stand in for it.
"""

from __future__ import annotations

import io
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from .compiled import Decoder, Encoder, Misfit, compile_schema
from .errors import SchemaError, ValueDecodeError, ValueEncodeError
from .framing import FramingError, confluent_header, read_frame, single_object_header
from .registry import RegistryBinding

log = logging.getLogger("agents_stream.serde")


class AvroSerde:
    """Encode/decode Avro data of one record lineage (all versions of one record type).

    Args:
        versions: released versions, oldest first; the last one is the reader.
        writer: version to write with (default: the reader). Older writers exist for
            golden vectors and compatibility tests.
        registry: when set, write the Confluent wire format with ids from the registry;
            single-object records are still read (topics migrate, nothing is rewritten).
        record_names: decode unions of records as ``(full name, dict)`` tuples (what the
            journal needs to tell entry kinds apart); plain dicts otherwise.
        compiled: encode and decode same-schema records with code generated for the
            schema (same bytes and values as fastavro, ~3x faster); ``False`` uses
            fastavro alone (the reference, for tests and benchmarks).

    Attributes:
        misfits: datums the compiled encoder declined (:class:`.Misfit`) and fastavro
            encoded or rejected; the first one is logged.

    Raises:
        SchemaError: no versions, or the compiled code could not be built (named).
    """

    def __init__(
        self,
        versions: Sequence[Any],
        *,
        writer: Any | None = None,
        registry: RegistryBinding | None = None,
        record_names: bool = True,
        compiled: bool = True,
    ) -> None:
        if not versions:
            raise SchemaError("an Avro serde needs at least one schema version")
        self.versions = tuple(versions)
        self.reader = self.versions[-1]
        self.writer = writer or self.reader
        self.registry = registry
        self.record_names = record_names
        self.compiled = compiled
        self._by_fingerprint = {v.fingerprint: v for v in self.versions}
        self._by_fingerprint.setdefault(self.writer.fingerprint, self.writer)
        self._header: bytes | None = None
        self.misfits = 0
        self._enc = _compiled(self.writer, record_names) if compiled else None
        self._dec = _compiled(self.reader, record_names) if compiled else None
        # Records the reader wrote itself skip frame parsing (it costs as much as the body).
        self._reader_prefix = single_object_header(self.reader.fingerprint)

    def header(self) -> bytes:
        """The frame prefix of written records (registers the writer on first use)."""
        if self._header is None:
            if self.registry is not None:
                self._header = confluent_header(self.registry.id_for(self.writer))
            else:
                self._header = single_object_header(self.writer.fingerprint)
        return self._header

    def encode(self, datum: Any) -> bytes:
        """Frame + Avro body of ``datum`` (dicts; unions of records as ``(name, dict)``).

        Raises:
            ValueEncodeError: ``datum`` does not fit the writer schema, or the compiled
                encoder failed on it (said as such: nothing is written then).
        """
        if self._enc is not None:
            head = self._header or self.header()
            try:
                return self._enc[0](head, datum)
            except Misfit as exc:  # outside the fast shape: fastavro writes it or says why
                self._misfit(exc)
            except Exception as exc:  # never answered with fastavro's bytes
                raise self._compiled_failed(datum, exc) from exc
        return self.encode_fastavro(datum)

    def encode_fastavro(self, datum: Any) -> bytes:
        """:meth:`encode` by fastavro alone (the reference the compiled encoder matches).

        Raises:
            ValueEncodeError: ``datum`` does not fit the writer schema.
        """
        out = io.BytesIO()
        out.write(self.header())
        try:
            schemaless_writer(out, self.writer.parsed, datum)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            raise ValueEncodeError(f"value does not fit {self.writer.label}: {exc}") from exc
        return out.getvalue()

    def _misfit(self, exc: Misfit) -> None:
        self.misfits += 1
        if self.misfits == 1:
            # DEBUG: a user's value may legitimately miss the fast shape (a defaulted
            # field left out); a CLI's one-line error must stay one line.
            log.debug(
                "a datum outside the compiled encoder's fast shape (%s) is encoded by "
                "fastavro (%s; logged once, AvroSerde.misfits counts them)",
                exc, self.writer.label,
            )  # fmt: skip

    def _compiled_failed(self, datum: Any, exc: Exception) -> ValueEncodeError:
        """The error for a failure of the compiled encoder other than a Misfit: fastavro
        is asked only to say whether the datum fits (its bytes are never used)."""
        failed = f"the compiled encoder raised {type(exc).__name__}: {exc}"
        try:
            self.encode_fastavro(datum)
        except ValueEncodeError as reference:
            return ValueEncodeError(f"{reference} ({failed})")
        return ValueEncodeError(
            f"{failed} on a value that fits {self.writer.label} (fastavro encodes it): a "
            "bug of agents_stream.serde.compiled; nothing written"
        )

    def decode(self, data: bytes) -> Any:
        """Decode a record written by any known writer into the reader's shape.

        Raises:
            ValueDecodeError: unknown framing, unknown fingerprint or schema id, a body
                that is truncated or has trailing bytes, or an unresolvable writer.
        """
        if self._dec is not None and data[:10] == self._reader_prefix:
            return self._decode_compiled(data, 10)
        try:
            frame = read_frame(data)
        except FramingError as exc:
            raise ValueDecodeError(str(exc)) from exc
        writer = self._writer_of(frame)
        if self._dec is not None and (
            writer is self.reader or writer.canonical == self.reader.canonical
        ):
            return self._decode_compiled(data, frame.body_offset)
        body = io.BytesIO(data)
        body.seek(frame.body_offset)
        # Skipping resolution when writer == reader is the hot path: it is much faster.
        reader = None if writer.canonical == self.reader.canonical else self.reader.parsed
        try:
            value = schemaless_reader(
                body,
                writer.parsed,
                reader,
                return_record_name=self.record_names,
                return_record_name_override=self.record_names,
            )
        except Exception as exc:  # fastavro raises EOF/Value/Index/Unicode/resolution errors
            raise ValueDecodeError(
                f"corrupt or unresolvable body ({writer.label} -> {self.reader.label}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if body.tell() != len(data):
            raise ValueDecodeError(f"{len(data) - body.tell()} trailing bytes after the body")
        return value

    def _decode_compiled(self, data: bytes, offset: int) -> Any:
        assert self._dec is not None
        if data.__class__ is not bytes:  # slices of a bytearray/memoryview are not bytes
            data = bytes(data)
        try:
            value, end = self._dec[1](data, offset)
        except Exception as exc:  # IndexError, struct.error, UnicodeDecodeError, Corrupt
            raise ValueDecodeError(
                f"corrupt body ({self.reader.label}): {type(exc).__name__}: {exc}"
            ) from exc
        if end != len(data):
            raise ValueDecodeError(f"{len(data) - end} trailing bytes after the body")
        return value

    def writer_of(self, data: bytes) -> Any:
        """The writer schema of a framed record (raises ValueDecodeError if unknown)."""
        try:
            frame = read_frame(data)
        except FramingError as exc:
            raise ValueDecodeError(str(exc)) from exc
        return self._writer_of(frame)

    def _writer_of(self, frame: Any) -> Any:
        if frame.kind == "single-object":
            writer = self._by_fingerprint.get(frame.fingerprint)
            if writer is None:
                raise ValueDecodeError(
                    f"unknown schema fingerprint {frame.fingerprint.hex()} (written by a newer "
                    "or foreign schema; deploy the schema version that wrote it)"
                )
            return writer
        if self.registry is None:
            raise ValueDecodeError(
                f"Confluent-framed record (schema id {frame.schema_id}) but no schema "
                "registry is configured"
            )
        try:
            found = self.registry.schema_for(frame.schema_id)
        except SchemaError as exc:
            raise ValueDecodeError(str(exc)) from exc
        # Prefer the local copy: it carries record type and version for messages.
        return self._by_fingerprint.get(found.fingerprint, found)


_COMPILED: weakref.WeakKeyDictionary[Any, dict[bool, tuple[Encoder, Decoder] | None]] = (
    weakref.WeakKeyDictionary()
)


def _compiled(schema: Any, record_names: bool) -> tuple[Encoder, Decoder] | None:
    # Once per schema version and shape: versions are shared, serdes are not. None: the
    # compiler declined the schema (logged by compile_schema); anything else raises.
    per_schema = _COMPILED.setdefault(schema, {})
    if record_names not in per_schema:
        try:
            compiled = compile_schema(schema.parsed, record_names=record_names)
        except SchemaError as exc:
            raise SchemaError(f"{getattr(schema, 'label', 'schema')}: {exc}") from exc
        per_schema[record_names] = compiled
    return per_schema[record_names]
