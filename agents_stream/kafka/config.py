"""librdkafka configurations: one client configuration for every Kafka client.

Layers, later wins: our defaults per client kind; the *common* client configuration
(security, client.id, timeouts), which is ``App(kafka_config=...)``, then a librdkafka
properties file (``--kafka-config PATH``), then ``AGENTS_STREAM_KAFKA_*`` environment
variables (``AGENTS_STREAM_KAFKA_SASL_PASSWORD`` -> ``sasl.password``); finally the
client-specific ``consumer_config``/``producer_config``. Every builder below applies the
common layer, so a cluster that needs SASL/TLS is configured once for the worker, its
cache-rebuild readers, the admin client, the CLI tools and the Spark jobs. Keys under
``schema.registry.`` in these layers configure the schema registry's client instead
(``serde/registry.py``) and are left out of every librdkafka configuration.

The common layer is process-wide (:func:`configure`): clients are built deep inside
stores and jobs, and a process talks to one cluster. Secrets never leave this module
unredacted: log and error text goes through :func:`redact`.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigurationError

ENV_PREFIX = "AGENTS_STREAM_KAFKA_"
CONFIG_FILE_ENV = "AGENTS_STREAM_KAFKA_CONFIG"  # the path; not itself a property
REDACTED = "[redacted]"
REGISTRY_PREFIX = "schema.registry."
_SECRET = re.compile(r"(password|secret|jaas|basic\.auth\.user\.info|key\.pem|token)", re.I)

_common: dict[str, Any] = {}
log = logging.getLogger("agents_stream.kafka")


def is_secret(key: str) -> bool:
    return bool(_SECRET.search(key))


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log: secret values replaced, callables shown by name."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if is_secret(key):
            out[key] = REDACTED
        elif callable(value) or isinstance(value, logging.Logger):
            out[key] = f"<{type(value).__name__}>"
        else:
            out[key] = value
    return out


def scrub(text: str, *confs: Mapping[str, Any]) -> str:
    """``text`` with every secret value of the common layer and ``confs`` replaced: for
    messages that may quote a setting back (librdkafka's "Invalid value ...")."""
    for conf in (common_config(), *confs):
        for key, value in conf.items():
            if is_secret(key) and isinstance(value, str) and len(value) >= 3:
                text = text.replace(value, REDACTED)
    return text


def redact_url(url: str) -> str:
    """``https://user:pass@host`` -> ``https://user:[redacted]@host`` (registry URLs may
    carry basic-auth credentials)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:{REDACTED}@{parts.hostname}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def url_secrets(url: str | None) -> dict[str, str]:
    """The password of a URL as a secret setting, for :func:`scrub`."""
    password = urlsplit(url).password if url else None
    return {"url.password": password} if password else {}


def read_properties(path: str | Path) -> dict[str, str]:
    """A librdkafka/Java-style properties file: ``key=value`` lines, ``#``/``!`` comments."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read Kafka client config {path}: {exc.strerror}; fix --kafka-config"
        ) from exc
    conf: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            # The line may hold a secret: name its number, never its text.
            raise ConfigurationError(f"{path}:{n}: expected key=value; fix --kafka-config")
        conf[key.strip()] = value.strip()
    return conf


