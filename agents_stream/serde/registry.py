"""Thin binding to a Confluent-compatible Schema Registry (``confluent_kafka.schema_registry``).

Where the registry comes from, for every command and host alike (later wins):
``App(schema_registry_url=)``, then ``$AGENTS_STREAM_SCHEMA_REGISTRY``, then the command's
``--schema-registry`` (:func:`resolve_registry_url`). Client settings (basic auth, TLS,
timeouts) are ``schema.registry.<setting>`` keys of the common Kafka client configuration
(``kafka/config.py``): ``App(kafka_config=)``, ``--kafka-config`` files and
``AGENTS_STREAM_KAFKA_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO``-style variables, so a secured
deployment is configured once and its secrets are redacted like the cluster's.
``schema.registry.auto.register.schemas=false`` makes writers look their schema up
instead of registering it.

One client per URL and settings per process, so a ``mock://`` registry (confluent-kafka's
in-process fake, for tests) is shared by every codec and command naming the same URL, as a
real registry would be. Schema ids are cached per process too: once the worker has
registered (or looked up) what it writes at start-up (``serde/startup.py``), records are
written without asking the registry again, so a rule changed under a running worker cannot
refuse them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from typing import Any

from ..kafka.config import common_config, redact_url, scrub, url_secrets
from .errors import RegistryError, RegistryUnavailable, SchemaError, SchemaRefused
from .schemas import SchemaVersion

REGISTRY_ENV = "AGENTS_STREAM_SCHEMA_REGISTRY"
SETTING_PREFIX = "schema.registry."
AUTO_REGISTER = "auto.register.schemas"
# A registry call never blocks a worker for long: confluent-kafka's client waits without
# limit by default, and retries a 5xx answer three times, up to 20 s apart.
_CLIENT_DEFAULTS: dict[str, Any] = {
    "timeout": 10,
    "max.retries": 2,
    "retries.wait.ms": 200,
    "retries.max.wait.ms": 2000,
}
# Settings confluent-kafka's client type-checks as numbers (files and variables give text).
_NUMERIC = ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
            "cache.latest.ttl.sec")  # fmt: skip

_clients: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
_ids: dict[tuple[str, str, bytes], int] = {}  # (url, subject, fingerprint) -> schema id
_schemas: dict[tuple[str, int], SchemaVersion] = {}  # (url, schema id) -> writer schema
_lock = threading.Lock()


def resolve_registry_url(override: str | None = None, app_url: str | None = None) -> str | None:
    """``--schema-registry`` > ``$AGENTS_STREAM_SCHEMA_REGISTRY`` > ``App(schema_registry_url)``."""
    return override or os.environ.get(REGISTRY_ENV) or app_url or None


def registry_settings() -> dict[str, Any]:
    """The ``schema.registry.*`` keys of the common client configuration, prefix stripped."""
    return {
        k[len(SETTING_PREFIX) :]: v
        for k, v in common_config().items()
        if k.startswith(SETTING_PREFIX) and k != SETTING_PREFIX + "url"
    }


def auto_register(default: bool = True) -> bool:
    """Whether writers register their schema (else they only look it up)."""
    value = registry_settings().get(AUTO_REGISTER)
    if value is None:
        return default
    return str(value).strip().lower() not in ("false", "0", "no", "off")


def describe(url: str) -> str:
    """The registry's URL, credentials redacted: for messages."""
    return redact_url(url)


