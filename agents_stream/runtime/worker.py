"""The worker: hosts an App's agents on a Kafka consumer group.

Threads: the asyncio loop runs actions; one "kafka" thread makes every consumer call
(librdkafka consumers are not thread-safe), including rebalance callbacks; the producer's
delivery reports are served between the loop's callbacks.

A worker is its parts, each a module of its own: the held input partitions
(``partition.py``: :class:`Partition`, one object per assignment with its offsets,
finished records, offset-gap check and timer arming), the one scheduler of its records
(``controller.py``), the commit protocol (``worker_commits.py``: :class:`Commits`),
rebuild-on-assign with revoke/lost handling (``worker_rebalance.py``: :class:`Rebalance`),
timers (``timers.py``: :class:`Firings`), the freeze watchdog (``watchdog.py``) and the
topics it checks at start-up (``topics.py``). This module wires them and runs the
consumer loop: consume a batch on the Kafka thread, dispatch each record to its
partition and the controller, and on shutdown drain, commit and leave the group.
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
from pathlib import Path
from typing import Any, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, TopicPartition

from ..app import App
from ..durable.ownership import Ownership
from ..durable.pool import CodeBlockPool
from ..durable.runner import RecordInput
from ..errors import ConfigurationError, KafkaIOError
from ..events import TimerEvent
from ..host.kit import DurableHost
from ..host.progress import CompletedThrough
from ..host.registry_wait import RegistryWait
from ..kafka.admin import AUTHORIZATION_ERRORS, StartupCancelled, TopicAdmin, denied
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
from .partition import Partition
from .timers import Firings, TimerService
from .topics import check_topic_settings, ensure_topics, worker_topics
from .tuning import freeze_startup, loop_factory, record_processing, run_loop, switch_interval
from .watchdog import freeze_after, start_watchdog
from .watermarks import WatermarkGenerator
from .worker_commits import Commits
from .worker_rebalance import Rebalance

__all__ = ["Worker", "freeze_after", "worker_topics"]

log = logging.getLogger("agents_stream.worker")

CONSUME_BATCH = 500  # records per consume call at most
PAUSE_AFTER = 1.0  # seconds without room before the partitions are paused
CONSUME_WAIT = 0.01  # seconds a consume waits for a batch to fill (idle: 100 calls/s)
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
        group_protocol: ``consumer`` (KIP-848) or ``classic``; default: consumer where
            the cluster supports it (see ``group_protocol.py``).
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
        # The held input partitions: added by the rebalance callbacks once a partition's
        # cache is rebuilt, removed on its revoke or loss.
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._rewinding: list[Partition] = []  # partitions whose seek this batch issued
        self._state_refs: defaultdict[int, int] = defaultdict(int)  # journal partition use
        # Completed-through markers (host/progress.py) and the group commit (commit.py),
        # built in _setup once the store and the consumer exist.
        self.progress: CompletedThrough | None = None
        self._paused = False
        # Partitions a registry refusal holds back (host/registry_wait.py): kept paused
        # when the in-flight limit resumes the others.
        self._held_back: set[tuple[str, int]] = set()
        self._reset_earliest = True  # auto.offset.reset is earliest (set in _setup)
        self._rebalances = 0  # bumped by the rebalance callbacks: offset gaps checked again
        self.stats: defaultdict[str, int] = defaultdict(int)
        # Records the schema registry refused mid-run wait here (host/registry_wait.py).
        self.registry_wait = RegistryWait(self.stats, self._hold_back)
        self.timers = TimerService()
        # Observability (runtime/metrics.py): called with the worker once its clients
        # exist; partitions whose caches are being rebuilt (not ready meanwhile).
        self.setup_hooks: list[Callable[[Worker], None]] = []
        self.rebuilding = 0
        # Holds of the assigned partitions (durable/ownership.py); its freeze limit is
        # set from the consumer's session once the config is known. Partitions released
        # after a freeze that the consumer may still hold: taken again once a commit
        # confirms the group membership (worker_rebalance.py).
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

    @property
    def owned_partitions(self) -> frozenset[tuple[str, int]]:
        return frozenset(self.partitions)

    @property
    def paused(self) -> bool:
        return self._paused

    # -- setup --------------------------------------------------------------------------
    def _setup(self) -> None:
        app = self.app
        self.admin = TopicAdmin(self.broker, self.startup_timeout, cancel=self._cancel)
        ensure_topics(self.admin, app, self.broker)
        conf = consumer_config(self.broker, app.id, app.consumer_config)
        reset = str(conf.get("auto.offset.reset", "earliest")).lower()
        self._reset_earliest = reset in ("earliest", "smallest", "beginning")
        # Holds of the assigned partitions, checked before every code block, journal
        # record, output and commit (durable/ownership.py); a freeze of this process
        # long enough for the session to expire suspends them all.
        # The group protocol decides who sets the session (client or broker).
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
        self._agents: dict[str, AgentHost] = {
            topic: AgentHost(
                bound.spec,
                bound.runner,
                bound.input_codec,
                self.dlq,
                on_error=app.on_error,
                stats=self.stats,
                on_fatal=self._fail,
                on_undelivered=self._undelivered,
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
        self.committer: GroupCommit = (
            AtLeastOnceCommit(self.consumer, self.progress, self.shutdown_timeout, self.deadline)
            if self.transactions is None
            else TransactionalCommit(self.consumer, self.transactions, self.store, self.ownership)
        )
        self.consumer.subscribe(
            app.input_topics,
            on_assign=self.rebalance.on_assign,
            on_revoke=self.rebalance.on_revoke,
            on_lost=self.rebalance.on_lost,
        )
        # Issue 54: the worker is otherwise silent until the group assigns it partitions,
        # which after a crash takes the dead member's session: say what it waits for.
        log.info(
            "joining consumer group %s with the %s group protocol (%s): partitions come "
            "once the group rebalances (a member that died without leaving holds its "
            "partitions until its session expires, session timeout %d ms)",
            conf["group.id"],
            self.group_protocol.name,
            self.group_protocol.why,
            self.group_protocol.session_ms,
        )
        for hook in self.setup_hooks:
            hook(self)
        # A broker that stops answering (a network partition) is learned of as a freeze
        # is: connectivity.py.
        self.connectivity = ConnectivityWatch(
            self.ownership,
            self.producer,
            lost_after=self.ownership.freeze_after,
            stats=self.stats,
        )
        start_watchdog(
            self.ownership, self._cancel, self._loop, self._suspected, self.connectivity.tick
        )

    def held(
        self,
        topic: str,
        number: int,
        first_expected: int,
        arm_at: int | None,
        committed: int = -1,
    ) -> Partition:
        """Kafka thread (on assign): the bookkeeping of a partition just taken, before
        any of its records is dispatched."""
        return Partition(
            topic,
            number,
            committed=committed,
            host=self._agents.get(topic),
            watermarks=self._watermarks.get(topic),
            first_expected=first_expected,
            arm_at=arm_at,
            seek=self._rewind,
            stats=self.stats,
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
        serve_due = self.producer.serve_due
        for n, msg in enumerate(msgs):
            if n & 63 == 63:
                serve_due()  # hundreds of records dispatched: acks meanwhile
            err = msg.error()
            if err is None:
                self._dispatch(msg)
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:
                part = self.partitions.get((msg.topic(), msg.partition()))
                if part is not None and part.at_end(msg.offset(), self._rebalances):
                    self.firings.arm(part)
            elif code == KafkaError._MAX_POLL_EXCEEDED:
                # The consumer left the group: every partition may be another member's
                # already. Fenced now; the rebalance callbacks follow.
                self.ownership.suspend(f"max.poll.interval.ms exceeded ({err})")
                self._suspected()
            elif code in AUTHORIZATION_ERRORS:
                self._denied(err)
            else:
                log.warning("consumer error: %s", err)
        if self._rewinding:
            # The seeks of this batch's rewinds run on the Kafka thread before the next
            # consume: what that returns for those partitions is fetched after them.
            for part in self._rewinding:
                part.seeks_issued()
            self._rewinding.clear()

    def _dispatch(self, msg: Message) -> None:
        """One record: to its partition's bookkeeping, then to the controller in its
        key's place in line (its lane runs it, see agent_host.py)."""
        topic, number, offset = msg.topic(), msg.partition(), msg.offset()
        part = self.partitions.get((topic, number))
        if part is None or not part.accept(offset, self._rebalances):
            return  # fetched before a revoke (the new owner consumes it), or a rewind's
        if part.arm_at is not None and offset + 1 >= part.arm_at:
            self.firings.arm(part)
        progress = self.progress
        if progress is not None and progress.skips(topic, number, offset):
            # Finished before (re-consumed after an offset reset or a lost commit):
            # running it again would charge its side effects twice.
            part.skip(offset)
            self.stats["records_skipped_completed"] += 1
            return
        raw_key = msg.key()
        key = raw_key.decode("utf-8", "backslashreplace") if raw_key is not None else ""
        done = partial(part.finish, offset, key)
        host = part.host
        if host is None:
            operator = self._async_ios[topic]
            self.controller.submit(
                ("aio", topic, number, offset), part.tp, lambda: operator.handle(msg), done
            )
            return
        # All agents of an app share memory per key, so they also share key order.
        # Keyless records share neither: each is its own "key" (InputEvent.key == "").
        order_key = key if raw_key is not None else ("", topic, number, offset)
        record = host.prepare(msg, key, number, offset, raw_key is None)
        if record is None:  # a skipped tombstone: finished as it is
            done(True)
        elif type(record) is RecordInput:
            # Run on the partition's lane: the records started together share one
            # journal append and ack wait per group of finished actions.
            self.controller.submit_to(part.lane, order_key, part.tp, record, done)
        else:  # undecodable: dead-lettered in key order
            dead_letter = partial(host.dead_letter, msg, "decode", cast(Exception, record))
            self.controller.submit(order_key, part.tp, dead_letter, done)
        watermarks = part.watermarks
        if watermarks is not None:
            ts_type, ts = msg.timestamp()
            if ts_type != TIMESTAMP_NOT_AVAILABLE:
                watermark = watermarks.on_record(number, ts)
                if watermark is not None:
                    self.controller.watermark(
                        watermark, partial(self.firings.watermark_done, topic)
                    )

    def _rewind(self, part: Partition, offset: int) -> None:
        """Loop thread: fetch ``part`` again from ``offset`` (see Partition.accept)."""
        self._rewinding.append(part)
        assert self._loop is not None
        self._loop.run_in_executor(self._kafka, self._seek, part.tp, offset)

    def _seek(self, tp: tuple[str, int], offset: int) -> None:
        """Kafka thread. A failure (the partition was revoked meanwhile) leaves the gap
        to be taken as real by the next record."""
        try:
            self.consumer.seek(TopicPartition(tp[0], tp[1], offset))
        except Exception as exc:  # KafkaException; nothing to undo
            log.warning("%s[%d]: seek back to %d failed: %s", tp[0], tp[1], offset, exc)

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
            held = self._held_back
            self.consumer.resume([tp for tp in assignment if (tp.topic, tp.partition) not in held])
        self._paused = pause

    def _hold_back(self, topic: str, partition: int, pause: bool) -> None:
        """Loop thread: stop (or restart) fetching one partition while the schema
        registry refuses its records (host/registry_wait.py)."""
        if pause:
            self._held_back.add((topic, partition))
        else:
            self._held_back.discard((topic, partition))
        assert self._loop is not None
        self._loop.run_in_executor(self._kafka, self._pause_one, topic, partition, pause)

    def _pause_one(self, topic: str, partition: int, pause: bool) -> None:
        """Kafka thread. Not held any more (revoked meanwhile): nothing to do."""
        if pause != ((topic, partition) in self._held_back):
            return  # undone before it ran
        try:
            if pause:
                self.consumer.pause([TopicPartition(topic, partition)])
            elif not self._paused:
                self.consumer.resume([TopicPartition(topic, partition)])
        except Exception as exc:  # KafkaException: not assigned any more
            log.debug("%s[%d]: pause=%s skipped: %s", topic, partition, pause, exc)

    # -- faults -------------------------------------------------------------------------
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

    def _undelivered(self, exc: BaseException) -> None:
        """Loop thread: a record's journal or output write was not taken by the cluster
        (timed out in the client after its retries, fenced): the writes after it on that
        partition may be missing too, so every hold is given up and taken again from the
        committed offsets once the group confirms, as after a broker silence
        (connectivity.py). Said once per episode, not per record."""
        self.stats["records_undelivered"] += 1
        if getattr(exc, "code", None) == KafkaError._FATAL and self.transactions is None:
            # The journal producer is unusable for good (an idempotence failure): taking
            # the partitions again would fail the same way. A restart gets a new one.
            if self.fatal is None:
                log.critical("journal producer unusable, stopping: %s", exc)
                self._fail(exc)
            return
        if self.ownership.suspended is None:
            self.ownership.suspend(f"a write to Kafka failed ({exc})")
            self._suspected()

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