def env_properties(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``AGENTS_STREAM_KAFKA_SASL_MECHANISM`` -> ``sasl.mechanism`` (``__`` for a literal
    ``_``, as in ``AGENTS_STREAM_KAFKA_LOG__LEVEL`` -> ``log_level``)."""
    environ = os.environ if environ is None else environ
    conf: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and name != CONFIG_FILE_ENV:
            key = name[len(ENV_PREFIX) :].lower().replace("__", "\0").replace("_", ".")
            conf[key.replace("\0", "_")] = value
    return conf


def configure(
    app_config: Mapping[str, Any] | None = None, config_file: str | Path | None = None
) -> dict[str, Any]:
    """Set the process-wide common client configuration; returns it (environment included).

    ``config_file`` defaults to ``$AGENTS_STREAM_KAFKA_CONFIG``.
    """
    conf: dict[str, Any] = dict(app_config or {})
    path = config_file or os.environ.get(CONFIG_FILE_ENV)
    if path:
        conf.update(read_properties(path))
    _common.clear()
    _common.update(conf)
    return common_config()


def common_config() -> dict[str, Any]:
    """The common layer as it applies now: :func:`configure`'s, then the environment."""
    conf = dict(_common)
    conf.update(env_properties())
    return conf


def _layered(
    kind: str, defaults: dict[str, Any], bootstrap: str, overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    conf = defaults
    conf.update(common_config())
    conf.update(overrides or {})
    for key in [k for k in conf if k.startswith(REGISTRY_PREFIX)]:
        # Settings of the schema registry's client (serde/registry.py) share the layers;
        # librdkafka refuses properties it does not know.
        del conf[key]
    conf["bootstrap.servers"] = bootstrap
    conf.setdefault("logger", rdkafka_logger())
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s client config: %s", kind, redact(conf))
    return conf


def consumer_config(
    bootstrap: str, group_id: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "group.id": group_id,
        # Offsets are committed by the worker only once every action of a record is done.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # A short session makes failover (and group joins) take seconds, not tens of them.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1500,
        # Incremental rebalancing: a member joining or dying moves only the partitions
        # that change owner; the others keep processing through the rebalance instead of
        # all being revoked, committed and rebuilt (librdkafka cannot mix it with the
        # eager range/roundrobin in one group: see docs/operations.md before upgrading).
        "partition.assignment.strategy": "cooperative-sticky",
        "max.poll.interval.ms": 300000,
        "log_level": 3,
    }
    return _layered("consumer", conf, bootstrap, overrides)


def producer_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        # Idempotence keeps per-partition order across retries: an ActionDone is never
        # durable unless the call results before it are.
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        # Same key -> same partition as Java clients and Kafka Streams.
        "partitioner": "murmur2_random",
        "log_level": 3,
    }
    return _layered("producer", conf, bootstrap, overrides)


def transactional_config(conf: dict[str, Any], transactional_id: str) -> dict[str, Any]:
    """``conf`` (a producer's) for the transactional producer of an exactly-once worker.

    ``transaction.timeout.ms`` 10 s (Kafka Streams' choice for exactly-once) unless set:
    a worker that dies mid-transaction holds back every ``read_committed`` reader of the
    partitions it wrote (downstream consumers, the next owner's cache rebuild) until the
    broker aborts its transaction, which it does after this long."""
    out = dict(conf)
    out["transactional.id"] = transactional_id
    out.setdefault("transaction.timeout.ms", 10_000)
    # Transactions need the idempotent producer; a user setting cannot turn it off here.
    out["enable.idempotence"] = True
    out["acks"] = "all"
    return out


def delivery_timeout_ms(conf: dict[str, Any]) -> int | None:
    """How long a producer with ``conf`` keeps trying to deliver a record, in ms (None:
    forever). librdkafka's ``delivery.timeout.ms`` (alias ``message.timeout.ms``),
    default 300000; 0 means no limit."""
    value = conf.get("delivery.timeout.ms", conf.get("message.timeout.ms", 300_000))
    ms = int(value)
    return None if ms <= 0 else ms


def reader_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A group-less consumer for replaying a topic (cache rebuild, inspection)."""
    import uuid

    conf: dict[str, Any] = {
        "group.id": f"agents-stream-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52428800,
        # librdkafka backs off 1 s between fetches once its queue is full; replay wants
        # the next fetch right away.
        "fetch.queue.backoff.ms": 10,
        # The end of a partition is learned from a fetch answered empty, which the broker
        # holds this long (default 500 ms): a caught-up cache took 0.5 s per assignment.
        "fetch.wait.max.ms": 10,
        # librdkafka's default, said here: records of aborted transactions (an
        # exactly-once worker's that died) are never read back as if they had happened.
        "isolation.level": "read_committed",
        "log_level": 3,
    }
    return _layered("reader", conf, bootstrap, overrides)


def admin_config(bootstrap: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return _layered("admin", {"log_level": 3}, bootstrap, overrides)


# -- librdkafka's own log -------------------------------------------------------------------
_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")
_NUMBERS = re.compile(r"\d+")


class _Deduplicate(logging.Filter):
    """Lets one of each librdkafka message through per ``window`` seconds: a broker that
    is down makes every client repeat the same connect error several times a second."""

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # "FAIL [rdkafka#consumer-3] [thrd:...]: <text>": the client name varies too.
        key = _NUMBERS.sub("#", _SUPPRESSED.sub("", message.split("]: ", 1)[-1]))
        now = time.monotonic()
        if now - self._seen.get(key, -self.window) < self.window:
            return False
        self._seen[key] = now
        if len(self._seen) > 1000:
            self._seen.clear()
        return True


class _Severity(logging.Filter):
    """CRITICAL in a worker's log means the worker stops (one line, exit code 1). What
    librdkafka calls fatal is a client's state, which the worker handles: a fenced
    transactional producer (a frozen worker waking up, a producer replaced after a call
    blocked) is replaced, and the worker says so in a WARNING of its own. So a client's
    "fenced" lines are WARNING, and its other lines above ERROR are ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.ERROR:
            level = logging.WARNING if "fenced" in record.getMessage() else logging.ERROR
            record.levelno, record.levelname = level, logging.getLevelName(level)
        return True


def rdkafka_logger() -> logging.Logger:
    """``agents_stream.librdkafka``: where every client's librdkafka log goes (its lines
    reach Python logging on the client's poll/consume calls)."""
    logger = logging.getLogger("agents_stream.librdkafka")
    if not any(isinstance(f, _Deduplicate) for f in logger.filters):
        logger.addFilter(_Severity())
        logger.addFilter(_Deduplicate())
    return logger
