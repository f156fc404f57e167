"""Root of the library's exception tree; each subsystem derives its own errors from it."""

from __future__ import annotations


class AgentsStreamError(Exception):
    """Base class of every error raised by agents_stream."""


class ConfigurationError(AgentsStreamError):
    """The app, an agent or the command line is configured inconsistently."""


class KafkaIOError(AgentsStreamError):
    """A Kafka client operation failed; ``code`` keeps librdkafka's error code."""

    # The records of a failed group send (``AckingProducer.send_all``) that did not
    # reach the log, as ``(key, value)`` pairs; None when unknown (every one may have).
    lost: list[tuple[bytes | None, bytes | None]] | None = None

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class RecordRefusedError(KafkaIOError):
    """The client or the broker refused a record itself (over ``message.max.bytes`` or
    the topic's ``max.message.bytes``, invalid): sending it again fails again, and the
    records sent with it are not at fault."""


class PartialSendError(KafkaIOError):
    """Outputs of several input records sent together, some of which did not reach the
    log: ``failed`` maps the position (in the batch sent) of each input record with an
    output missing to its error; every output of the other records is durable. The outputs
    of one record (``KafkaOutputSink.send``) fail with it too, at position 0, whenever the
    producer knows which records were lost."""

    def __init__(
        self,
        failed: dict[int, Exception],
        landed: dict[int, tuple[int, ...]] | None = None,
    ) -> None:
        first = failed[min(failed)]
        super().__init__(
            f"outputs of {len(failed)} record(s) not sent: {first}",
            code=getattr(first, "code", None),
        )
        self.failed = failed
        # Per failed position, the indexes (among the outputs sent for it) of those that
        # did reach the log; a position not here has none known to.
        self.landed = landed or {}