def registry_client(url: str) -> Any:
    """The process-wide ``SchemaRegistryClient`` for ``url`` and the current settings.

    Raises:
        SchemaError: the schema-registry extras of confluent-kafka are not installed, or
            a ``schema.registry.*`` setting is refused (named, value withheld).
    """
    conf = dict(_CLIENT_DEFAULTS)
    for key, value in registry_settings().items():
        if key == AUTO_REGISTER:
            continue  # ours, not the client's
        if key in _NUMERIC and isinstance(value, str):
            try:
                value = float(value) if "." in value else int(value)
            except ValueError:
                raise SchemaError(f"schema.registry.{key} must be a number") from None
        conf[key] = value
    cache_key = (url, tuple(sorted((k, repr(v)) for k, v in conf.items())))
    with _lock:
        client = _clients.get(cache_key)
        if client is None:
            try:
                SchemaRegistryClient = _client_class()
            except ImportError as exc:
                raise SchemaError(
                    "a schema registry URL is set but confluent-kafka's schema registry "
                    f"client cannot be imported ({exc}); install agents-stream[registry]"
                ) from exc
            try:
                client = SchemaRegistryClient.new_client({"url": url, **conf})
            except (ValueError, TypeError, OSError) as exc:
                reason = scrub(str(exc), url_secrets(url))
                raise SchemaError(
                    f"schema registry {describe(url)}: client settings refused: {reason}; "
                    "fix the schema.registry.* settings"
                ) from exc
            _clients[cache_key] = client
            httpx_log = logging.getLogger("httpx")
            if httpx_log.level == logging.NOTSET:
                # One INFO line per registry request otherwise, in every worker's log.
                httpx_log.setLevel(logging.WARNING)
        return client


def _client_class() -> Any:
    # Its import pulls authlib in, which warns that its httpx module is deprecated: a
    # line on stderr of every command, in front of a stopping worker's one line.
    # authlib installs an "always" filter for its warnings when imported: import it
    # first, then ignore.
    with warnings.catch_warnings():
        try:
            import authlib.deprecate  # noqa: F401
        except ImportError:
            pass
        warnings.simplefilter("ignore")
        from confluent_kafka.schema_registry import SchemaRegistryClient
    return SchemaRegistryClient


def avro_schema(version: SchemaVersion) -> Any:
    """The registry ``Schema`` object of one version."""
    _client_class()
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(version.raw), "AVRO")


def registry_failure(
    exc: BaseException, *, url: str, subject: str | None, version: str, doing: str
) -> RegistryError:
    """``exc`` from a registry call as a :class:`RegistryError` in one line: the server's
    reason and HTTP status, or the transport error, credentials scrubbed.

    ``doing`` says what was asked ("register", "look up", "fetch").
    """
    status = getattr(exc, "http_status_code", None)
    reason = getattr(exc, "error_message", None) or str(exc) or type(exc).__name__
    reason = scrub(" ".join(str(reason).split()), url_secrets(url))
    where = f" under subject {subject!r}" if subject else ""
    if isinstance(status, int) and status > 0:
        said = f"{reason} (HTTP {status})"
        transient = status >= 500 or status in (408, 429)
    else:
        said = f"{type(exc).__name__}: {reason}"
        transient = True  # no answer: connection refused, timeout, DNS
    if transient:
        return RegistryUnavailable(
            f"schema registry {describe(url)} unavailable to {doing} {version}{where}: {said}",
            subject=subject,
            version=version,
            reason=said,
        )
    verb = "refused" if doing == "register" else f"could not {doing}"
    return SchemaRefused(
        f"schema registry {describe(url)} {verb} {version}{where}: {said}",
        subject=subject,
        version=version,
        reason=said,
    )


def ensure_registered(
    url: str,
    subject: str,
    version: SchemaVersion,
    *,
    register: bool = True,
    label: str | None = None,
) -> int:
    """The id of ``version`` under ``subject``: registered (idempotent) or, with
    ``register=False``, looked up; cached for the life of the process.

    ``label`` names the schema in messages (default ``version.label``).

    Raises:
        SchemaRefused: the registry refused it (its reason quoted), or does not hold it
            and ``register`` is off.
        RegistryUnavailable: no answer.
    """
    key = (url, subject, version.fingerprint)
    found = _ids.get(key)
    if found is not None:
        return found
    client = registry_client(url)
    try:
        if register:
            schema_id = int(client.register_schema(subject, avro_schema(version)))
        else:
            schema_id = int(client.lookup_schema(subject, avro_schema(version)).schema_id)
    except SchemaError:
        raise
    except Exception as exc:  # SchemaRegistryError or a transport error
        failure = registry_failure(
            exc,
            url=url,
            subject=subject,
            version=label or version.label,
            doing="register" if register else "look up",
        )
        found = _registered_meanwhile(client, subject, version) if register else None
        if found is None:
            raise failure from exc
        schema_id = found
    with _lock:
        _ids[key] = schema_id
        _schemas[(url, schema_id)] = version
    return schema_id


