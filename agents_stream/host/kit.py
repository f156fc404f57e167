"""DurableHost: the one place that wires the durable core to Kafka.

A *host* decides **when** things happen: the worker from its consumer loop, the Faust
adapter from Faust's callbacks, Spark backfill from one task per input partition. This
kit decides **how** the durable machinery is built and shared: the journal producer, the
ActionState store with its RocksDB caches (and which input topic owns pre-v5 entries),
the runner context, one :class:`~agents_stream.durable.runner.ActionRunner` per agent
binding (its input topic part of every identity), the value codecs, the output sinks and
the dead letters. Hosts never construct these themselves, so a fix or a speed-up of any
of them reaches every host at once.

Lifecycle a host drives:

==========================  ============================================================
``DurableHost(app, ...)``   build everything (no I/O: the producer connects lazily)
``open_partitions``         catch the caches of newly owned partitions up (rebuild)
``bindings[topic].runner``  run a decoded record of ``topic`` (the host applies its
                            error policy around it)
``progress``                the completed-through marker of an input partition
``close_partitions``        release the caches of revoked partitions
``close``                   flush the producer, release the caches
==========================  ============================================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..durable.acks import NO_SERVING
from ..durable.context import ContextConfig
from ..durable.journal import InputProgress
from ..durable.ownership import Ownership
from ..durable.runner import ActionRunner, TimersHook
from ..durable.sink import OutputSink
from ..durable.store import ActionStateStore
from ..durable.twophase import Settler
from ..kafka.config import delivery_timeout_ms, producer_config, transactional_config
from ..kafka.deadline import Deadline
from ..kafka.producer import AckingProducer
from ..kafka.transactions import TransactionalProducer
from ..serde.journal import default_journal_codec
from ..serde.values import ValueCodec, value_codec
from ..state.kafka import KafkaActionStateStore
from .dlq import DeadLetters
from .output_log import OutputLog
from .sink import KafkaOutputSink

if TYPE_CHECKING:  # the App builds hosts (App.test_context); a host only reads it
    from ..app import AgentBinding, App

log = logging.getLogger("agents_stream.host")


@dataclass(frozen=True)
class Binding:
    """One agent on one input topic, as every host runs it."""

    spec: AgentBinding
    runner: ActionRunner
    input_codec: ValueCodec
    output_codec: ValueCodec | None


class DurableHost:
    """The durable machinery of one :class:`~agents_stream.App` on one Kafka cluster.

    Args:
        app: agents, topics, codecs and policies.
        bootstrap: bootstrap servers of the journal, outputs and dead letters.
        data_dir: root of the RocksDB caches (``<data_dir>/action-state/p<N>``).
        worker_id: recorded in every CallResult.
        executor: thread pool of code blocks of sync actions and ``execute_async`` of
            plain functions.
        store: bring your own store (Spark backfill's in-memory snapshot, tests); no
            Kafka store is built then.
        sinks: bring your own output sink per agent input topic (tests, Faust test
            contexts); it receives the binding's outputs even without an output topic.
        produce: build the producer, output sinks and dead letters; False for hosts that
            collect outputs themselves (Spark backfill).
        on_timers: called with timers registered by actions, once durable.
        cancel: the host's stop signal: a cache rebuild ends early once it is set
            (RebuildCancelled from the store's ``assign``).
        ownership: the host's partition holds (``durable/ownership.py``): code blocks,
            journal records and outputs of partitions not held are refused.
        transactions: exactly-once (the worker of an ``exactly_once`` app): outputs,
            dead letters and what a finished record journals go through
            :attr:`transactions`, a transactional producer whose transaction the host
            commits with its offsets (``kafka/transactions.py``); journaled calls stay
            on :attr:`producer`.
        emitted_markers: False: no emitted marker where an agent's sink finds outputs
            in its topic (``ActionRunner``): one journal write fewer per record; a
            recovered ActionDone of the last commit interval is looked up instead. The
            worker turns them off; the Faust host and backfill keep them.
        deadline: bounds every transactional call (``kafka/deadline.py``); the worker
            passes its own, whose blocked calls it counts and reports as not ready.
    """

    def __init__(
        self,
        app: App,
        *,
        bootstrap: str,
        data_dir: str | Path,
        worker_id: str,
        executor: Executor | None = None,
        store: ActionStateStore | None = None,
        sinks: Mapping[str, OutputSink] | None = None,
        produce: bool = True,
        on_timers: TimersHook | None = None,
        cancel: threading.Event | None = None,
        ownership: Ownership | None = None,
        transactions: bool = False,
        emitted_markers: bool = True,
        deadline: Deadline | None = None,
        two_phase: bool = True,
    ) -> None:
        self.app = app
        self.bootstrap = bootstrap
        self.data_dir = Path(data_dir)
        own_sinks = dict(sinks or {})
        self.producer: AckingProducer | None = None
        producer_conf = producer_config(bootstrap, app.producer_config)
        if produce or store is None:
            self.producer = AckingProducer(producer_conf)
        self.transactions: TransactionalProducer | None = None
        if transactions and self.producer is not None:
            txn_conf = transactional_config(producer_conf, f"{app.id}-{worker_id}")
            # A transactional call that takes longer than the transaction may live is
            # moot (the broker aborts it meanwhile): that is the calls' timeout, and the
            # deadline this process enforces on them is a few seconds past it.
            self.transactions = TransactionalProducer(
                txn_conf,
                timeout=max(5.0, int(txn_conf["transaction.timeout.ms"]) / 1000),
                deadline=deadline,
            )
        # Where a finished record's writes go: the open transaction, if any.
        outputs = self.transactions or self.producer
        self.dlq = DeadLetters(outputs, app.id) if produce and outputs else None
        if store is None and self.producer is not None:
            store = KafkaActionStateStore(
                topic=app.action_state_topic,
                producer=self.producer,
                codec=default_journal_codec(app.schema_registry_url, app.action_state_topic),
                data_dir=self.data_dir / "action-state",
                bootstrap=bootstrap,
                cancel=cancel,
                # Only pruning leaves the tombstones the live-entry index is for.
                index_slots=app.prune_completed,
            )
        assert store is not None
        if ownership is not None and isinstance(store, KafkaActionStateStore):
            store.ownership = ownership
        if self.transactions is not None and isinstance(store, KafkaActionStateStore):
            store.use_transactions(self.transactions)
        # Entries journaled before v5 carry no input topic; they belong to the app's first
        # input (an upgraded app had exactly one journal identity space).
        store.legacy_topics = frozenset(app.input_topics[:1])
        self.store: ActionStateStore = store
        # Two-phase calls' obligations (durable/twophase.py): settled once the host
        # tells the settler its durable completed-through markers (``settler.through``)
        # and starts it.
        self.settler: Settler | None = None
        if two_phase:
            self.settler = Settler(
                store,
                app.payload_codec,
                app_id=app.id,
                worker_id=worker_id,
                through=lambda topic, partition: None,
                holds=ownership.holds if ownership is not None else lambda partition: True,
                prune=app.prune_completed,
                acks=self.producer or NO_SERVING,
            )
        self.context = ContextConfig(
            app_id=app.id,
            worker_id=worker_id,
            codec=app.payload_codec,
            strict=app.strict_determinism,
            executor=executor,
            ownership=ownership,
            # The journal's acks are the producer's delivery reports (a worker's loop
            # serves them itself, durable/acks.py).
            acks=self.producer or NO_SERVING,
            two_phase=self.settler,
        )
        self.bindings: dict[str, Binding] = {}
        self._output_logs: list[OutputLog] = []
        for spec in app.agents:
            out_codec = self._codec(spec.output_schema, spec.output) if spec.output else None
            sink = own_sinks.get(spec.input)
            if sink is None and produce and out_codec is not None and outputs:
                assert spec.output is not None
                found = OutputLog(
                    bootstrap,
                    spec.output,
                    app.id,
                    window_s=app.output_scan_window,
                    delivery_timeout=delivery_timeout_ms(producer_conf),
                )
                self._output_logs.append(found)
                if isinstance(store, KafkaActionStateStore):
                    store.on_assign.append(found.stale_on_assign)
                sink = KafkaOutputSink(
                    outputs,
                    spec.output,
                    out_codec,
                    origin=app.id,
                    output_log=found,
                    ownership=ownership,
                )
            runner = ActionRunner(
                spec.agent,
                store,
                self.context,
                sink,
                on_timers=on_timers,
                topic=spec.input,
                # Not where the sink looks outputs up (the marker would only save that
                # lookup), nor in a transaction (an ActionDone's outputs commit in its
                # transaction or a later one; a replay looks them up read_committed).
                emitted_markers=self.transactions is None
                and (emitted_markers or sink is None or not sink.finds_outputs),
                transactional=self.transactions is not None,
            )
            self.bindings[spec.input] = Binding(
                spec, runner, self._codec(spec.input_schema, spec.input), out_codec
            )

    def _codec(self, schema: Any, topic: str) -> ValueCodec:
        return value_codec(
            schema,
            registry_url=self.app.schema_registry_url,
            topic=topic,
            strategy=self.app.subject_name_strategy,
        )

    # -- partitions ---------------------------------------------------------------------
    @property
    def kafka_store(self) -> KafkaActionStateStore | None:
        return self.store if isinstance(self.store, KafkaActionStateStore) else None

    def open_partitions(self, partitions: Iterable[int]) -> int:
        """Catch the caches of ``partitions`` up with the ActionState topic in one pass;
        returns the journal records replayed. Blocking: call it off the event loop."""
        wanted = sorted(set(partitions))
        if self.kafka_store is not None and wanted:
            return self.kafka_store.assign(*wanted)
        return 0

    def close_partitions(self, partitions: Iterable[int]) -> None:
        """Release the caches of revoked partitions."""
        if self.kafka_store is not None:
            for partition in set(partitions):
                self.kafka_store.revoke(partition)

    def progress(self, topic: str, partition: int) -> InputProgress | None:
        """The completed-through marker of input ``topic``/``partition``, if written."""
        return self.store.progress(topic, partition)

    # -- shutdown -----------------------------------------------------------------------
    def close(self) -> None:
        """Flush the producer (every pending journal record, output, dead letter) and
        release the caches."""
        if self.transactions is not None:
            self.transactions.close()
        if self.producer is not None:
            self.producer.close()
        for found in self._output_logs:
            found.close()
        if self.settler is not None:
            self.settler.close()
        self.store.close()
