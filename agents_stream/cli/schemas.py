"""``agents-stream schemas``: check schema evolution, register versions in a registry.

``check`` verifies every record type under ``schemas/`` against the compatibility it
promises in ``schemas/compatibility.json`` (BACKWARD_TRANSITIVE at least) and exits 1
naming record type, version and field of each problem; with ``--registry`` it also asks
the registry whether it would accept the newest version, printing the server's reason
when not. ``register`` registers every version, oldest first, under ``<topic>-value``,
after checking it against what the registry already holds for that subject (locally and
by the registry's verdict); ``--compatibility`` sets the subject's level first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..serde.compat import can_read, check_versions
from ..serde.errors import RegistryError, SchemaError
from ..serde.registry import (
    REGISTRY_ENV,
    compatibility_verdict,
    describe,
    ensure_registered,
    registry_client,
    registry_failure,
)
from ..serde.schemas import (
    JOURNAL_RECORD_TYPE,
    SchemaVersion,
    load_compatibility,
    load_versions,
    record_types,
    schemas_dir,
)

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
          "FULL_TRANSITIVE")  # fmt: skip


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schemas",
        help="check and register versioned Avro schemas",
        description=(
            "The versioned Avro schemas of the journal's record types (schemas/<type>/"
            "vN.avsc): check that every version reads the older ones, register them in a "
            "Schema Registry."
        ),
    )
    sub = parser.add_subparsers(dest="schemas_command", metavar="SUBCOMMAND", required=True)

    check = sub.add_parser(
        "check",
        help="verify every version reads all older ones (and, with --registry, that the "
        "registry accepts the newest: its reason printed when not)",
        description=(
            "Verify that every version of each record type reads all older ones (schema "
            "resolution), and with --registry that the registry accepts the newest under "
            "its compatibility level (its reason printed when not). Exit 1 on any failure."
        ),
    )
    _add_dir_arg(check)
    check.add_argument(
        "--registry",
        default=None,
        help=f"also ask this Schema Registry (default: ${REGISTRY_ENV} if set)",
    )
    _add_topic_arg(check)
    check.set_defaults(func=run_check)

    reg = sub.add_parser(
        "register",
        help="register versions in a Schema Registry, in order",
        description=(
            "Register every version of each record type in a Schema Registry, oldest "
            "first, under <topic>-value (--topic) or <record type>-value; with "
            "--compatibility, set the subject's level first."
        ),
    )
    _add_dir_arg(reg)
    reg.add_argument(
        "--registry",
        default=None,
        help=f"Schema Registry URL (default ${REGISTRY_ENV}; mock:// for tests)",
    )
    _add_topic_arg(reg)
    reg.add_argument(
        "--compatibility",
        type=str.upper,
        choices=LEVELS,
        default=None,
        help="set the subject's compatibility level first (default: leave it; the "
        "registry's global level applies)",
    )
    reg.set_defaults(func=run_register)


def _add_topic_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        default=None,
        help=f"topic of the {JOURNAL_RECORD_TYPE} records (subject <topic>-value); "
        "default: <record type>-value for every record type",
    )


def _add_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=None, help="schemas directory (default: the repo's schemas/)"
    )


def run_check(args: argparse.Namespace) -> int:
    """Exit 0 when every record type keeps its promise (and the registry, if given,
    accepts each newest version), 1 otherwise."""
    root = args.dir or schemas_dir()
    url = args.registry or os.environ.get(REGISTRY_ENV)
    try:
        failures = _check_dir(root)
        if url:
            for name in _names(args, root):
                failures += _check_registry(url, _subject(args, name), load_versions(name, root))
    except (SchemaError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 1 if failures else 0


def _names(args: argparse.Namespace, root: Path) -> list[str]:
    return [JOURNAL_RECORD_TYPE] if args.topic else record_types(root)


def _subject(args: argparse.Namespace, name: str) -> str:
    return f"{args.topic or name}-value"


def _check_registry(url: str, subject: str, versions: tuple[SchemaVersion, ...]) -> int:
    """1 when the registry would refuse the newest version under ``subject`` (its
    reason printed), else 0 (a subject it does not hold yet accepts anything)."""
    newest = versions[-1]
    held = _registered(registry_client(url), subject)
    if any(v.fingerprint == newest.fingerprint for v in held):
        print(f"ok   {subject}: {newest.label} registered in {describe(url)}")
        return 0
    if not held:
        print(f"ok   {subject}: not in {describe(url)} yet (register accepts {newest.label})")
        return 0
    accepted, reason = compatibility_verdict(url, subject, newest)
    if accepted:
        print(f"ok   {subject}: {describe(url)} accepts {newest.label}")
        return 0
    print(
        f"FAIL {subject}: {describe(url)} rejects {newest.label} as incompatible: {reason}",
        file=sys.stderr,
    )
    return 1


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
    url = args.registry or os.environ.get(REGISTRY_ENV)
    if not url:
        print(f"error: no registry: pass --registry URL or set {REGISTRY_ENV}", file=sys.stderr)
        return 1
    try:
        if _check_dir(root):
            return 1
        client = registry_client(url)
        for name in _names(args, root):
            subject = _subject(args, name)
            if args.compatibility:
                client.set_compatibility(subject, args.compatibility)
                print(f"ok   {subject}: compatibility {args.compatibility}")
            if not _register_lineage(client, url, subject, load_versions(name, root)):
                return 1
    except (SchemaError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # SchemaRegistryError or transport errors: report, no trace
        message = str(registry_failure(exc, url=url, subject=None, version="", doing="call"))
        print(f"error: {message}", file=sys.stderr)
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
        if existing:
            accepted, reason = compatibility_verdict(url, subject, version)
            if not accepted:
                print(
                    f"FAIL {subject}: registry rejects {version.label} as incompatible: {reason}",
                    file=sys.stderr,
                )
                return False
        schema_id = ensure_registered(url, subject, version)
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
