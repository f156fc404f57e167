"""``kafka.*`` options under the Java client's names, translated to librdkafka's.

Spark hands its ``kafka.*`` options to Kafka's Java consumer, so Spark users write the
Java client's names (``kafka.fetch.max.wait.ms``, ``kafka.sasl.jaas.config``...). This
source reads with librdkafka, whose names mostly agree but not everywhere. Each Java name
is taken one of three ways:

- the same name in librdkafka (``fetch.min.bytes``, ``isolation.level``,
  ``security.protocol``...) or an alias librdkafka accepts (``sasl.mechanism``,
  ``max.partition.fetch.bytes``): passed through;
- a librdkafka setting with the same meaning under another name, or a Java value that
  librdkafka spells differently: translated (:data:`RENAMED`, :func:`translate`);
- no librdkafka counterpart: refused in one line that names the librdkafka setting or
  source option to use instead (:data:`REFUSED`). Dropping them silently would read with
  other settings than the user wrote.

Names that are neither (librdkafka's own, or misspelt) reach librdkafka, whose refusal
:func:`config_error` turns into the same kind of line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException

from .errors import KafkaSourceOptionError

__all__ = ["REFUSED", "RENAMED", "config_error", "translate"]

_PREFIX = "kafka."

RENAMED: Mapping[str, str] = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    # librdkafka takes request.timeout.ms from a consumer and ignores it (a producer
    # setting there); the consumer's request timeout is socket.timeout.ms.
    "request.timeout.ms": "socket.timeout.ms",
    "ssl.truststore.certificates": "ssl.ca.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
    "ssl.keystore.key": "ssl.key.pem",
}
"""Java consumer name -> librdkafka name of the same setting."""

_PEM_CA = "librdkafka reads CA certificates as PEM: use kafka.ssl.ca.location (a PEM file)"
_OPENSSL = "a JVM security setting; librdkafka uses OpenSSL: remove it"
_METRICS = "a Java client metrics setting; librdkafka's statistics: kafka.statistics.interval.ms"
_OAUTH = (
    "a Java class; librdkafka's OAUTHBEARER is configured with kafka.sasl.oauthbearer.method=oidc "
    "and kafka.sasl.oauthbearer.* settings"
)
_DESERIALIZER = (
    "is not supported (nor by Spark's source): key and value are read as bytes; decode them "
    "with DataFrame operations"
)

REFUSED: Mapping[str, str] = {
    "key.deserializer": _DESERIALIZER,
    "value.deserializer": _DESERIALIZER,
    "interceptor.classes": "is not supported (nor by Spark's source): records read are immutable",
    "default.api.timeout.ms": (
        "has no librdkafka equivalent; the source's own timeout is the option "
        "kafkaConsumer.pollTimeoutMs"
    ),
    "exclude.internal.topics": (
        "has no librdkafka equivalent; subscribePattern leaves internal topics out, as Spark's "
        "source does: remove it"
    ),
    "socket.connection.setup.timeout.max.ms": (
        "has no librdkafka equivalent; librdkafka has one setting: "
        "kafka.socket.connection.setup.timeout.ms"
    ),
    "ssl.truststore.location": f"has no librdkafka equivalent; {_PEM_CA}",
    "ssl.truststore.password": f"has no librdkafka equivalent; {_PEM_CA}",
    "ssl.truststore.type": f"has no librdkafka equivalent; {_PEM_CA}",
    "ssl.keystore.type": (
        "has no librdkafka equivalent; librdkafka's kafka.ssl.keystore.location is a PKCS#12 "
        "file; for PEM use kafka.ssl.certificate.location and kafka.ssl.key.location"
    ),
    "ssl.protocol": "has no librdkafka equivalent (OpenSSL negotiates the version): remove it",
    "ssl.enabled.protocols": (
        "has no librdkafka equivalent (OpenSSL negotiates the version): remove it"
    ),
    "ssl.provider": f"is {_OPENSSL}",
    "ssl.keymanager.algorithm": f"is {_OPENSSL}",
    "ssl.trustmanager.algorithm": f"is {_OPENSSL}",
    "ssl.secure.random.implementation": f"is {_OPENSSL}",
    "ssl.engine.factory.class": f"is {_OPENSSL} (an OpenSSL engine: kafka.ssl.engine.location)",
    "security.providers": f"is {_OPENSSL}",
    "sasl.login.class": f"is {_OAUTH}",
    "sasl.login.callback.handler.class": f"is {_OAUTH}",
    "sasl.client.callback.handler.class": f"is {_OAUTH}",
    "metric.reporters": f"is {_METRICS}",
    "metrics.num.samples": f"is {_METRICS}",
    "metrics.sample.window.ms": f"is {_METRICS}",
    "metrics.recording.level": f"is {_METRICS}",
    "auto.include.jmx.reporter": f"is {_METRICS}",
}
"""Java consumer name -> why it is refused and what to write instead."""

_ASSIGNORS = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}

# `<LoginModule class> required key="value" ...;` as the Java client reads it.
_JAAS = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*$", re.S)
_JAAS_ITEM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+))')
_CREDENTIAL_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)


def translate(conf: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings for ``kafka.*`` options given without their prefix.

    Raises:
        KafkaSourceOptionError: a Java-only setting, or a JAAS configuration librdkafka
            cannot express; the message names the setting to use instead.
    """
    out: dict[str, str] = {}
    for name, value in conf.items():
        if name in REFUSED:
            raise KafkaSourceOptionError(REFUSED[name], option=_PREFIX + name)
        if name == "sasl.jaas.config":
            out.update(_jaas(value))
        elif name == "max.poll.records":
            continue  # the source's batch size: KafkaSourceOptions.batch_size
        elif name == "partition.assignment.strategy":
            out[name] = ",".join(
                _ASSIGNORS.get(s.strip(), s.strip()) for s in value.split(",") if s.strip()
            )
        elif name == "ssl.endpoint.identification.algorithm" and not value.strip():
            out[name] = "none"  # the Java client's empty value turns the check off
        else:
            out[RENAMED.get(name, name)] = value
    return out


