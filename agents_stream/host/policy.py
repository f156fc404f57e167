"""The record error policy, shared by every host that runs actions on records (the
worker's :class:`~agents_stream.runtime.agent_host.AgentHost`, the Faust adapter).

What an exception escaping an action run means, in order:

1. ``FATAL``: the journal cannot be trusted (:data:`~agents_stream.durable.errors.FATAL_ERRORS`:
   an unreadable journal value, a strict-mode divergence), or the cluster's authorizer
   refused a write (a missing ACL: every record would fail alike), or the schema registry
   refused a schema or did not answer (``serde.errors.RegistryError``). The host stops
   without committing the record, whatever ``on_error`` says: skipping it would guess
   state, dead-lettering it would dead-letter every record after it too. A host that
   can wait (the worker) retries a registry refusal instead, pausing the partition
   (``host/registry_wait.py``): it never reaches this verdict there.
2. ``FAIL``: ``App(on_error="fail")``, or a host with nowhere to dead-letter. The host
   stops without committing the record; the next owner runs it again.
3. ``DEAD_LETTER``: ``App(on_error="dlq")``: the record goes to ``<input>-dlq`` (a timer,
   which has no record, is dropped) and processing goes on.

Before any of these, a host that can take its partitions again (the worker) asks
:func:`undelivered`: a journal or output write the cluster did not take (a broker
outage, too few replicas in sync, a fenced transaction) is not the record's failure. It
is abandoned, never dead-lettered, and run again from the committed offsets.

Every failure is logged once, here, naming where it happened, so an operator finds the
record in the same words whichever host ran it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import KafkaError

from ..durable.errors import FATAL_ERRORS
from ..errors import KafkaIOError, RecordRefusedError
from ..kafka.admin import denial
from ..serde.errors import RegistryError

OnError = Literal["dlq", "fail"]


class Verdict(enum.Enum):
    FATAL = "fatal"
    FAIL = "fail"
    DEAD_LETTER = "dead_letter"

    @property
    def stops(self) -> bool:
        """Whether the host must stop, leaving the record uncommitted."""
        return self is not Verdict.DEAD_LETTER


def classify(exc: BaseException, on_error: OnError, *, can_dead_letter: bool = True) -> Verdict:
    """The verdict on ``exc`` raised by an action run (see the module doc)."""
    if isinstance(exc, FATAL_ERRORS) or denial(exc) is not None:
        # Also what the cluster's authorizer refused (a journal write): not the record's
        # fault, so dead-lettering it (and every record after it) would lose them all.
        return Verdict.FATAL
    if isinstance(exc, RegistryError):
        # A schema registry that refuses a schema or does not answer (issue 52): a
        # configuration or service fault, not the record's, so never a dead letter; the
        # record stays uncommitted for the next start, which checks the registry first.
        return Verdict.FATAL
    if on_error == "fail" or not can_dead_letter:
        return Verdict.FAIL
    return Verdict.DEAD_LETTER


# Delivery failures that say the cluster did not take a write, through no fault of the
# record: it timed out in the client, the leader moved or went away, too few replicas in
# sync, or (exactly-once) this producer's epoch was fenced. What a record refused itself
# is RecordRefusedError; an authorizer's refusal is a denial (FATAL above). _FATAL: the
# producer itself is unusable (a transactional one fenced: the host replaces it; an
# idempotent journal producer: the worker stops, see Rebalance.undelivered).
_UNDELIVERED = frozenset(
    {
        KafkaError._FATAL,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._FENCED,
        KafkaError._STATE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    }
)


def undelivered(exc: object) -> bool:
    """Whether ``exc`` escaping an action run is a journal or output write the cluster
    did not take (a broker outage, below min ISR, a fenced transaction): not the record's
    fault, so never a dead letter. A host that can re-take its partitions runs the record
    again from the committed offsets (its acknowledged calls replayed)."""
    return (
        isinstance(exc, KafkaIOError)
        and not isinstance(exc, RecordRefusedError)
        and exc.code in _UNDELIVERED
        and denial(exc) is None
    )


def record_where(topic: str, partition: int, offset: int, key: str) -> str:
    """``orders[3]@1207 key='user-1'``: how every host names a record in its logs."""
    return f"{topic}[{partition}]@{offset} key={key!r}"


def judge(
    logger: logging.Logger,
    exc: BaseException,
    what: str,
    on_error: OnError,
    *,
    host: str,
    dead_letter_to: str | None = None,
    can_dead_letter: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> Verdict:
    """Classify ``exc`` and log it once; the caller acts on the verdict.

    Args:
        what: what failed and where, e.g. ``"action of Payments raised on " +
            record_where(...)``.
        host: named in the stop line ("worker", "Faust app").
        dead_letter_to: the DLQ topic of a DEAD_LETTER record; None means the failed
            work is dropped (a timer).
        extra: structured log fields (runtime/logs.py ``record_fields``).
    """
    verdict = classify(exc, on_error, can_dead_letter=can_dead_letter)
    fields = dict(extra) if extra else None
    if verdict is Verdict.FATAL:
        # The message of a fatal error names the journal slot; a traceback adds nothing.
        logger.critical("%s: %s; stopping the %s", what, denial(exc) or exc, host, extra=fields)
    elif verdict is Verdict.FAIL:
        logger.critical(
            "%s: %r; stopping the %s (on_error=%r), the record is not committed",
            what,
            exc,
            host,
            on_error,
            exc_info=exc,
            extra=fields,
        )
    else:
        logger.error(
            "%s: %r -> %s",
            what,
            exc,
            dead_letter_to or "dropped",
            exc_info=exc,
            extra=fields,
        )
    return verdict
