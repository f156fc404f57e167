"""DurableAgent: an agents_stream Agent hosted by a Faust app, as a Faust agent.

The Faust app owns consumption, the consumer group and offset commits; agents_stream
owns the journal (``<app_id>-action-state``, compacted, co-partitioned with the input,
read through a RocksDB cache per partition), the outputs and the dead letters, written
with its own confluent-kafka producer.

Guarantees (the worker's): a code block whose CallResult was acknowledged is never
executed again after a crash or rebalance, its outcome is replayed; completed actions are
skipped and their memory updates and outputs are not applied twice; an input is acked to
Faust (which then commits it) only after all its actions completed and their outputs are
durable. Records of one Faust agent are processed one at a time, in Faust's order, or
with ``concurrency=N`` up to N at once: distinct keys concurrently, each key in order.

Lifecycle, in the order Faust drives it:

1. First assignment (``on_partitions_assigned``, before Faust fetches): create the
   missing output, ``<input>-dlq`` and ActionState topics; with a schema registry
   (``schema_registry_url=`` or ``$AGENTS_STREAM_SCHEMA_REGISTRY``), register every
   schema the agent writes, as the worker does at start-up: a refusal or an unreachable
   registry crashes the Faust app with one CRITICAL line (subject, version, the server's
   reason) before any record runs; build producer and store.
2. Every assignment: catch up each assigned input partition's cache from the ActionState
   topic (in a thread: Faust's loop keeps heartbeating). A record of a partition that is
   not assigned yet (missed signal) assigns it first.
3. Records: see :mod:`agents_stream.faust.records` (run, then ack; a replayed dead letter
   runs under its original offset).
4. Revocation (``on_partitions_revoked``; Faust has waited for in-flight records to be
   acked): fence the partitions (``durable/ownership.py``: a record of theirs still
   running starts no code block and writes no journal record or output; it is left
   unacked for the next owner), then close their caches.
5. Every ``prune_interval``: tombstone the ActionStates of records below the offsets
   Faust committed (as the worker's pruning).
6. Shutdown (``on_before_shutdown``): flush and close the producer, close the caches.

Not hosted here (the worker has them): timers (registrations are journaled, never
fired), Async I/O operators, watermark epochs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Hashable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from ..agent import Agent
from ..app import App, normalize_broker
from ..durable.context import ContextConfig
from ..durable.journal import TimerEntry
from ..durable.ownership import Ownership
from ..durable.payload import JSON, PayloadCodec
from ..durable.pool import CodeBlockPool
from ..durable.sink import OutputSink
from ..durable.store import ActionStateStore
from ..errors import ConfigurationError
from ..host.kit import DurableHost
from ..host.policy import OnError
from ..host.progress import CompletedThrough
from ..host.registry_wait import RegistryWait
from ..kafka.admin import TopicAdmin, TopicSpec, compacted
from ..kafka.config import configure
from ..kafka.producer import AckingProducer
from ..serde.errors import RegistryError
from ..serde.registry import resolve_registry_url
from ..serde.startup import register_app_schemas
from ..state.kafka import KafkaActionStateStore
from .lanes import KeyLanes
from .records import FaustEvent, FaustRecordHandler, record_key

try:
    import faust
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "agents_stream.faust needs faust-streaming: pip install 'agents-stream[faust]'"
    ) from exc

log = logging.getLogger("agents_stream.faust")


def faust_bootstrap(faust_app: faust.App) -> str:
    """librdkafka bootstrap servers of a Faust app's ``broker`` setting."""
    urls = faust_app.conf.broker
    servers = [f"{u.host}:{u.port or 9092}" for u in urls if u.scheme in ("kafka", "aiokafka")]
    if not servers:
        raise ConfigurationError(
            f"Faust broker {[str(u) for u in urls]} is not Kafka; pass broker= explicitly"
        )
    return ",".join(servers)


