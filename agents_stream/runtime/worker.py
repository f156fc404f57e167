"""The worker: hosts an App's agents on a Kafka consumer group.

Threads: the asyncio loop runs actions; one "kafka" thread makes every consumer call
(librdkafka consumers are not thread-safe), including rebalance callbacks; the producer's
delivery reports are served between the loop's callbacks.

A worker is its parts, each a module of its own (docs/architecture.md draws them): the
intake (``intake.py``), the held partitions (``partition.py``), the scheduler
(``controller.py``), the commits (``worker_commits.py``), the partition lifecycle
(``worker_rebalance.py``), timers (``timers.py``) and the freeze watchdog
(``watchdog.py``). This module builds them, runs the intake, the commits and the timers
as the loop's tasks, and on shutdown drains, commits and leaves the group.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from ..app import App
from ..durable.ownership import Ownership
from ..durable.pool import CodeBlockPool
from ..durable.twophase import Settler
from ..errors import ConfigurationError, KafkaIOError
from ..host.kit import DurableHost
from ..host.progress import CompletedThrough
from ..host.registry_wait import RegistryWait
from ..kafka.admin import StartupCancelled, TopicAdmin
from ..kafka.config import configure, consumer_config
from ..kafka.deadline import GRACE, Blocked, Deadline
from ..kafka.transactions import TransactionalProducer
from ..state.kafka import KafkaActionStateStore
from .agent_host import AgentHost
from .async_io import AsyncIOHost
from .commit import AtLeastOnceCommit, GroupCommit, TransactionalCommit
from .connectivity import ConnectivityWatch
from .controller import ExecutionController
from .group_protocol import GroupProtocolName, choose_group_protocol
from .intake import Intake
from .partition import Partition
from .timers import Firings, TimerService
from .topics import check_topic_settings, ensure_topics, worker_topics
from .tuning import freeze_startup, loop_factory, record_processing, run_loop, switch_interval
from .watchdog import freeze_after, start_watchdog
from .watermarks import agent_watermarks
from .worker_commits import Commits
from .worker_rebalance import Rebalance

__all__ = ["Worker", "freeze_after", "worker_topics"]

log = logging.getLogger("agents_stream.worker")


class Worker:
    """Runs ``app`` until stopped (SIGTERM/SIGINT or :meth:`stop`).

    Args:
        app: the App to host.
        broker: bootstrap servers (already resolved).
        data_dir: root of the RocksDB caches.
        worker_id: recorded in every CallResult (default host-pid).
        shutdown_timeout: how long in-flight records may finish on shutdown / revoke.
        startup_timeout: how long the cluster may take to answer at startup before the
            worker gives up (KafkaIOError).
        kafka_config_file: librdkafka properties for every client, over
            ``app.kafka_config`` (see :mod:`agents_stream.kafka.config`).
        code_block_threads: over ``app.code_block_threads``.
        group_protocol: ``consumer`` (KIP-848) or ``classic`` (the default; why:
            ``group_protocol.py``).
    """

    def __init__(
        self,
        app: App,
        *,
        broker: str,
        data_dir: str | Path | None = None,
        worker_id: str | None = None,
        shutdown_timeout: float = 10.0,
        max_in_flight: int | None = None,
        startup_timeout: float = 10.0,
        kafka_config_file: str | Path | None = None,
        code_block_threads: int | None = None,
        group_protocol: GroupProtocolName | None = None,
    ) -> None:
        if not app.agents and not app.async_ios:
            raise ConfigurationError(f"app {app.id!r} has no agents or async_io operators")
        self.check_options(app)
        configure(app.kafka_config, kafka_config_file)
        self.startup_timeout = startup_timeout
        # Set by signal handlers: blocking startup calls on the kafka thread check it.
        self._cancel = threading.Event()
        self.app = app
        self.broker = broker
        self.data_dir = Path(data_dir or app.data_dir or ".agents-stream") / app.id
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.shutdown_timeout = shutdown_timeout
        self.max_in_flight = max_in_flight or app.max_in_flight
        self._group_protocol = group_protocol
        self.exit_code = 0
        self.fatal: BaseException | None = None  # what stopped it (_fail)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._kafka = ThreadPoolExecutor(1, thread_name_prefix="agents-stream-kafka")
        self._pool = CodeBlockPool(code_block_threads or app.code_block_threads)
        # Added by the rebalance callbacks once a partition's cache is rebuilt.
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.progress: CompletedThrough | None = None  # host/progress.py (_setup)
        self.settler: Settler | None = None  # durable/twophase.py (_setup)
        self._reset_earliest = True  # auto.offset.reset is earliest (set in _setup)
        self.stats: defaultdict[str, int] = defaultdict(int)
        self.intake = Intake(self)
        # Records the schema registry refused mid-run wait here (host/registry_wait.py).
        self.registry_wait = RegistryWait(self.stats, self.intake.hold_back)
        self.timers = TimerService()
        # Observability (runtime/metrics.py): called with the worker once its clients exist.
        self.setup_hooks: list[Callable[[Worker], None]] = []
        self.rebuilding = 0  # partitions whose caches are being rebuilt (not ready)
        # Holds of the assigned partitions (durable/ownership.py); its freeze limit is
        # set from the consumer's session once the config is known.
        self.ownership = Ownership()
        self.transactions: TransactionalProducer | None = None  # exactly-once (_setup)
        # Blocking client calls (transactions, synchronous commits, close) run under a
        # deadline this worker enforces: past it, one WARNING, a count, not ready.
        self.deadline = Deadline(on_blocked=self._blocked)
        # Parts that read this worker's bookkeeping when they run (what _setup builds).
        self.commits = Commits(self)
        self.rebalance = Rebalance(self)

    # -- public -------------------------------------------------------------------------
    @staticmethod
    def check_options(app: App) -> None:
        """Raise ConfigurationError for settings Kafka would reject, or a malformed
        tuning variable (no I/O)."""
        check_topic_settings(app)
        switch_interval()
        loop_factory()

    def run(self) -> int:
        # GIL switch interval and GC thresholds for record processing: tuning.py.
        with record_processing():
            run_loop(self.run_async())
        return self.exit_code

    def stop(self) -> None:
        """Request a graceful stop; safe from any thread and from signal handlers."""
        self._cancel.set()
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    # Read by the metrics server's thread: plain attribute reads, no locks.
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def ready(self) -> bool:
        """Partitions assigned and their caches rebuilt, and no Kafka client call stuck
        past its deadline since one last returned."""
        return bool(self.partitions) and not self.rebuilding and self.deadline.blocked is None

    # -- setup --------------------------------------------------------------------------
    def _setup(self) -> None:
        app = self.app
        self.admin = TopicAdmin(self.broker, self.startup_timeout, cancel=self._cancel)
        ensure_topics(self.admin, app, self.broker)
        conf = consumer_config(self.broker, app.id, app.consumer_config)
        reset = str(conf.get("auto.offset.reset", "earliest")).lower()
        self._reset_earliest = reset in ("earliest", "smallest", "beginning")
        # The group protocol decides who sets the session (client or broker), and the
        # session how long a freeze may last before every hold is suspended.
        self.group_protocol = choose_group_protocol(self.admin, self._group_protocol, conf)
        self.ownership.freeze_after = freeze_after(self.group_protocol.timing)
        self._heartbeat_s = self.group_protocol.heartbeat_ms / 1000
        # Journal producer, store, runners, sinks and dead letters: the host kit builds
        # them the same way for every host.
        self.kit = DurableHost(
            app,
            bootstrap=self.broker,
            data_dir=self.data_dir,
            worker_id=self.worker_id,
            executor=self._pool,
            on_timers=self.timers.add,
            cancel=self._cancel,
            ownership=self.ownership,
            transactions=app.exactly_once,
            emitted_markers=False,
            deadline=self.deadline,
        )
        assert self.kit.producer is not None and self.kit.dlq is not None
        self.producer = self.kit.producer
        # Exactly-once: the producer of the transactions the commits close (its first
        # one begun here; init fences an older producer of this worker's id).
        self.transactions = self.kit.transactions
        if self.transactions is not None:
            self.transactions.begin()
        # Reports served between the loop's callbacks, not by a thread contending for
        # the GIL with it (kafka/producer.py).
        assert self._loop is not None and self._loop_thread is not None
        self.producer.serve_on(self._loop, self._loop_thread)
        self.dlq = self.kit.dlq
        self.store: KafkaActionStateStore | None = self.kit.kafka_store if app.agents else None
        self.controller = ExecutionController(self.max_in_flight, epoch_mode=app.epoch_mode)
        self._watermarks = agent_watermarks(app)  # FLIP-425 epochs, where needed
        self._agents: dict[str, AgentHost] = {
            topic: AgentHost(
                bound.spec,
                bound.runner,
                bound.input_codec,
                self.dlq,
                on_error=app.on_error,
                stats=self.stats,
                on_fatal=self._fail,
                on_undelivered=self.rebalance.undelivered,
                controller=self.controller,
                registry_wait=self.registry_wait,
            )
            for topic, bound in self.kit.bindings.items()
        }
        self.firings = Firings(
            self.timers, self._agents, self.controller, self.partitions, self.stats
        )
        self._async_ios: dict[str, AsyncIOHost] = {
            aio.input: AsyncIOHost(aio, self.transactions or self.producer, self.dlq, origin=app.id)
            for aio in app.async_ios
        }
        conf["enable.partition.eof"] = True  # arms held timers of caught-up partitions
        conf.setdefault("on_commit", self.commits.commit_done)
        self.consumer = Consumer(conf)
        if self.store is not None:
            self.progress = CompletedThrough(
                self.store, self.worker_id, rerun_completed=app.rerun_completed
            )
            self.settler = self.kit.settler
            if self.settler is not None:  # two-phase commits wait for durable markers
                self.settler.through = self.progress.durable_through
                self.settler.start()
        self.committer: GroupCommit = (
            AtLeastOnceCommit(self.consumer, self.progress, self.shutdown_timeout, self.deadline)
            if self.transactions is None
            else TransactionalCommit(self.consumer, self.transactions, self.store, self.ownership)
        )
        self.rebalance.subscribe(self.consumer, app.input_topics)
        self.group_protocol.announce(conf["group.id"])
        for hook in self.setup_hooks:
            hook(self)
        # A broker that stops answering (a network partition) is learned of as a freeze is.
        self.connectivity = ConnectivityWatch(
            self.ownership, self.producer, lost_after=self.ownership.freeze_after, stats=self.stats
        )
        watch = self.connectivity.tick
        start_watchdog(self.ownership, self._cancel, self._loop, self.rebalance.suspected, watch)

    # -- main loop ----------------------------------------------------------------------
    async def run_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.current_thread()
        self._stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        if self._cancel.is_set():
            return
        try:
            await self._on_kafka(self._setup)
        except StartupCancelled:
            log.info("stopped during startup")
            self._kafka.shutdown(wait=False)
            self._pool.shutdown(wait=False)
            return
        freeze_startup()  # the app, clients and caches live as long as the worker
        log.info(
            "worker %s of app %s on %s: inputs %s, %s (event loop %s, GIL switch %d us)",
            self.worker_id,
            self.app.id,
            self.broker,
            ", ".join(self.app.input_topics),
            "exactly-once" if self.app.exactly_once else "at-least-once",
            type(self._loop).__module__.split(".")[0],
            round(sys.getswitchinterval() * 1e6),
        )
        committer = asyncio.create_task(self.commits.run())
        ticker = asyncio.create_task(self.firings.run())
        try:
            await self.intake.run()
        finally:
            committer.cancel()
            ticker.cancel()
            await self._shutdown()

    async def _on_kafka(self, fn: Any, *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kafka, fn, *args)

    # -- faults -------------------------------------------------------------------------
    def _blocked(self, operation: str, seconds: float) -> None:
        """Any thread: a client call passed its deadline (kafka/deadline.py)."""
        self.stats["kafka_calls_blocked"] += 1

    def _fail(self, exc: BaseException) -> None:
        self.fatal = exc
        self.exit_code = 1
        assert self._stopping is not None
        self._stopping.set()

    # -- shutdown -----------------------------------------------------------------------
    async def _shutdown(self) -> None:
        log.info("stopping: draining %d in-flight records", self.controller.in_flight)
        self.registry_wait.stop()  # records waiting for the schema registry: abandoned now
        # Async I/O operators drain alongside, so their pending retries fire at once.
        closing = [
            asyncio.create_task(h.close(self.shutdown_timeout)) for h in self._async_ios.values()
        ]
        abandoned = await self.controller.drain(None, self.shutdown_timeout)
        await asyncio.gather(*closing, return_exceptions=True)
        if self.exit_code == 0:
            try:
                await self.commits.commit(None)
            except KafkaIOError as exc:
                log.warning("final commit failed: %s", exc)
        try:  # leaving the group asks its coordinator, which may be gone
            await self._on_kafka(
                self.deadline.call,
                "consumer close",
                self.shutdown_timeout + GRACE,
                self.consumer.close,
            )
        except Blocked as exc:
            log.warning("not waiting for the consumer to leave the group: %s", exc)
        await self._loop.run_in_executor(None, self.kit.close)  # type: ignore[union-attr]
        self._kafka.shutdown(wait=False)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.stats:
            self.stats["peak_in_flight"] = self.controller.peak_in_flight
        log.info(
            "stopped (%d abandoned): %s",
            abandoned,
            ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items())) or "no records",
        )
