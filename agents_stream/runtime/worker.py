"""The worker: hosts an App's agents on a Kafka consumer group.

Threads: the asyncio loop runs actions; one "kafka" thread makes every consumer call
(librdkafka consumers are not thread-safe), including rebalance callbacks; the producer
polls delivery reports on its own thread.

The worker is three units, one per module: this one (setup, the consumer loop that
dispatches records to the execution controller, timers, shutdown, and the bookkeeping
of its partitions), the commit protocol (``worker_commits.py``: :class:`Commits`, the
commit loop, completed-through markers, pruning) and rebuild-on-assign with revoke/lost
handling (``worker_rebalance.py``: :class:`Rebalance`). The worker holds one of each
(``worker.commits``, ``worker.rebalance``); each reads the bookkeeping it needs through
a Protocol of its own (``CommitHost``, ``RebalanceHost``) and owns one protocol.

Timers (see ``timers.py``): on assign a partition's live timers are loaded held; the
partition is armed once the consumer reached the input end offset seen at assign (or a
partition EOF). Event-time timers fire when a watermark of their agent's input is
processed (``_watermark_done``), processing-time timers from a ticker task; a firing is
submitted to the controller under its key, like a record (key order, in-flight limit,
and a watermark's firings are part of its epoch), but never touches offsets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from heapq import heappush
from pathlib import Path
from typing import Any, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, TopicPartition

from ..app import App
from ..durable.ackfuture import serve_due
from ..durable.journal import TimerEntry
from ..durable.ownership import Ownership
from ..durable.pool import CodeBlockPool
from ..durable.runner import RecordInput
from ..errors import ConfigurationError, KafkaIOError
from ..events import TimerEvent
from ..host.kit import DurableHost
from ..host.progress import CompletedThrough
from ..kafka.admin import (
    AUTHORIZATION_ERRORS,
    StartupCancelled,
    TopicAdmin,
    TopicSpec,
    compacted,
    denied,
    validate_topic_names,
)
from ..kafka.config import configure, consumer_config
from ..kafka.deadline import GRACE, Blocked, Deadline
from ..kafka.transactions import TransactionalProducer
from ..state.kafka import KafkaActionStateStore
from .agent_host import AgentHost, PartitionLane
from .async_io import AsyncIOHost
from .commit import AtLeastOnceCommit, GroupCommit, TransactionalCommit
from .controller import ExecutionController
from .logs import record_fields
from .offsets import OffsetTracker, PartitionOffsets
from .timers import TimerService
from .tuning import freeze_startup, loop_factory, record_processing, run_loop, switch_interval
from .watermarks import WatermarkGenerator
from .worker_commits import Commits
from .worker_rebalance import Rebalance

log = logging.getLogger("agents_stream.worker")

TIMER_TICK = 0.05  # seconds between processing-time timer checks
CONSUME_BATCH = 500  # records per consume call at most
PAUSE_AFTER = 1.0  # seconds without room before the partitions are paused
CONSUME_WAIT = 0.01  # seconds a consume waits for a batch to fill (idle: 100 calls/s)
WATCHDOG_BEAT = 0.05  # seconds between the freeze watchdog's beats (durable/ownership.py)
SERVE_SATURATED = 1.0  # seconds between consumer polls while no record can be taken


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
        self.exit_code = 0
        self.fatal: BaseException | None = None  # what stopped it (_fail)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._kafka = ThreadPoolExecutor(1, thread_name_prefix="agents-stream-kafka")
        self._pool = CodeBlockPool(code_block_threads or app.code_block_threads)
        self._owned: set[tuple[str, int]] = set()
        self._state_refs: defaultdict[int, int] = defaultdict(int)
        # Finished, not yet committed records per partition: a heap by offset.
        self._finished: defaultdict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        self._routes: dict[tuple[str, int], _Route] = {}  # see _Route
        # Completed-through markers (host/progress.py) and the group commit (commit.py),
        # built in _setup once the store and the consumer exist.
        self.progress: CompletedThrough | None = None
        self._paused = False
        # Offset gaps being checked (see _rewind): partition -> [expected offset, offset
        # seen past it, armed]; and the rebalance generation in which a partition's gap
        # was found real (compaction, transaction markers): not checked again until the
        # next rebalance.
        self._rewinds: dict[tuple[str, int], list[Any]] = {}
        # Agent input partitions just assigned: the group's committed offset (or the
        # low watermark when none is and the consumer starts there), where their first
        # record is expected.
        self._first_expected: dict[tuple[str, int], int] = {}
        self._reset_earliest = True  # auto.offset.reset is earliest (set in _setup)
        self._gaps_real: dict[tuple[str, int], int] = {}
        self._rebalances = 0  # bumped by the rebalance callbacks (Kafka thread)
        self.stats: defaultdict[str, int] = defaultdict(int)
        self.timers = TimerService()
        self._timer_topics: dict[str, str] = {}  # agent name -> its input topic
        self._arm_at: dict[tuple[str, int], int] = {}  # held partition -> input end offset
        # Observability (runtime/metrics.py): called with the worker once its clients
        # exist; partitions whose caches are being rebuilt (not ready meanwhile).
        self.setup_hooks: list[Callable[[Worker], None]] = []
        self.rebuilding = 0
        # Partitions released after a freeze that the consumer may still hold: taken
        # again once a commit confirms the group membership (worker_rebalance.py).
        # Holds of the assigned partitions (durable/ownership.py); its freeze limit is
        # set from the consumer's session once the config is known.
        self.ownership = Ownership()
        self._unconfirmed: set[tuple[str, int]] = set()
        self._verify_at = 0.0
        self.transactions: TransactionalProducer | None = None  # exactly-once (_setup)
        # Blocking client calls (transactions, synchronous commits, close) run under a
        # deadline this worker enforces: past it, one WARNING, a count, not ready.
        self.deadline = Deadline(on_blocked=self._blocked)
        self._last_poll = time.monotonic()
        # The commit protocol and the partition lifecycle: parts of this worker that read
        # its bookkeeping when they run (so what _setup builds later is what they see).
        self.commits = Commits(self)
        self.rebalance = Rebalance(self)

    # -- public -------------------------------------------------------------------------
    @staticmethod
    def check_options(app: App) -> None:
        """Raise ConfigurationError for settings Kafka would reject, or a malformed
        tuning variable (no I/O)."""
        validate_topic_names(worker_topics(app))
        _check_replication(app)
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
        """Partitions assigned and their caches rebuilt (``_owned`` is filled after),
        and no Kafka client call stuck past its deadline since one last returned."""
        return bool(self._owned) and not self.rebuilding and self.deadline.blocked is None

    @property
    def owned_partitions(self) -> frozenset[tuple[str, int]]:
        return frozenset(self._owned)

    @property
    def paused(self) -> bool:
        return self._paused

    # -- setup --------------------------------------------------------------------------
    def _setup(self) -> None:
        app = self.app
        self.admin = TopicAdmin(self.broker, self.startup_timeout, cancel=self._cancel)
        inputs = app.input_topics
        rf = app.replication_factor
        counts = self.admin.ensure([TopicSpec(t, app.partitions, replication=rf) for t in inputs])
        state_partitions = max(counts[b.input] for b in app.agents) if app.agents else 1
        outputs = [b.output for b in app.agents if b.output] + [b.output for b in app.async_ios]
        state = compacted(app.action_state_topic, state_partitions, rf, app.min_insync_replicas)
        counts.update(
            self.admin.ensure(
                [TopicSpec(t, app.partitions, replication=rf) for t in outputs]
                + [TopicSpec(f"{t}-dlq", counts[t], replication=rf) for t in inputs]
                + ([state] if app.agents else [])
            )
        )
        if app.agents:
            self._check_action_state(counts)
        if app.exactly_once:
            self._check_transactions()
        conf = consumer_config(self.broker, app.id, app.consumer_config)
        reset = str(conf.get("auto.offset.reset", "earliest")).lower()
        self._reset_earliest = reset in ("earliest", "smallest", "beginning")
        # Holds of the assigned partitions, checked before every code block, journal
        # record, output and commit (durable/ownership.py); a freeze of this process
        # long enough for the session to expire suspends them all.
        self.ownership.freeze_after = freeze_after(conf)
        self._heartbeat_s = float(conf.get("heartbeat.interval.ms", 3000)) / 1000
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
        # Event time per agent input topic, from record timestamps (FLIP-425 epochs).
        # Only where something waits for it: an agent with an action for TimerEvent (its
        # event-time timers fire at watermarks), or every agent in strict epoch mode
        # (records wait for watermarks). Elsewhere a record pays nothing for event time.
        self._watermarks = {
            b.input: WatermarkGenerator(app.out_of_orderness_ms, app.idle_timeout_ms)
            for b in app.agents
            if app.epoch_mode == "strict"
            or any(issubclass(TimerEvent, a.listens) for a in b.agent.actions())
        }
        self.event_time: dict[str, int] = {}
        self.offsets = OffsetTracker()
        self._agents: dict[str, AgentHost] = {}
        for topic, bound in self.kit.bindings.items():
            binding = bound.spec
            if binding.name in self._timer_topics:
                log.warning(
                    "agent %s is bound to several inputs; its timers fire for %s only",
                    binding.name,
                    self._timer_topics[binding.name],
                )
            else:
                self._timer_topics[binding.name] = topic
            self._agents[topic] = AgentHost(
                binding,
                bound.runner,
                bound.input_codec,
                self.dlq,
                on_error=app.on_error,
                stats=self.stats,
                on_fatal=self._fail,
                controller=self.controller,
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
        self.committer: GroupCommit = (
            AtLeastOnceCommit(self.consumer, self.progress, self.shutdown_timeout, self.deadline)
            if self.transactions is None
            else TransactionalCommit(self.consumer, self.transactions, self.store, self.ownership)
        )
        self.consumer.subscribe(
            inputs,
            on_assign=self.rebalance.on_assign,
            on_revoke=self.rebalance.on_revoke,
            on_lost=self.rebalance.on_lost,
        )
        for hook in self.setup_hooks:
            hook(self)
        self._start_watchdog()

    def _check_action_state(self, counts: dict[str, int]) -> None:
        """An existing ActionState topic must be co-partitioned with every agent input (a
        record's journal lives in its input partition's number) and compacted (the
        journal of a live key must never expire)."""
        topic = self.app.action_state_topic
        for b in self.app.agents:
            if counts[topic] < counts[b.input]:
                raise ConfigurationError(
                    f"ActionState topic {topic} has {counts[topic]} partitions but input "
                    f"{b.input} has {counts[b.input]}: give {topic} at least "
                    f"{counts[b.input]} partitions (kafka-topics --alter) or use a new app id"
                )
        try:
            policy = self.admin.topic_config(topic).get("cleanup.policy", "")
        except KafkaIOError as exc:  # e.g. no DescribeConfigs permission: cannot tell
            log.warning("cannot verify that %s is compacted (%s); make sure it is", topic, exc)
            return
        if "compact" not in policy.split(","):
            raise ConfigurationError(
                f"ActionState topic {topic} has cleanup.policy={policy or 'unset'}: set "
                f"cleanup.policy=compact on it (kafka-configs --alter --add-config "
                "cleanup.policy=compact)"
            )

    def _check_transactions(self) -> None:
        """Exactly-once needs isolating transactions; the embedded broker's are not (its
        ``read_committed`` readers see aborted records), so it is refused, not trusted."""
        cluster = self.admin.cluster_id() or ""
        if cluster.startswith("tansu"):
            raise ConfigurationError(
                f"processing_guarantee=exactly_once needs Apache Kafka: the broker at "
                f"{self.broker} is the embedded one (cluster {cluster!r}), whose "
                "transactions do not hide aborted records; use --processing-guarantee "
                "at-least-once with it"
            )

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
            "worker %s of app %s on %s: inputs %s (event loop %s, GIL switch %d us)",
            self.worker_id,
            self.app.id,
            self.broker,
            ", ".join(self.app.input_topics),
            type(self._loop).__module__.split(".")[0],
            round(sys.getswitchinterval() * 1e6),
        )
        committer = asyncio.create_task(self.commits.run())
        ticker = asyncio.create_task(self._timer_loop())
        try:
            await self._consume_loop()
        finally:
            committer.cancel()
            ticker.cancel()
            await self._shutdown()

    async def _on_kafka(self, fn: Any, *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kafka, fn, *args)

    async def _consume_loop(self) -> None:
        """Consume while the controller has room; pause the partitions only when it has
        had none for ``PAUSE_AFTER`` seconds.

        Why not pause at once: librdkafka drops a paused partition's prefetched records
        and fetches them again on resume. Draining a backlog fills the in-flight limit
        every few hundred milliseconds; pausing each time stalled the worker for the
        refetch (0.3-0.5 s on the embedded broker, every cycle). Short saturation keeps
        the prefetch (bounded by librdkafka's ``queued.max.messages.kbytes``); slow
        actions holding every slot for longer still stop the fetching. Below the low-water
        mark the loop waits for more room instead of consuming a few records per thread
        hop."""
        assert self._stopping is not None
        controller = self.controller
        low_water = max(1, min(CONSUME_BATCH, self.max_in_flight // 8))
        saturated_since: float | None = None
        while not self._stopping.is_set():
            slots = controller.free_slots
            if slots < low_water and controller.in_flight > 0:
                now = time.monotonic()
                if saturated_since is None:
                    saturated_since = now
                elif not self._paused and now - saturated_since >= PAUSE_AFTER:
                    await self._on_kafka(self._pause, True)
                elif self._paused and now - self._last_poll >= SERVE_SATURATED:
                    # Paused partitions return no records; the poll serves rebalance
                    # callbacks (a revoke waits for them) and max.poll.interval.ms.
                    self._handle(await self._on_kafka(self._consume, 1))
                try:
                    await asyncio.wait_for(controller.wait_for_slots(low_water), 0.2)
                except TimeoutError:
                    pass
                continue
            saturated_since = None
            if self._paused:
                await self._on_kafka(self._pause, False)
            if slots == 0:  # records waiting for admission, none in flight: a moment
                await asyncio.sleep(0.01)
                continue
            self._handle(await self._on_kafka(self._consume, min(slots, CONSUME_BATCH)))

    def _handle(self, msgs: list[Message]) -> None:
        for n, msg in enumerate(msgs):
            if n & 63 == 63:
                serve_due()  # hundreds of records dispatched: acks meanwhile
            err = msg.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    if self._at_end((msg.topic(), msg.partition()), msg.offset()):
                        self._arm((msg.topic(), msg.partition()))
                elif code == KafkaError._MAX_POLL_EXCEEDED:
                    # The consumer left the group: every partition may be another
                    # member's already. Fenced now; the rebalance callbacks follow.
                    self.ownership.suspend(f"max.poll.interval.ms exceeded ({err})")
                    self._suspected()
                elif code in AUTHORIZATION_ERRORS:
                    self._denied(err)
                else:
                    log.warning("consumer error: %s", err)
                continue
            self._dispatch(msg)
        # The seeks of this batch's rewinds run on the Kafka thread before the next
        # consume: what that returns for those partitions is fetched after them.
        for rewind in self._rewinds.values():
            rewind[2] = True

    def _consume(self, most: int) -> list[Message]:
        """Up to ``most`` records, waiting at most ``CONSUME_WAIT`` for the first one.

        consume(n, timeout) returns early only with a full batch, so one call with a
        timeout made a record arriving alone wait that timeout before it ran (10 ms,
        100 ms before that). What is there is taken at once; with nothing there, the
        wait ends at the first record, and whatever came with it is taken too."""
        consumer = self.consumer
        self._last_poll = time.monotonic()
        if self._unconfirmed and self._last_poll >= self._verify_at:
            self.rebalance.confirm()  # partitions released after a freeze: still this member's?
        msgs: list[Message] = consumer.consume(most, 0)
        if msgs or most <= 1:
            return msgs or consumer.consume(1, CONSUME_WAIT)
        first: list[Message] = consumer.consume(1, CONSUME_WAIT)
        return first + consumer.consume(most - 1, 0) if first else first

    def _pause(self, pause: bool) -> None:
        assignment = self.consumer.assignment()
        if pause:
            self.consumer.pause(assignment)
        else:
            self.consumer.resume(assignment)
        self._paused = pause

    def _dispatch(self, msg: Message) -> None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        tp = (topic, partition)
        if tp not in self._owned:
            return  # fetched before a revoke: the new owner consumes it
        if self._rewinds and not self._rewound(tp, offset):
            return
        route = self._routes.get(tp)
        if route is None or route.stale:
            route = self._routes[tp] = self._route(topic, partition)
        tracker = route.tracker
        expected = tracker.next
        if expected < 0 and self._first_expected:
            expected = self._first_expected.pop(tp, -1)
        # expected 0: the first record of a partition without a committed offset, due
        # at offset 0 (its low watermark, see timers.input_end); -1: unknown.
        if offset > expected >= 0:
            # Offsets skipped since the last record of this partition (or its committed
            # offset): compaction or transaction markers in the input, or records the
            # client never handed over, which the commit would pass (see
            # docs/operations.md, offset gaps).
            if self._gaps_real.get(tp) != self._rebalances:
                if tracker.next < 0:  # checked again once fetched from there
                    self._first_expected[tp] = expected
                self._rewind(tp, expected, offset)
                return
            self.stats["offset_gaps"] += 1
        raw_key = msg.key()
        key = raw_key.decode("utf-8", "backslashreplace") if raw_key is not None else ""
        tracker.start(offset)
        if self._arm_at:
            arm_at = self._arm_at.get(tp)
            if arm_at is not None and offset + 1 >= arm_at:
                self._arm(tp)
        progress = self.progress
        if progress is not None and progress.skips(topic, partition, offset):
            # Finished before (re-consumed after an offset reset or a lost commit):
            # running it again would charge its side effects twice.
            tracker.finish(offset)
            self.stats["records_skipped_completed"] += 1
            return
        kept, finished, stats = route.kept, route.finished, self.stats

        def done(ok: bool) -> None:
            if ok:
                tracker.finish(offset)
                # A dead letter's journal is kept for its replay (host/dlq.py).
                if not (kept and kept.release(partition, offset)):
                    heappush(finished, (offset, key))
                stats["records"] += 1

        host = route.host
        if host is not None:
            # All agents of an app share memory per key, so they also share key order.
            # Keyless records share neither: each is its own "key" (InputEvent.key == "").
            order_key = key if raw_key is not None else ("", topic, partition, offset)
            record = host.prepare(msg, key, partition, offset, raw_key is None)
            if record is None:  # a skipped tombstone: finished as it is
                done(True)
            elif type(record) is RecordInput:
                # Run on the partition's lane: the records started together share one
                # journal append and ack wait per group of finished actions.
                assert route.lane is not None
                self.controller.submit_to(route.lane, order_key, tp, record, done)
            else:  # undecodable: dead-lettered in key order
                error = cast(Exception, record)
                dead_letter = partial(host.dead_letter, msg, "decode", error)
                self.controller.submit(order_key, tp, dead_letter, done)
            watermarks = route.watermarks
            if watermarks is not None:
                ts_type, ts = msg.timestamp()
                if ts_type != TIMESTAMP_NOT_AVAILABLE:
                    watermark = watermarks.on_record(partition, ts)
                    if watermark is not None:
                        self.controller.watermark(watermark, partial(self._watermark_done, topic))
        else:
            operator = self._async_ios[topic]
            self.controller.submit(
                ("aio", topic, partition, offset), tp, lambda: operator.handle(msg), done
            )

    def _route(self, topic: str, partition: int) -> _Route:
        host = self._agents.get(topic)
        return _Route(
            self.offsets.get(topic, partition),
            self._finished[(topic, partition)],
            host,
            host.lane(partition) if host is not None else None,
            self._watermarks.get(topic),
        )

    def _rewind(self, tp: tuple[str, int], expected: int, seen: int) -> None:
        """Fetch ``tp`` again from ``expected``: a record at ``seen`` came after a gap
        (past the previous record, or past the committed offset for the first record of
        an assignment).

        Why: on a Kafka-protocol broker tested here, librdkafka handed a kept partition's
        records over with a hole at a cooperative rebalance (partition EOF on, a short
        fetch wait); the commit would then pass the missing records, lost. One seek back
        tells a skipped record (it comes back) from an offset that holds none (compaction,
        transaction markers: the same gap again). A partition whose gap was real is not
        checked again until the next rebalance, so a compacted or transactional input
        pays one seek per partition per rebalance. The records fetched before the seek
        are dropped (``_rewound``)."""
        self._rewinds[tp] = [expected, seen, False]
        assert self._loop is not None
        self._loop.run_in_executor(self._kafka, self._seek, tp, expected)

    def _at_end(self, tp: tuple[str, int], end: int) -> bool:
        """A partition EOF at ``end``: whether ``tp`` is really caught up there.

        Its end is also checked for a gap, since no later record may reveal one: on
        Apache Kafka 4.1 librdkafka 2.12.1 skipped the only record of a partition that
        was empty when assigned and kept through a cooperative rebalance (the worker
        saw just the EOF after it). A partition being fetched again is not at its end
        until the fetch reaches ``end`` with nothing before it (offsets without
        records, e.g. a transaction marker: the gap is real)."""
        rewind = self._rewinds.get(tp)
        if rewind is not None:
            expected, seen, armed = rewind
            if not armed or end < seen:
                return False
            del self._rewinds[tp]
            self._gaps_real[tp] = self._rebalances
            return True
        if tp not in self._owned:
            return False
        tracker = self.offsets.partitions.get(tp)
        expected = tracker.next if tracker is not None else -1
        if expected < 0:
            expected = self._first_expected.get(tp, -1)
        if end > expected >= 0 and self._gaps_real.get(tp) != self._rebalances:
            self._rewind(tp, expected, end)
            return False
        return True

    def _seek(self, tp: tuple[str, int], offset: int) -> None:
        """Kafka thread. A failure (the partition was revoked meanwhile) leaves the gap
        to be taken as real by the next record."""
        try:
            self.consumer.seek(TopicPartition(tp[0], tp[1], offset))
        except Exception as exc:  # KafkaException; nothing to undo
            log.warning("%s[%d]: seek back to %d failed: %s", tp[0], tp[1], offset, exc)

    def _rewound(self, tp: tuple[str, int], offset: int) -> bool:
        """Whether a record of ``tp`` at ``offset`` is processed; a partition being
        rewound drops the records fetched before its seek."""
        rewind = self._rewinds.get(tp)
        if rewind is None:
            return True
        expected, seen, armed = rewind
        if not armed or offset < expected:
            return False
        del self._rewinds[tp]
        if offset < seen:
            self.stats["offset_gaps_recovered"] += 1
            log.warning(
                "%s[%d]: the client skipped offsets %d-%d (fetched again; they would "
                "have been committed past)",
                tp[0], tp[1], expected, seen - 1,
                extra=record_fields(tp[0], tp[1], offset, None),
            )  # fmt: skip
        else:  # nothing there: counted as a gap by the caller, not checked again
            self._gaps_real[tp] = self._rebalances
        return True

    def _watermark_done(self, topic: str, watermark: int) -> None:
        """Every record before this watermark has finished: event time has advanced, and
        the event-time timers of the topic's agent up to it fire."""
        self.event_time[topic] = watermark
        self.stats["watermarks"] += 1
        binding = self._agents[topic].binding
        for timer in self.timers.due_event(binding.name, watermark):
            self._fire(topic, timer)

    # -- timers ---------------------------------------------------------------------------
    async def _timer_loop(self) -> None:
        while True:
            await asyncio.sleep(TIMER_TICK)
            for timer in self.timers.due_processing(int(time.time() * 1000)):
                topic = self._timer_topics.get(timer.agent)
                if topic is not None:
                    self._fire(topic, timer)

    def _fire(self, topic: str, timer: TimerEntry) -> None:
        """Submit a firing in the key's place in line; it does not touch offsets."""
        if (topic, timer.partition) not in self._owned:
            return
        work = lambda: self._agents[topic].handle_timer(timer)  # noqa: E731
        self.controller.submit(timer.key, (topic, timer.partition), work, _ignore)

    def _load_timers(
        self,
        topic: str,
        partition: int,
        timers: list[TimerEntry],
        arm_at: int | None,
        committed: int = -1,
    ) -> None:
        if committed >= 0:  # its first record is checked for a gap like any other
            self._first_expected[(topic, partition)] = committed
        name = self._agents[topic].name
        self.timers.load(name, partition, timers, armed=arm_at is None)
        if arm_at is not None:
            self._arm_at[(topic, partition)] = arm_at

    def _arm(self, tp: tuple[str, int]) -> None:
        self._arm_at.pop(tp, None)
        if tp[0] in self._agents and self.timers.arm(self._agents[tp[0]].name, tp[1]):
            log.info("timers of %s[%d] armed (uncommitted input re-consumed)", *tp)

    # -- freeze watchdog (durable/ownership.py) -----------------------------------------
    def _start_watchdog(self) -> None:
        """A daemon thread beats the ownership every ``WATCHDOG_BEAT``; after a gap over
        its ``freeze_after`` (SIGSTOP, a VM pause) every hold is suspended by that beat,
        and the loop is told to release them and ask the group."""
        ownership, cancel, loop = self.ownership, self._cancel, self._loop
        assert loop is not None
        # The clock starts now: a start-up longer than the freeze limit (transactions
        # initialising on a new three-node cluster took 12 s) is not a freeze.
        ownership.resume()

        def watch() -> None:
            while not cancel.wait(WATCHDOG_BEAT):
                suspensions = ownership.suspensions
                ownership.beat()
                if ownership.suspensions != suspensions:
                    try:
                        loop.call_soon_threadsafe(self._suspected)
                    except RuntimeError:  # the loop is closed: stopping anyway
                        return

        threading.Thread(target=watch, name="agents-stream-watchdog", daemon=True).start()

    def _suspected(self) -> None:
        """Loop thread: every hold is suspect (a freeze, or the consumer left the group).
        Nothing of them runs or is written meanwhile (the checks fail); the Kafka thread
        releases them and asks the group."""
        why = self.ownership.suspended
        if why is None:
            return
        self.stats["ownership_suspensions"] += 1
        log.warning("%s: every partition is treated as lost until the group confirms", why)
        assert self._loop is not None
        self._loop.run_in_executor(self._kafka, self.rebalance.after_freeze)

    def _denied(self, err: KafkaError) -> None:
        """The group or an input refused by the cluster's authorizer: stop, in one line."""
        self.exit_code = 1
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            line = denied(
                f"the consumer group {self.app.id} ({err.str()})",
                f"Read and Describe on group {self.app.id}",
            )
        else:
            topics = ", ".join(self.app.input_topics)
            line = denied(f"reading its inputs ({err.str()})", f"Read and Describe on {topics}")
        raise KafkaIOError(line, code=err.code())

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


def freeze_after(conf: dict[str, Any]) -> float:
    """Seconds of freeze after which this member's session may have expired: the last
    heartbeat came up to one interval before the freeze began, and the coordinator
    expires the session ``session.timeout.ms`` after it (half an interval of margin)."""
    session = float(conf.get("session.timeout.ms", 45000))
    heartbeat = float(conf.get("heartbeat.interval.ms", 3000))
    return max(1.0, (session - 1.5 * heartbeat) / 1000)


def _check_replication(app: App) -> None:
    rf, isr = app.replication_factor, app.min_insync_replicas
    if rf == 0 or rf < -1:
        raise ConfigurationError(
            f"replication factor {rf} is invalid: use -1 (the broker's default) or >= 1"
        )
    if isr is not None and (isr < 1 or (rf > 0 and isr > rf)):
        raise ConfigurationError(
            f"min.insync.replicas {isr} is invalid for replication factor {rf}: use "
            "1 <= min.insync.replicas <= replication factor"
        )


def worker_topics(app: App) -> list[str]:
    """Every topic a worker of ``app`` reads or writes."""
    topics = list(app.input_topics) + [f"{t}-dlq" for t in app.input_topics]
    topics += [b.output for b in app.agents if b.output] + [b.output for b in app.async_ios]
    if app.agents:
        topics.append(app.action_state_topic)
    return topics


class _Route:
    """What the records of one owned partition are dispatched with, looked up once per
    record: made at its first record after an assignment, dropped when the partition is
    forgotten (``worker_rebalance.py``), made again once a drain stopped its lane."""

    __slots__ = ("finished", "host", "kept", "lane", "tracker", "watermarks")

    def __init__(
        self,
        tracker: PartitionOffsets,
        finished: list[tuple[int, str]],
        host: AgentHost | None,
        lane: PartitionLane | None,
        watermarks: WatermarkGenerator | None,
    ) -> None:
        self.tracker = tracker
        self.finished = finished  # the partition's heap of finished, uncommitted records
        self.host = host
        self.kept = host.kept if host is not None else None
        self.lane = lane
        self.watermarks = watermarks

    @property
    def stale(self) -> bool:
        return self.lane is not None and self.lane.stopped


def _ignore(ok: bool) -> None:
    """A timer firing's end: nothing to commit (the timer tombstone is its commit)."""
