"""``agents-stream schemas``: check schema evolution, register versions in a registry.

``check`` verifies every record type under ``schemas/`` against the compatibility it
promises in ``schemas/compatibility.json`` (BACKWARD_TRANSITIVE at least) and exits 1
naming record type, version and field of each problem. ``register`` registers every
version, oldest first, under ``<topic>-value``, after checking it against what the
registry already holds for that subject.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..kafka.config import redact_url, scrub, url_secrets
from ..serde.compat import can_read, check_versions
from ..serde.errors import SchemaError
from ..serde.registry import avro_schema, registry_client
from ..serde.schemas import (
    JOURNAL_RECORD_TYPE,
    SchemaVersion,
    load_compatibility,
    load_versions,
    record_types,
    schemas_dir,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("schemas", help="check and register versioned Avro schemas")
    sub = parser.add_subparsers(dest="schemas_command", metavar="SUBCOMMAND", required=True)

    check = sub.add_parser("check", help="verify every version reads all older ones")
    _add_dir_arg(check)
    check.set_defaults(func=run_check)

    reg = sub.add_parser("register", help="register versions in a Schema Registry, in order")
    _add_dir_arg(reg)
    reg.add_argument("--registry", required=True, help="Schema Registry URL (mock:// for tests)")
    reg.add_argument(
        "--topic",
        default=None,
        help=f"topic of the {JOURNAL_RECORD_TYPE} records (subject <topic>-value); "
        "default: <record type>-value for every record type",
    )
    reg.set_defaults(func=run_register)


def _add_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=None, help="schemas directory (default: the repo's schemas/)"
    )


def run_check(args: argparse.Namespace) -> int:
    """Exit 0 when every record type keeps its promise, 1 otherwise."""
    root = args.dir or schemas_dir()
    try:
        failures = _check_dir(root)
    except SchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if failures else 0


def _check_dir(root: Path) -> int:
    promised = load_compatibility(root)
    failures = 0
    for name in record_types(root):
        versions = load_versions(name, root)
        mode = promised.get(name, "BACKWARD_TRANSITIVE")
        problems = check_versions(versions, mode)
        for problem in problems:
            print(f"FAIL {problem}", file=sys.stderr)
        failures += len(problems)
        if not problems:
            print(f"ok   {name} v1..v{len(versions)} ({mode})")
    return failures


def run_register(args: argparse.Namespace) -> int:
    """Register all versions in order; exit 1 at the first incompatible one."""
    root = args.dir or schemas_dir()
    try:
        if _check_dir(root):
            return 1
        client = registry_client(args.registry)
        names = [JOURNAL_RECORD_TYPE] if args.topic else record_types(root)
        for name in names:
            subject = f"{args.topic or name}-value"
            if not _register_lineage(client, args.registry, subject, load_versions(name, root)):
                return 1
    except SchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # SchemaRegistryError or transport errors: report, no trace
        message = scrub(str(exc), url_secrets(args.registry))
        print(f"error: schema registry {redact_url(args.registry)}: {message}", file=sys.stderr)
        return 1
    return 0


def _register_lineage(
    client: Any, url: str, subject: str, versions: tuple[SchemaVersion, ...]
) -> bool:
    for version in versions:
        existing = _registered(client, subject)
        if any(v.fingerprint == version.fingerprint for v in existing):
            print(f"ok   {subject}: {version.label} already registered")
            continue
        # Check against what the registry holds, not just our files: a subject may carry
        # versions registered by other tools or from an edited (re-released) file.
        for held in existing:
            problems = can_read(version, held)
            if problems:
                for problem in problems:
                    print(
                        f"FAIL {subject}: {version.label} vs registered schema: {problem}",
                        file=sys.stderr,
                    )
                return False
        if existing and not _registry_accepts(client, url, subject, version):
            print(
                f"FAIL {subject}: registry rejects {version.label} as incompatible", file=sys.stderr
            )
            return False
        schema_id = client.register_schema(subject, avro_schema(version))
        print(f"ok   {subject}: registered {version.label} as id {schema_id}")
    return True


def _registered(client: Any, subject: str) -> list[SchemaVersion]:
    try:
        numbers = client.get_versions(subject)
    except Exception:  # SchemaRegistryError 40401: subject not found
        return []
    held = []
    for number in numbers:
        found = client.get_version(subject, number)
        held.append(
            SchemaVersion.from_raw(
                json.loads(found.schema.schema_str), record_type=subject, version=number
            )
        )
    return held


def _registry_accepts(client: Any, url: str, subject: str, version: SchemaVersion) -> bool:
    """The registry's own verdict under the subject's configured compatibility.

    confluent-kafka's in-process ``mock://`` registry cannot judge compatibility; there
    the local fastavro check above is the whole check.
    """
    if url.startswith("mock://"):
        return True
    return bool(client.test_compatibility_all_versions(subject, avro_schema(version)))