def _registered_meanwhile(client: Any, subject: str, version: SchemaVersion) -> int | None:
    """The id of ``version`` if the subject holds it after all, else None.

    Two workers starting together register the same schema at once; Apicurio answers the
    slower one 409 ("artifact ... already exists") although the schema is there. Asked
    only after a failed registration, so a real refusal costs one more request."""
    for attempt in range(3):  # the other registration may still be finishing
        if attempt:
            time.sleep(0.2)
        try:
            return int(client.lookup_schema(subject, avro_schema(version)).schema_id)
        except Exception:  # not there (or no answer): the registration's failure stands
            continue
    return None


def schema_by_id(url: str, schema_id: int) -> SchemaVersion:
    """The writer schema registered as ``schema_id`` (any subject), cached.

    Raises:
        SchemaError: the registry does not know the id (a bad record: dead-lettered).
        RegistryUnavailable: no answer (transient: never a reason to dead-letter).
    """
    found = _schemas.get((url, schema_id))
    if found is not None:
        return found
    try:
        schema = registry_client(url).get_schema(schema_id)
    except SchemaError:
        raise
    except Exception as exc:  # SchemaRegistryError or a transport error
        failure = registry_failure(
            exc, url=url, subject=None, version=f"schema id {schema_id}", doing="fetch"
        )
        if isinstance(failure, RegistryUnavailable):
            raise failure from exc
        raise SchemaError(f"schema id {schema_id} not found in registry: {failure.reason}") from exc
    if getattr(schema, "schema_type", "AVRO") not in (None, "AVRO"):
        raise SchemaError(f"schema id {schema_id} is a {schema.schema_type} schema, not Avro")
    version = SchemaVersion.from_raw(json.loads(schema.schema_str))
    with _lock:
        _schemas[(url, schema_id)] = version
    return version


def compatibility_verdict(url: str, subject: str, version: SchemaVersion) -> tuple[bool, str]:
    """Whether the registry would accept ``version`` under ``subject`` at the subject's
    compatibility level, and its reason when not (``verbose=true``: Confluent answers
    ``messages``, Apicurio ``reason``; confluent-kafka's client keeps only the boolean,
    so the request goes through its REST client). ``mock://`` judges nothing: True.

    Raises:
        RegistryError: the registry refused the request or did not answer.
    """
    if url.startswith("mock://"):
        return True, ""
    client = registry_client(url)
    try:
        answer = client._rest_client.post(
            f"compatibility/subjects/{_quote(subject)}/versions?verbose=true",
            body=avro_schema(version).to_dict(),
        )
    except Exception as exc:  # SchemaRegistryError or a transport error
        raise registry_failure(
            exc, url=url, subject=subject, version=version.label, doing="test"
        ) from exc
    if answer.get("is_compatible", False):
        return True, ""
    said = answer.get("messages") or answer.get("reason") or "no reason given"
    if isinstance(said, list):
        said = "; ".join(str(m) for m in said)
    return False, scrub(" ".join(str(said).split()), url_secrets(url))


def _quote(subject: str) -> str:
    from urllib.parse import quote

    return quote(subject, safe="")


class RegistryBinding:
    """Schema ids for one subject of one registry.

    Args:
        url: registry URL (``http://...`` or ``mock://name``).
        subject: subject writers register under (``<topic>-value`` by default).
        register: register a writer missing from the registry (default: the
            ``schema.registry.auto.register.schemas`` setting, on unless set false);
            False looks it up and refuses when it is not there.
    """

    def __init__(self, url: str, subject: str, *, register: bool | None = None) -> None:
        self.url = url
        self.subject = subject
        self.register = auto_register() if register is None else register

    def id_for(self, version: SchemaVersion) -> int:
        """The id of ``version`` under the subject (cached; see :func:`ensure_registered`)."""
        return ensure_registered(self.url, self.subject, version, register=self.register)

    def schema_for(self, schema_id: int) -> SchemaVersion:
        """The writer schema registered as ``schema_id`` (see :func:`schema_by_id`)."""
        return schema_by_id(self.url, schema_id)


def forget() -> None:
    """Drop the cached clients, ids and schemas (tests that restart a registry)."""
    with _lock:
        _clients.clear()
        _ids.clear()
        _schemas.clear()
