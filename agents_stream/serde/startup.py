"""Schemas registered at start-up: a registry's refusal is a configuration error.

A host calls :func:`register_app_schemas` once, before it takes partitions: every schema
the App will *write* through the registry (the newest ActionState version under
``<app id>-action-state-value``; each agent's Avro output schema under its subject) is
registered, or looked up when ``schema.registry.auto.register.schemas`` is false. The ids
land in the process-wide cache of ``serde/registry.py``, so records are written without
asking the registry again.

Why here and not at the first write: a refused schema (incompatible with what the subject
holds), an unreachable registry or a subject missing with auto-registration off would
otherwise fail every record alike, and a record that fails goes to the DLQ. Here it stops
the host before anything is consumed, dead-lettered or committed, with one line naming the
subject, the version and the server's reason (:class:`~.errors.SchemaRefused`,
:class:`~.errors.RegistryUnavailable`).

Input schemas are not registered: the worker only reads them, and records name their
writer schema by id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .registry import auto_register, describe, ensure_registered
from .schemas import JOURNAL_RECORD_TYPE, SchemaVersion, load_versions
from .subjects import value_subject
from .values import load_value_schema

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("agents_stream.serde")


@dataclass(frozen=True)
class WriterSchema:
    """One schema a host writes through the registry."""

    subject: str
    schema: SchemaVersion
    what: str  # for messages: "ActionState v6", "output schema Score of agent Scoring"


@dataclass(frozen=True)
class Registered:
    subject: str
    what: str
    schema_id: int


def writer_schemas(app: App) -> list[WriterSchema]:
    """Every schema ``app``'s worker writes through a registry (no I/O)."""
    found: list[WriterSchema] = []
    if app.agents:
        journal = load_versions(JOURNAL_RECORD_TYPE)[-1]
        found.append(WriterSchema(f"{app.action_state_topic}-value", journal, journal.label))
    for binding in app.agents:
        if binding.output and binding.output_schema is not None:
            schema = load_value_schema(binding.output_schema)
            subject = value_subject(binding.output, schema.raw, app.subject_name_strategy)
            name = schema.raw.get("name", "") if isinstance(schema.raw, dict) else ""
            what = f"output schema {name} of agent {binding.name}".replace("  ", " ")
            found.append(WriterSchema(subject, schema, what))
    return found


def register_app_schemas(
    app: App, url: str | None = None, *, register: bool | None = None
) -> list[Registered]:
    """Register (or look up) every schema of :func:`writer_schemas`; nothing without a
    registry.

    Args:
        url: the registry (default ``app.schema_registry_url``).
        register: False looks schemas up only (default: the
            ``schema.registry.auto.register.schemas`` setting, on unless false).

    Raises:
        SchemaRefused: a schema refused, or missing with registration off; the message
            names subject, version and the server's reason.
        RegistryUnavailable: the registry did not answer.
    """
    url = url or app.schema_registry_url
    if not url:
        return []
    register = auto_register() if register is None else register
    done = []
    for writer in writer_schemas(app):
        schema_id = ensure_registered(
            url, writer.subject, writer.schema, register=register, label=writer.what
        )
        done.append(Registered(writer.subject, writer.what, schema_id))
    if done:
        log.info(
            "schema registry %s: %s %s",
            describe(url),
            "registered" if register else "found",
            ", ".join(f"{r.what} as id {r.schema_id} ({r.subject})" for r in done),
        )
    return done
