"""The versioned schema files under ``schemas/``: loading, fingerprints, lookup tables.

Layout: ``schemas/<RecordType>/v<N>.avsc``, one file per released version, never edited
once released (a change is a new version), plus ``schemas/compatibility.json`` naming
the compatibility each record type promises. Schemas are read from the repository at
run time so that the files the compatibility checker validates are exactly the ones the
codecs use; ``AGENTS_STREAM_SCHEMAS_DIR`` points elsewhere (tests, deployments).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from .errors import SchemaError

SCHEMAS_DIR_ENV = "AGENTS_STREAM_SCHEMAS_DIR"
JOURNAL_RECORD_TYPE = "ActionState"
_VERSION_FILE = re.compile(r"^v(\d+)\.avsc$")


@dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One released version of one record type, parsed once and shared.

    Attributes:
        record_type: folder name under ``schemas/`` (e.g. ``ActionState``).
        version: the ``N`` of ``vN.avsc``; 0 for schemas that are not from the folder
            (a user's value schema, a writer schema fetched from a registry).
        raw: the schema as JSON data.
        parsed: fastavro's parsed form, what the reader and writer take.
        canonical: Parsing Canonical Form (what fingerprints and registries compare).
        fingerprint: 8-byte CRC-64-AVRO of ``canonical``, in single-object byte order.
    """

    record_type: str
    version: int
    raw: Any
    parsed: Any
    canonical: str
    fingerprint: bytes

    @classmethod
    def from_raw(cls, raw: Any, *, record_type: str = "", version: int = 0) -> SchemaVersion:
        """Parse ``raw`` (JSON data of an Avro schema).

        Raises:
            SchemaError: the schema is not valid Avro.
        """
        try:
            # A fresh named-types dict per schema: versions redefine the same names.
            parsed = parse_schema(raw, named_schemas={})
            canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:  # fastavro raises several unrelated types here
            where = f"{record_type} v{version}" if record_type else "schema"
            raise SchemaError(f"{where} is not a valid Avro schema: {exc}") from exc
        # fastavro already renders the CRC-64 in the little-endian order the
        # single-object encoding puts on the wire.
        fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
        return cls(record_type, version, raw, parsed, canonical, fp)

    @property
    def label(self) -> str:
        return f"{self.record_type or 'schema'} v{self.version}"


def schemas_dir() -> Path:
    """Where schema folders live: ``$AGENTS_STREAM_SCHEMAS_DIR``, else the copy a wheel
    carries (``agents_stream/_schemas``, see setup.py), else the repo's ``schemas/``."""
    override = os.environ.get(SCHEMAS_DIR_ENV)
    if override:
        return Path(override)
    packaged = Path(__file__).resolve().parents[1] / "_schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "schemas"


def record_types(root: Path | None = None) -> list[str]:
    """Names of the record-type folders, sorted."""
    base = root or schemas_dir()
    if not base.is_dir():
        raise SchemaError(f"schemas directory {base} does not exist (set {SCHEMAS_DIR_ENV})")
    return sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("v*.avsc")))


def load_versions(record_type: str, root: Path | None = None) -> tuple[SchemaVersion, ...]:
    """All released versions of ``record_type``, oldest first (cached per directory).

    Raises:
        SchemaError: the folder is missing, empty, has a gap in its numbering, or a file
            is not valid Avro.
    """
    return _load_versions(str((root or schemas_dir()).resolve()), record_type)


@cache
def _load_versions(root: str, record_type: str) -> tuple[SchemaVersion, ...]:
    folder = Path(root) / record_type
    files: dict[int, Path] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = _VERSION_FILE.match(path.name)
            if match:
                files[int(match.group(1))] = path
    if not files:
        raise SchemaError(f"no schema versions for {record_type!r} in {folder}")
    numbers = sorted(files)
    if numbers != list(range(1, len(numbers) + 1)):
        raise SchemaError(f"{record_type} versions must be v1..vN without gaps; found {numbers}")
    versions = []
    for number in numbers:
        try:
            raw = json.loads(files[number].read_text())
        except (OSError, ValueError) as exc:
            raise SchemaError(f"cannot read {files[number]}: {exc}") from exc
        versions.append(SchemaVersion.from_raw(raw, record_type=record_type, version=number))
    return tuple(versions)


def load_compatibility(root: Path | None = None) -> dict[str, str]:
    """Promised compatibility per record type (``BACKWARD_TRANSITIVE`` when unstated)."""
    path = (root or schemas_dir()) / "compatibility.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SchemaError(f"{path} is not valid JSON: {exc}") from exc
    return {
        name: str(spec.get("compatibility", "BACKWARD_TRANSITIVE")).upper()
        for name, spec in data.items()
        if isinstance(spec, dict)
    }