class DurableAgent:
    """An agents_stream ``Agent`` run by a Faust app; create it with :func:`durable_agent`.

    No I/O happens here: Kafka resources are created when Faust first assigns partitions.

    Args (keyword-only, beyond :func:`durable_agent`'s):
        output_schema: Avro schema of output values (JSON without one).
        broker: bootstrap servers of the journal/output producer (default: Faust's).
        data_dir: root of the RocksDB caches (default: Faust's ``datadir``), as
            ``<data_dir>/<app_id>/action-state``.
        schema_registry_url, payload_codec, strict_determinism, producer_config: as on
            :class:`~agents_stream.App`.
        kafka_config: librdkafka settings (security, ``client.id``) for every Kafka
            client agents_stream creates here: admin, producer, cache-rebuild readers;
            ``AGENTS_STREAM_KAFKA_CONFIG`` / ``AGENTS_STREAM_KAFKA_*`` apply over it, as
            for a worker. Faust's own clients keep Faust's settings.
        on_error: ``"dlq"`` (copy to ``<input>-dlq``, ack, go on) or ``"fail"`` (crash
            the Faust app, leave the record unacked).
        worker_id: recorded in every CallResult (default host-pid).
        prune_completed, prune_interval: tombstone a record's ActionStates once Faust
            committed its offset, checked every ``prune_interval`` seconds; an
            InputProgress marker (completed-through = Faust's committed offset) is acked
            first, and events below it are acked without running when re-delivered.
        rerun_completed: DANGER, explicit opt-in: run events below the marker again.
        code_block_threads: threads running code blocks (see ``App(code_block_threads)``).
        concurrency: records in flight at once (default 1: one at a time, in Faust's
            order). Above 1, records of distinct keys run concurrently and a key's
            records stay in order, as on the worker (unlike Faust's own agent
            ``concurrency``, which runs copies of the agent over one stream); keyless
            records each run on their own. Faust commits an offset only once every
            record below it was acked.
        store, sink: bring your own ActionStateStore / OutputSink (tests, Faust's
            ``agent.test_context()``); no journal topic or producer is created for them.
        name: the Faust agent's name.
    """

    def __init__(
        self,
        faust_app: faust.App,
        agent: type[Agent],
        *,
        topic: Any,
        app_id: str | None = None,
        output: str | None = None,
        output_schema: Any = None,
        broker: str | None = None,
        data_dir: str | Path | None = None,
        schema_registry_url: str | None = None,
        payload_codec: PayloadCodec = JSON,
        on_error: OnError = "dlq",
        strict_determinism: bool = False,
        worker_id: str | None = None,
        producer_config: dict[str, Any] | None = None,
        kafka_config: dict[str, Any] | None = None,
        prune_completed: bool = True,
        prune_interval: float = 2.0,
        rerun_completed: bool = False,
        code_block_threads: int = App.code_block_threads,
        concurrency: int = 1,
        store: ActionStateStore | None = None,
        sink: OutputSink | None = None,
        name: str | None = None,
    ) -> None:
        agent.actions()  # validate at import time of the user's module
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1; got {concurrency}")
        self.concurrency = concurrency
        self.faust_app = faust_app
        guarantee = str(getattr(faust_app.conf, "processing_guarantee", "at_least_once"))
        if "exactly" in guarantee.lower():
            # Faust's transactions cover its own producer only: outputs and ActionDones
            # sent by this host would commit outside them.
            raise ConfigurationError(
                f"durable agents do not support Faust's processing_guarantee={guarantee}: "
                "their outputs are at-least-once in a Faust app; run the agent in an "
                "agents-stream worker with --processing-guarantee exactly-once instead"
            )
        self.agent = agent
        self.topic = faust_app.topic(topic) if isinstance(topic, str) else topic
        names = list(self.topic.topics or ())
        if len(names) != 1:
            raise ConfigurationError(
                f"durable_agent needs exactly one input topic (the journal is "
                f"co-partitioned with it); got {names or self.topic!r}"
            )
        self.input: str = names[0]
        self.app_id = app_id or str(faust_app.conf.id)
        self.output = output
        self.output_schema = output_schema
        self._broker = broker
        self.data_dir = Path(data_dir or faust_app.conf.datadir) / self.app_id
        self.schema_registry_url = schema_registry_url
        self.on_error: OnError = on_error
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self._producer_overrides = dict(producer_config or {})
        if kafka_config is not None:
            configure(kafka_config)
        self.prune_completed = prune_completed and store is None
        self._pool = CodeBlockPool(code_block_threads)
        self._context = ContextConfig(
            app_id=self.app_id,
            worker_id=self.worker_id,
            codec=payload_codec,
            strict=strict_determinism,
            executor=self._pool,
        )
        self.store: ActionStateStore | None = store
        self._sink = sink
        self.producer: AckingProducer | None = None
        self.kit: DurableHost | None = None
        self.handler: FaustRecordHandler | None = None
        self._owned: set[int] = set()
        # Holds of the input partitions (durable/ownership.py): from Faust's revoke on,
        # no code block starts and nothing is written for a partition.
        self.ownership = Ownership()
        self._finished: dict[int, list[tuple[int, str]]] = defaultdict(list)
        self._start_lock = asyncio.Lock()
        self._assign_lock = asyncio.Lock()
        self._timers_warned = False
        self._registry_stats: dict[str, int] = {}
        self.rerun_completed = rerun_completed
        # A record the schema registry refuses mid-run waits and runs again, as on the
        # worker (host/registry_wait.py); Faust's stream holds the partition meanwhile.
        self.registry_wait = RegistryWait(self._registry_stats)

        self.faust_agent = faust_app.agent(
            self.topic, name=name or f"agents_stream.{self.app_id}.{agent.__name__}"
        )(self._consume)
        # mode's SignalHandlerT only admits ``(sender, *args, signal=, **kwargs)``
        # handlers, but Signal.send calls ``receiver(sender, *args, signal=self, **kw)``
        # with the signal's own arguments: these (one positional, ``**_`` taking
        # ``signal``) are called correctly, the stub cannot say so.
        faust_app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        faust_app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        faust_app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]

        async def prune() -> None:
            self._committed()  # what two-phase commits wait for, pruning or not
            if self.prune_completed:
                self._prune()

        faust_app.timer(prune_interval, name=f"{self.faust_agent.name}.prune")(prune)

    @property
    def action_state_topic(self) -> str:
        return f"{self.app_id}-action-state"

    @property
    def bootstrap(self) -> str:
        """``broker=`` if given, else the Faust app's broker."""
        if self._broker:
            return normalize_broker(self._broker)
        return faust_bootstrap(self.faust_app)

    @property
    def stats(self) -> dict[str, int]:
        return {**(self.handler.stats if self.handler else {}), **self._registry_stats}

    # -- Faust agent ------------------------------------------------------------------
    async def _consume(self, stream: Any) -> None:
        """The Faust agent: events acked by the handler once done; one at a time, or by
        key in :class:`~agents_stream.faust.lanes.KeyLanes` (``concurrency``)."""
        if self.concurrency == 1:
            async for event in stream.noack().events():
                await self.process(event)
            return
        lanes = KeyLanes(self.concurrency)
        try:
            async for event in stream.noack().events():
                await lanes.submit(self._lane_of(event), partial(self.process, event))
            await lanes.join()
        finally:
            lanes.cancel()  # stopping: unacked events come again, their calls replay

    @staticmethod
    def _lane_of(event: FaustEvent) -> Hashable:
        """A key's records share a lane (per partition: keys are co-partitioned, but a
        custom partitioner may not be); a keyless record has one of its own."""
        msg = event.message
        if getattr(msg, "key", event.key) is None and event.key is None:
            return object()
        return (int(msg.partition), record_key(event.key))

    async def process(self, event: FaustEvent) -> bool:
        """Run one Faust event's actions; True when it was acked (see ``records``)."""
        handler = await self.start()
        partition = int(event.message.partition)
        if partition not in self._owned:
            if not self._assigned_by_faust(partition):
                return False  # fetched before a revoke: the new owner runs it
            await self._assign([partition])
        acked = await handler.handle(event)
        offset = int(event.message.offset)
        # A dead letter's journal is kept for its replay, a replay's for the replay's own
        # re-delivery (host/dlq.py): only other records are pruned.
        if acked and not handler.kept.release(partition, offset) and self.prune_completed:
            self._finished[partition].append((offset, record_key(event.key)))
        return acked

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> FaustRecordHandler:
        """Create topics, producer, store and runner once (idempotent)."""
        if self.handler is not None:
            return self.handler
        async with self._start_lock:
            if self.handler is None:
                try:
                    handler = await asyncio.to_thread(self._build)
                except RegistryError as exc:
                    # As the worker does at start-up: a refused or unreachable registry
                    # is a configuration error, said in one line, and nothing runs.
                    log.critical("Faust app stopped: %s", exc)
                    await self.faust_app.crash(exc)
                    raise
                if self.producer is not None and self.concurrency > 1:
                    # Many records in flight: Faust's loop serves the delivery reports,
                    # as the worker's does (no poll thread taking the GIL from it,
                    # kafka/producer.py). One at a time is bound by each ack's latency,
                    # which the poll thread's immediate wake-up keeps lower.
                    self.producer.serve_on(asyncio.get_running_loop(), threading.current_thread())
                self.handler = handler
        return self.handler

    def _build(self) -> FaustRecordHandler:
        produce = self.store is None or bool(self.output and self._sink is None)
        if produce:
            self._ensure_topics()
        # The worker's precedence: $AGENTS_STREAM_SCHEMA_REGISTRY over the argument.
        self.schema_registry_url = resolve_registry_url(None, self.schema_registry_url)
        app = App(
            self.app_id,
            schema_registry_url=self.schema_registry_url,
            payload_codec=self._context.codec,
            strict_determinism=self._context.strict,
            producer_config=self._producer_overrides,
            prune_completed=self.prune_completed,
        )
        app.agent(
            self.agent, input=self.input, output=self.output, output_schema=self.output_schema
        )
        if produce and app.schema_registry_url:
            # Before its first partition is caught up (start() runs on assignment): every
            # schema it writes is registered, or refused here (serde/startup.py).
            register_app_schemas(app)
        # The host kit builds producer, store, sink and dead letters as for the worker;
        # a store/sink given here (Faust test contexts) is used instead.
        self.kit = DurableHost(
            app,
            bootstrap=self.bootstrap if produce else "",
            data_dir=self.data_dir,
            worker_id=self.worker_id,
            executor=self._pool,
            store=self.store,
            sinks={self.input: self._sink} if self._sink else None,
            produce=produce,
            on_timers=self._on_timers,
            ownership=self.ownership,
        )
        self.producer = self.kit.producer
        self.store = self.kit.store
        self.progress = CompletedThrough(
            self.kit.store, self._context.worker_id, rerun_completed=self.rerun_completed
        )
        if self.kit.settler is not None:  # two-phase commits wait for durable markers
            self.kit.settler.through = self.progress.durable_through
            self.kit.settler.start()
        return FaustRecordHandler(
            self.kit.bindings[self.input].runner,
            dead_letters=self.kit.dlq,
            on_error=self.on_error,
            crash=self.faust_app.crash,
            owns=self._owned.__contains__,
            progress=self.progress,
            registry_wait=self.registry_wait,
        )

    def _ensure_topics(self) -> None:
        """Create the output, DLQ and ActionState topics (the input is the Faust app's)."""
        admin = TopicAdmin(self.bootstrap)
        counts = admin.partition_counts([self.input])
        partitions = counts.get(self.input) or self.topic.partitions
        partitions = partitions or self.faust_app.conf.topic_partitions
        admin.ensure(
            [
                compacted(self.action_state_topic, partitions),
                TopicSpec(f"{self.input}-dlq", partitions),
            ]
            + ([TopicSpec(self.output, partitions)] if self.output else [])
        )

    async def _assign(self, partitions: Iterable[int]) -> None:
        """Catch up the caches of ``partitions``; serialized, so the assignment signal and
        a record arriving first never open the same cache twice."""
        await self.start()
        async with self._assign_lock:
            new = sorted(set(partitions) - self._owned)
            if not new:
                return
            replayed = 0
            if isinstance(self.store, KafkaActionStateStore):
                for partition in new:
                    replayed += await asyncio.to_thread(self.store.assign, partition)
            for partition in new:
                self._load_progress(partition)
                self.ownership.acquire(self.input, partition)
                if self.kit is not None and self.kit.settler is not None:
                    self.kit.settler.assigned(self.input, partition)
            self._owned.update(new)
        log.info(
            "%s: assigned %s[%s] (replayed %d journal records)",
            self.agent.__name__,
            self.input,
            ",".join(map(str, new)),
            replayed,
        )

    def _load_progress(self, partition: int) -> None:
        """After the cache rebuild: events below the partition's completed-through marker
        are acked without running (the worker's rule, guarantee 8: host/progress.py)."""
        assert self.handler is not None
        self.handler.progress.load(self.input, partition, prune=self.prune_completed)

    def _assigned_by_faust(self, partition: int) -> bool:
        """Whether Faust's consumer holds the input partition (True without a consumer
        assignment to ask, e.g. in Faust's ``agent.test_context()``)."""
        if not isinstance(self.store, KafkaActionStateStore):
            return True
        assignment = self.faust_app.consumer.assignment()
        return any(tp.topic == self.input and tp.partition == partition for tp in assignment)

    async def _on_assigned(self, sender: Any, assigned: Any, **_: Any) -> None:
        await self._assign(tp.partition for tp in assigned if tp.topic == self.input)

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        # Fence first, before waiting for the lock: a record still running for these
        # partitions starts no further code block and writes nothing from here on.
        for tp in revoked:
            if tp.topic == self.input:
                self.ownership.release(self.input, tp.partition)
        async with self._assign_lock:
            for tp in revoked:
                if tp.topic != self.input or tp.partition not in self._owned:
                    continue
                self._owned.discard(tp.partition)
                self._finished.pop(tp.partition, None)
                if self.kit is not None and self.kit.settler is not None:
                    self.kit.settler.revoked(tp.partition)
                if isinstance(self.store, KafkaActionStateStore):
                    self.store.revoke(tp.partition)

    async def _on_shutdown(self, sender: Any, **_: Any) -> None:
        self.registry_wait.stop()  # a record waiting for the registry: abandoned, unacked
        if self.producer is not None:
            await asyncio.to_thread(self.producer.close)
        if self.kit is not None and self.kit.settler is not None:
            self.kit.settler.close()
        if self.store is not None:
            self.store.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        log.info("%s stopped: %s", self.agent.__name__, self.stats)

    def _on_timers(self, timers: list[TimerEntry]) -> None:
        if not self._timers_warned:
            self._timers_warned = True
            log.warning(
                "%s registered timers; the Faust host journals them but does not fire "
                "them (run the agent on the agents_stream worker for timers)",
                self.agent.__name__,
            )

    # -- pruning ------------------------------------------------------------------------
    def _committed(self) -> None:
        """Faust's committed offsets of the partitions held: records below them finished
        (acked only once done), what two-phase commits wait for (host/progress.py)."""
        if self.handler is None:
            return
        for (topic, partition), position in _committed_offsets(self.faust_app).items():
            if topic == self.input and partition in self._owned:
                self.handler.progress.committed(topic, partition, position)

    def _prune(self) -> None:
        """Tombstone the ActionStates of finished records below Faust's committed offsets:
        a committed record is never re-consumed, so its journal is no longer needed."""
        if self.store is None:
            return
        committed = _committed_offsets(self.faust_app)
        for partition, finished in list(self._finished.items()):
            position = committed.get((self.input, partition))
            if position is None or partition not in self._owned:
                continue
            done = [(o, k) for o, k in finished if o < position]
            if not done:
                continue
            self._finished[partition] = [(o, k) for o, k in finished if o >= position]
            self._mark_then_prune(partition, position, done)

    def _mark_then_prune(self, partition: int, position: int, done: list[tuple[int, str]]) -> None:
        """Write the completed-through marker and prune only once it is acked: after the
        tombstones the marker is the only record that these events are done."""
        assert self.handler is not None
        self.handler.progress.write_then_prune(self.input, partition, position, done)


