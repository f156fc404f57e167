"""Schema evolution checks: can one version read another?

Two complementary checks per (reader, writer) pair, because neither is enough alone:

* field level (static): every field the reader has and the writer lacks needs a
  default, and a reader enum must know every writer symbol. This names the field.
* fastavro resolution (dynamic): records generated from the writer schema are read with
  the reader schema, which catches type changes the static walk does not model.

BACKWARD means a newer reader reads older writers; FORWARD the reverse. Transitive
modes check every pair, not just neighbours.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.utils import generate_many

from .schemas import SchemaVersion

MODES = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
_SAMPLES = 25


@dataclass(frozen=True)
class Incompatibility:
    """One reason ``reader`` cannot read ``writer``."""

    record_type: str
    reader_version: int
    writer_version: int
    direction: str  # "BACKWARD" or "FORWARD"
    field: str | None
    reason: str

    def __str__(self) -> str:
        where = f" field {self.field}" if self.field else ""
        return (
            f"{self.record_type} v{self.reader_version}{where}: {self.direction} "
            f"incompatible (v{self.reader_version} cannot read v{self.writer_version}): "
            f"{self.reason}"
        )


def check_versions(versions: Sequence[SchemaVersion], mode: str) -> list[Incompatibility]:
    """Check the lineage ``versions`` (oldest first) for ``mode``.

    BACKWARD_TRANSITIVE is always checked (every released version stays readable);
    FORWARD pairs are added when ``mode`` promises them.
    """
    mode = mode.upper()
    problems: list[Incompatibility] = []
    forward = mode.startswith(("FORWARD", "FULL"))
    forward_transitive = mode in ("FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
    for j, newer in enumerate(versions):
        for i, older in enumerate(versions[:j]):
            problems += can_read(newer, older, direction="BACKWARD")
            if forward and (forward_transitive or i == j - 1):
                problems += can_read(older, newer, direction="FORWARD")
    return problems


def can_read(
    reader: SchemaVersion, writer: SchemaVersion, *, direction: str = "BACKWARD"
) -> list[Incompatibility]:
    """Reasons ``reader`` cannot read data written with ``writer`` (empty: compatible)."""

    def problem(field: str | None, reason: str) -> Incompatibility:
        return Incompatibility(
            reader.record_type or writer.record_type,
            reader.version,
            writer.version,
            direction,
            field,
            reason,
        )

    problems = [problem(f, r) for f, r in _field_problems(reader.raw, writer.raw)]
    if problems:
        return problems  # resolution would only repeat them, less precisely
    reason = _resolution_problem(reader, writer)
    return [problem(None, reason)] if reason else []


def _field_problems(reader: Any, writer: Any) -> Iterator[tuple[str, str]]:
    writer_types = dict(_named_types(writer))
    for name, rtype in _named_types(reader):
        wtype = writer_types.get(name)
        if wtype is None:
            continue  # a type only the reader has is reached via a defaulted field
        short = name.rpartition(".")[2]
        if rtype["type"] == "record" and wtype["type"] == "record":
            written = {f["name"] for f in wtype["fields"]}
            for field in rtype["fields"]:
                known = {field["name"], *field.get("aliases", ())}
                if not known & written and "default" not in field:
                    yield f"{short}.{field['name']}", "added without a default"
        elif rtype["type"] == "enum" and wtype["type"] == "enum":
            missing = set(wtype["symbols"]) - set(rtype["symbols"])
            if missing and "default" not in rtype:
                yield short, f"enum lacks writer symbols {sorted(missing)} and has no default"


def _named_types(schema: Any, namespace: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named record/enum in ``schema`` as ``(full name, definition)``."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _named_types(branch, namespace)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        name = schema["name"]
        namespace = schema.get("namespace", namespace) if "." not in name else ""
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        if "." in name:
            namespace = name.rpartition(".")[0]
        yield full, schema
        for field in schema.get("fields", ()):
            yield from _named_types(field["type"], namespace)
    elif kind == "array":
        yield from _named_types(schema["items"], namespace)
    elif kind == "map":
        yield from _named_types(schema["values"], namespace)
    elif isinstance(kind, dict | list):
        yield from _named_types(kind, namespace)


def _resolution_problem(reader: SchemaVersion, writer: SchemaVersion) -> str | None:
    """Read generated writer records with the reader; the first failure, if any."""
    try:
        samples = list(generate_many(writer.parsed, _SAMPLES))
    except Exception:  # generation is best effort: the static check already ran
        return None
    for sample in samples:
        buf = io.BytesIO()
        schemaless_writer(buf, writer.parsed, sample)
        buf.seek(0)
        try:
            schemaless_reader(buf, writer.parsed, reader.parsed)
        except Exception as exc:  # SchemaResolutionError and friends
            return f"fastavro schema resolution failed: {exc}"
    return None
