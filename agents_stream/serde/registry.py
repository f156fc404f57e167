"""Thin binding to a Confluent Schema Registry (``confluent_kafka.schema_registry``).

One client per URL per process, so a ``mock://`` registry (confluent-kafka's in-process
fake, for tests) is shared by every codec and CLI command that names the same URL, as a
real registry would be. Nothing talks to the registry until a record needs it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from .errors import SchemaError
from .schemas import SchemaVersion

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def registry_client(url: str) -> Any:
    """The process-wide ``SchemaRegistryClient`` for ``url`` (``mock://...`` is in-memory).

    Raises:
        SchemaError: the schema-registry extras of confluent-kafka are not installed.
    """
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:
                raise SchemaError(
                    "a schema registry URL is set but confluent-kafka's schema registry "
                    f"client cannot be imported ({exc}); install agents-stream[registry]"
                ) from exc
            client = SchemaRegistryClient.new_client({"url": url})
            _clients[url] = client
        return client


def avro_schema(version: SchemaVersion) -> Any:
    """The registry ``Schema`` object of one version."""
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(version.raw), "AVRO")


class RegistryBinding:
    """Schema ids for one subject: registered lazily on first write, cached both ways.

    Args:
        url: registry URL (``http://...`` or ``mock://name``).
        subject: subject writers register under (``<topic>-value``).
    """

    def __init__(self, url: str, subject: str) -> None:
        self.url = url
        self.subject = subject
        self._ids: dict[bytes, int] = {}
        self._schemas: dict[int, SchemaVersion] = {}
        self._lock = threading.Lock()

    def id_for(self, version: SchemaVersion) -> int:
        """Register ``version`` under the subject (idempotent) and return its id."""
        schema_id = self._ids.get(version.fingerprint)
        if schema_id is None:
            with self._lock:
                schema_id = registry_client(self.url).register_schema(
                    self.subject, avro_schema(version)
                )
                self._ids[version.fingerprint] = schema_id
                self._schemas[schema_id] = version
        return schema_id

    def schema_for(self, schema_id: int) -> SchemaVersion:
        """The writer schema registered as ``schema_id`` (any subject).

        Raises:
            SchemaError: the registry does not know the id or is unreachable.
        """
        version = self._schemas.get(schema_id)
        if version is None:
            try:
                found = registry_client(self.url).get_schema(schema_id)
            except SchemaError:
                raise
            except Exception as exc:  # SchemaRegistryError or a transport error
                raise SchemaError(f"schema id {schema_id} not found in registry: {exc}") from exc
            version = SchemaVersion.from_raw(json.loads(found.schema_str))
            with self._lock:
                self._schemas[schema_id] = version
        return version