def _committed_offsets(faust_app: faust.App) -> dict[tuple[str, int], int]:
    """Offsets Faust committed, as ``{(topic, partition): next offset}``.

    Faust has no public accessor; its consumer keeps them in ``_committed_offset`` (set
    after each successful commit). Without it nothing is pruned, which is safe.
    """
    offsets = getattr(faust_app.consumer, "_committed_offset", None) or {}
    return {(tp.topic, tp.partition): o for tp, o in offsets.items() if o is not None}


def durable_agent(
    faust_app: faust.App,
    agent: type[Agent],
    *,
    topic: Any,
    app_id: str | None = None,
    output: str | None = None,
    **options: Any,
) -> DurableAgent:
    """Run ``agent``'s actions, durably, for every record of ``topic`` in ``faust_app``.

    Registers a Faust agent (started by ``faust -A module worker`` like any other) that
    runs each event through agents_stream's ActionRunner: ``ctx.execute*`` calls are
    journaled to ``<app_id>-action-state`` and replayed after a crash or rebalance; an
    event is acked to Faust only after its actions completed and their outputs (to
    ``output``) are durable, so Faust never commits an unfinished input.

    Args:
        faust_app: the Faust app; its broker is used unless ``broker=`` is given.
        agent: the agents_stream ``Agent`` subclass.
        topic: a Faust topic (or topic name) with exactly one topic; the event key is
            the agents_stream key (bytes decoded as UTF-8), the value is what Faust's
            value serializer produced.
        app_id: names the ActionState topic and call ids (default: the Faust app id).
            One durable agent per app id and input topic.
        output: topic of the agent's ``OutputEvent`` values (JSON, or Avro with
            ``output_schema=``).
        **options: see :class:`DurableAgent` (``on_error``, ``strict_determinism``,
            ``payload_codec``, ``data_dir``, ``broker``, ``prune_completed``...).
    """
    return DurableAgent(faust_app, agent, topic=topic, app_id=app_id, output=output, **options)
