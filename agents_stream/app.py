"""App: the declaration of agents, Async I/O operators and their topics.

An App only describes; hosts run it (``agents-stream worker -A module:app``). Creating
an App does no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .agent import Agent
from .durable.payload import JSON, PayloadCodec
from .durable.values import register_codec, register_type
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .testing.kit import AgentTestContext

BROKER_ENV = "AGENTS_STREAM_BROKER"
PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")


def normalize_broker(url: str) -> str:
    """``kafka://h1:9092;h2:9092`` or ``h1:9092,h2:9092`` -> librdkafka bootstrap list."""
    servers = url.strip()
    if "://" in servers:
        scheme, _, servers = servers.partition("://")
        if scheme not in ("kafka", "tcp", "plaintext"):
            raise ConfigurationError(f"unsupported broker scheme {scheme!r} in {url!r}")
    return servers.replace(";", ",").rstrip("/")


@dataclass(frozen=True)
class AgentBinding:
    """An agent bound to its topics and codecs."""

    agent: type[Agent]
    input: str
    output: str | None
    input_schema: Any = None
    output_schema: Any = None
    tombstones: Literal["skip", "deliver"] = "skip"

    @property
    def name(self) -> str:
        return self.agent.__name__


@dataclass(frozen=True)
class AsyncIOBinding:
    """An Async I/O operator (Flink AsyncWaitOperator) bound to its topics."""

    fn: Callable[..., Any]
    input: str
    output: str
    ordered: bool = True
    time_mode: Literal["processing", "event"] = "processing"
    capacity: int = 100
    timeout: float | None = 5.0
    retry: Any = None
    on_timeout: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", "async_io")