def _jaas(value: str) -> dict[str, str]:
    """``sasl.jaas.config`` of the PLAIN and SCRAM login modules: their username and
    password are librdkafka's ``sasl.username`` / ``sasl.password``."""
    match = _JAAS.match(value)
    module, body = (match.group(1), match.group(3)) if match else ("", "")
    if module not in _CREDENTIAL_MODULES:
        raise KafkaSourceOptionError(
            f"librdkafka has no JAAS; login module {module or '?'} is not translated: use "
            "kafka.sasl.username and kafka.sasl.password (PLAIN, SCRAM), "
            "kafka.sasl.kerberos.* (GSSAPI) or kafka.sasl.oauthbearer.* (OAUTHBEARER)",
            option="kafka.sasl.jaas.config",
        )
    items = {
        k: (quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted is not None else bare)
        for k, quoted, bare in _JAAS_ITEM.findall(body)
    }
    if "username" not in items or "password" not in items:
        raise KafkaSourceOptionError(
            f'{module} needs username="..." and password="..."; or use '
            "kafka.sasl.username and kafka.sasl.password",
            option="kafka.sasl.jaas.config",
        )
    return {"sasl.username": items["username"], "sasl.password": items["password"]}


def config_error(exc: KafkaException, conf: Mapping[str, object]) -> KafkaSourceOptionError:
    """librdkafka's refusal of a consumer configuration as one option line.

    Args:
        exc: what ``Consumer(conf)`` raised.
        conf: the configuration it was given, to find the setting named in the error.
    """
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    code = err.code() if isinstance(err, KafkaError) else None
    quoted = re.search(r'"([^"]+)"', text)
    name = quoted.group(1) if quoted else next((k for k in conf if k in text), None)
    option = _PREFIX + name if name else "kafka.*"
    if text.startswith("No such configuration property"):
        fix = (
            "librdkafka has no such setting (the kafka.* options are librdkafka's, with the "
            "Java client's names translated where librdkafka has the same setting): see "
            "librdkafka's CONFIGURATION.md or docs/reference.md"
        )
    else:
        fix = f"librdkafka refuses it: {text}"
    return KafkaSourceOptionError(fix, option=option, code=code)
