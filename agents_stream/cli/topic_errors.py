"""One line per broker refusal for ``agents-stream produce`` and ``tail``.

A newcomer's first oversized record or missing ACL must end in a sentence naming the
setting to change, never a librdkafka traceback: every ``KafkaError`` these commands can
meet goes through :func:`produce_refusal` or :func:`read_refusal`.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from ..kafka.admin import AUTHORIZATION_ERRORS, denied, refusal
from ..kafka.config import scrub

# librdkafka's own default of ``message.max.bytes`` (the client refuses a bigger record
# before any broker sees it); Kafka's topic default ``max.message.bytes`` is 1048588.
CLIENT_MAX_BYTES = 1_000_000

_MISSING = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)


def too_large(topic: str, size: int | None, text: str) -> str:
    """The size refusal, with the two settings that bound a record and the way out."""
    what = f"a record of {size:,} bytes" if size is not None else "a record"
    return (
        f"{what} is over the size limit for topic {topic} ({text}): raise the topic's "
        f"max.message.bytes (kafka-configs --alter --entity-type topics --entity-name {topic} "
        "--add-config max.message.bytes=N; the broker's message.max.bytes is its default) "
        "and the producer's message.max.bytes (AGENTS_STREAM_KAFKA_MESSAGE_MAX_BYTES=N or "
        f"--kafka-config; {CLIENT_MAX_BYTES:,} by default), or store the payload elsewhere "
        "and send a reference to it"
    )


def missing(topic: str, bootstrap: str, text: str = "") -> str:
    why = f" ({text})" if text else ""
    return (
        f"topic {topic!r} does not exist on {bootstrap}{why}: start the worker that creates "
        "it, or create it (kafka-topics --create)"
    )


def produce_refusal(err: KafkaError, topic: str, bootstrap: str, size: int | None) -> str:
    """The line for a record the client or the cluster refused."""
    text = scrub(err.str())
    code = err.code()
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return too_large(topic, size, text)
    if code in AUTHORIZATION_ERRORS:
        return denied(f"a write to topic {topic} ({text})", f"Write and Describe on topic {topic}")
    if code in _MISSING:
        return missing(topic, bootstrap, text)
    said = refusal(err, bootstrap)  # authentication, TLS
    if said is not None:
        return said
    if code == KafkaError._MSG_TIMED_OUT:
        return (
            f"no acknowledgement from {bootstrap} for a record to {topic} ({text}): check "
            "that the cluster is up, or raise --timeout"
        )
    return f"{bootstrap} refused a record to {topic} ({text})"


def read_refusal(err: KafkaError, topic: str, bootstrap: str) -> str | None:
    """The line for a read error that retrying cannot mend (None: a transient one, which
    librdkafka retries by itself)."""
    text = scrub(err.str())
    code = err.code()
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return denied(f"reading topic {topic} ({text})", f"Read and Describe on topic {topic}")
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        # An assign()-only reader still looks its (throwaway) group's coordinator up.
        return denied(
            f"a reader of {topic} ({text})",
            "Describe on the groups prefixed agents-stream- (the readers' throwaway groups)",
        )
    if code in AUTHORIZATION_ERRORS:
        return denied(f"reading topic {topic} ({text})", "the ACL it names")
    if code in _MISSING:
        return missing(topic, bootstrap, text)
    return refusal(err, bootstrap)