@dataclass
class App:
    """A named application: its id is the consumer group and prefixes internal topics.

    Args:
        id: application id (consumer group, ``<id>-action-state`` topic).
        broker: ``kafka://host:port[,host:port]``; ``AGENTS_STREAM_BROKER`` or ``--broker``
            override it; with none of them the worker refuses to start (``--broker
            embedded`` runs the development broker).
        data_dir: where RocksDB caches live (``--data-dir`` overrides).
        schema_registry_url: Confluent Schema Registry; switches Avro framing to the
            Confluent wire format. ``$AGENTS_STREAM_SCHEMA_REGISTRY`` and the commands'
            ``--schema-registry`` override it; client settings (basic auth, TLS) are
            ``schema.registry.*`` keys of ``kafka_config`` / ``--kafka-config``. The
            worker registers (or looks up) every schema it writes before it takes
            partitions, and stops in one line when the registry refuses one.
        subject_name_strategy: registry subject of Avro input/output values: ``"topic"``
            (``<topic>-value``, default), ``"record"`` (the record's full name) or
            ``"topic_record"`` (``<topic>-<full name>``). The journal always uses
            ``<topic>-value``.
        payload_codec: codec of journaled call results and outputs (default: the exact
            journaled value domain in tagged JSON, see ``register_codec``; ``PickleCodec``
            only for trusted topics). Memory values and events are JSON.
        max_in_flight: records processed concurrently per worker before partitions pause.
        code_block_threads: threads of a worker that run code blocks (``ctx.execute`` of
            sync actions, ``execute_async`` of plain functions). At most this many such
            calls run at once, so a sync action whose calls take ``t`` seconds finishes at
            most ``code_block_threads / t`` records per second however many are in
            flight; ``--code-block-threads`` overrides it. Coroutine code blocks of async
            actions use no thread.
        on_error: ``"dlq"`` sends a record whose action raised to ``<input>-dlq`` and goes
            on; ``"fail"`` stops the worker without committing it.
        strict_determinism: raise NonDeterminismError instead of truncate-and-re-execute.
        prune_completed: tombstone a record's ActionStates once its offset is committed.
        rerun_completed: DANGER, explicit opt-in: run input records below their
            partition's completed-through marker (InputProgress) again, e.g. after a
            consumer-group offset reset. By default they are skipped: they finished, and
            running them again charges every side effect once more.
        commit_interval: seconds between offset commits (with exactly-once: between
            transaction commits, i.e. how long a ``read_committed`` reader downstream
            waits for outputs at most, against one commit's cost per interval).
        processing_guarantee: ``"at_least_once"`` (default): outputs are sent when
            their action finishes and may be sent again after a crash or by a member
            that lost its partitions. ``"exactly_once"``: each group commit is one Kafka
            transaction holding the outputs, ActionDones, memory snapshots,
            completed-through markers and input offsets it covers, so a
            ``read_committed`` reader sees every output once. Needs Apache Kafka (or a
            broker with isolating transactions; the embedded broker is refused);
            journaled calls are acknowledged before the action goes on either way.
        output_scan_window: a worker that recovers a finished action not marked emitted
            (a worker died after its outputs were acked, before its commit) looks its
            outputs up in the output topic and sends only those not there: from when it
            finished to the end of the topic if that was within this many seconds, else
            up to two producer delivery timeouts after it finished. 0: no lookup, every
            unmarked output is sent again.
        partitions: partition count of topics the worker has to create.
        replication_factor: replication of topics the worker creates (-1: the broker's
            ``default.replication.factor``); ``--replication-factor`` overrides it.
        min_insync_replicas: ``min.insync.replicas`` of the ActionState topic it creates
            (None: the broker default); with ``acks=all`` a journal write then survives
            the loss of ``min_insync_replicas - 1`` brokers.
        kafka_config: librdkafka properties every client of the app gets (security,
            ``client.id``, timeouts), below ``--kafka-config`` and ``AGENTS_STREAM_KAFKA_*``
            and above our defaults; never shown in reprs or logs.
        consumer_config / producer_config: client-specific properties on top of those.
        epoch_mode: ``"out_of_order"`` lets records overtake a pending watermark (only the
            watermark waits for its epoch); ``"strict"`` holds them until it is processed.
        out_of_orderness_ms: how late a record timestamp may be behind its partition's
            newest before the watermark passes it (bounded out-of-orderness).
        idle_timeout_ms: a partition without records this long stops holding the
            watermark back (None: never idle).
    """

    id: str
    broker: str | None = None
    data_dir: str | None = None
    schema_registry_url: str | None = field(default=None, repr=False)  # may hold credentials
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    payload_codec: PayloadCodec = JSON
    max_in_flight: int = 6000
    code_block_threads: int = 256
    on_error: Literal["dlq", "fail"] = "dlq"
    strict_determinism: bool = False
    prune_completed: bool = True
    rerun_completed: bool = False
    commit_interval: float = 1.0
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    output_scan_window: float = 600.0
    partitions: int = 4
    replication_factor: int = -1
    min_insync_replicas: int | None = None
    epoch_mode: Literal["out_of_order", "strict"] = "out_of_order"
    out_of_orderness_ms: int = 200
    idle_timeout_ms: int | None = 10_000
    kafka_config: dict[str, Any] = field(default_factory=dict, repr=False)
    consumer_config: dict[str, Any] = field(default_factory=dict, repr=False)
    producer_config: dict[str, Any] = field(default_factory=dict, repr=False)
    agents: list[AgentBinding] = field(default_factory=list, init=False)
    async_ios: list[AsyncIOBinding] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if not self.id or not self.id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigurationError(f"app id must be alphanumeric with -_. ; got {self.id!r}")
        guarantee = str(self.processing_guarantee).replace("-", "_")
        if guarantee not in PROCESSING_GUARANTEES:
            raise ConfigurationError(
                f"processing_guarantee must be one of {', '.join(PROCESSING_GUARANTEES)}; "
                f"got {self.processing_guarantee!r}"
            )
        self.processing_guarantee = guarantee  # type: ignore[assignment]
        if self.subject_name_strategy not in ("topic", "record", "topic_record"):
            raise ConfigurationError(
                "subject_name_strategy must be one of topic, record, topic_record; "
                f"got {self.subject_name_strategy!r}"
            )
        if self.code_block_threads < 1:
            raise ConfigurationError(
                f"code_block_threads must be at least 1; got {self.code_block_threads}"
            )

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def action_state_topic(self) -> str:
        return f"{self.id}-action-state"

    def register_codec(
        self,
        cls: type,
        name: str,
        encode: Callable[[Any], Any],
        decode: Callable[[Any], Any],
    ) -> None:
        """Let instances of exactly ``cls`` be journaled (call arguments, results,
        exception args): stored as ``encode(obj)``, a value of the journaled domain, under
        the stable ``name``; replay returns ``decode(value)``. Process-wide, like
        :func:`agents_stream.register_codec`: register before the worker starts."""
        register_codec(cls, name, encode, decode)

    def register_type(self, cls: type, name: str | None = None) -> None:
        """Give a dataclass or Enum a stable journal name, so replay rebuilds it even if
        its module is not imported yet or it moved (see :mod:`agents_stream.durable.values`)."""
        register_type(cls, name)

    def agent(
        self,
        agent: type[Agent],
        *,
        input: str,
        output: str | None = None,
        input_schema: str | Path | dict[str, Any] | None = None,
        output_schema: str | Path | dict[str, Any] | None = None,
        tombstones: Literal["skip", "deliver"] = "skip",
    ) -> AgentBinding:
        """Run ``agent``'s actions for every record of ``input``; outputs go to ``output``.

        One agent per input topic: the ActionState topic is co-partitioned with it.
        ``tombstones``: a record with a null value is skipped and committed (counted as
        ``tombstones_skipped``) by default; ``"deliver"`` runs the actions with
        ``InputEvent(input=None)``.
        """
        agent.actions()  # validate early, at import time of the user's module
        if any(b.input == input for b in self.agents):
            raise ConfigurationError(f"topic {input!r} already has an agent")
        if tombstones not in ("skip", "deliver"):
            raise ConfigurationError(f"tombstones must be 'skip' or 'deliver', not {tombstones!r}")
        binding = AgentBinding(agent, input, output, input_schema, output_schema, tombstones)
        self.agents.append(binding)
        return binding

    def async_io(
        self,
        fn: Callable[..., Any],
        *,
        input: str,
        output: str,
        ordered: bool = True,
        time_mode: Literal["processing", "event"] = "processing",
        capacity: int = 100,
        timeout: float | None = 5.0,
        retry: Any = None,
        on_timeout: Callable[[Any], Any] | None = None,
    ) -> AsyncIOBinding:
        """Flink-style Async I/O: ``await fn(value)`` for each record of ``input``.

        ``ordered`` emits in input order, otherwise as completed (event time: never across
        a watermark). ``capacity`` bounds elements in flight (partitions pause beyond it);
        ``timeout`` covers all retry attempts; ``on_timeout(value)`` may supply a result,
        otherwise the element goes to ``<input>-dlq``. In-flight inputs are re-invoked
        after a crash (their offsets were not committed).
        """
        if capacity < 1:
            raise ConfigurationError("capacity must be >= 1")
        binding = AsyncIOBinding(
            fn, input, output, ordered, time_mode, capacity, timeout, retry, on_timeout
        )
        self.async_ios.append(binding)
        return binding

    def test_context(self, *, code_block_threads: int = 8, settle: bool = True) -> AgentTestContext:
        """Run this app's agents on records in-process, without a broker (Faust's
        ``agent.test_context()``): see :class:`agents_stream.testing.AgentTestContext`.
        ``settle=False`` leaves two-phase calls PREPARED until ``ctx.settle()``."""
        from .testing.kit import AgentTestContext  # the test kit builds on the whole host

        return AgentTestContext(self, code_block_threads=code_block_threads, settle=settle)

    def resolve_broker(self, override: str | None = None) -> str | None:
        """Bootstrap servers: ``--broker`` > ``AGENTS_STREAM_BROKER`` > ``App(broker=)``."""
        url = override or os.environ.get(BROKER_ENV) or self.broker
        return normalize_broker(url) if url else None

    @property
    def input_topics(self) -> list[str]:
        return [b.input for b in self.agents] + [b.input for b in self.async_ios]
