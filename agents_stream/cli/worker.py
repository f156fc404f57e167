"""``agents-stream worker -A module:app``: run the App's agents on a consumer group.

Failures end in one line naming the fix and exit code 1 (tracebacks only with
``--loglevel debug``): the on-call engineer reads the last line of the log.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

from confluent_kafka import KafkaError, KafkaException

from ..app import BROKER_ENV, App
from ..errors import AgentsStreamError, ConfigurationError
from ..kafka.admin import denial
from ..kafka.config import configure, scrub, url_secrets
from ..serde.startup import register_app_schemas
from .common import add_app_args, apply_registry, load_app, positive_int, setup_logging
from .processes import parse_processes

log = logging.getLogger("agents_stream.cli")

EMBEDDED = "embedded"
NO_BROKER = (
    f"no broker configured: pass --broker, set {BROKER_ENV}, or App(broker=...); "
    "--broker embedded for a local in-memory broker"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker for an App",
        description=(
            "Start a worker: consume the App's input topics in its consumer group, run the "
            "agents' actions durably, write outputs. Several workers of one App share the "
            "partitions. A broker must be configured (--broker, AGENTS_STREAM_BROKER or "
            "App(broker=...)); --broker embedded starts a local in-memory development "
            "broker for the worker's lifetime."
        ),
    )
    add_app_args(p)
    p.add_argument(
        "--data-dir",
        default=os.environ.get("AGENTS_STREAM_DATA_DIR"),
        help="directory of the local RocksDB caches (default: App(data_dir) or ./.agents-stream)",
    )
    p.add_argument(
        "--worker-id", default=None, help="id recorded in journal records (default host-pid)"
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="records in flight before partitions pause (default: App(max_in_flight)=6000)",
    )
    p.add_argument(
        "--code-block-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads running code blocks of sync actions: at most N such calls at once, so "
        "calls taking t seconds cap a worker at N/t records/s (default: "
        "App(code_block_threads)=256)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight records may finish on shutdown or rebalance (default 10)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=float(os.environ.get("AGENTS_STREAM_STARTUP_TIMEOUT", "10")),
        help="seconds the cluster may take to answer at startup before the worker gives up "
        "(default 10, $AGENTS_STREAM_STARTUP_TIMEOUT)",
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="replication of topics the worker creates (default: App(replication_factor), "
        "-1 = the broker's default); existing topics are not changed",
    )
    p.add_argument(
        "--min-insync-replicas",
        type=int,
        default=None,
        help="min.insync.replicas of the ActionState topic when the worker creates it "
        "(default: App(min_insync_replicas), else the broker's)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics, /healthz and /readyz on this port (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics port binds (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("AGENTS_STREAM_LOG_FORMAT", "text"),
        help="json: one object per line with ts, level, logger, message and, for a record, "
        "topic, partition, offset, key (default text, $AGENTS_STREAM_LOG_FORMAT)",
    )
    p.add_argument(
        "--processes",
        type=parse_processes,
        default=os.environ.get("AGENTS_STREAM_PROCESSES", "1"),
        metavar="N",
        help="run N worker processes (auto: one per CPU) under this command, each with "
        "<data dir>/process-<i>, metrics port + i and worker id <id>-<i>; a crashed one is "
        "restarted, SIGTERM stops all (default 1, $AGENTS_STREAM_PROCESSES)",
    )
    p.add_argument(
        "--processing-guarantee",
        choices=["at-least-once", "exactly-once"],
        default=os.environ.get("AGENTS_STREAM_PROCESSING_GUARANTEE"),
        help="exactly-once: each commit is one Kafka transaction with the outputs, "
        "ActionDones and input offsets it covers, so read_committed readers see every "
        "output once (Apache Kafka only); default: App(processing_guarantee), which "
        "defaults to at-least-once ($AGENTS_STREAM_PROCESSING_GUARANTEE)",
    )
    p.add_argument(
        "--group-protocol",
        choices=["consumer", "classic"],
        default=os.environ.get("AGENTS_STREAM_GROUP_PROTOCOL") or None,
        help="consumer group protocol: consumer (KIP-848: server-side assignment, a "
        "coordinator move costs no partitions; the broker sets the session) or classic "
        "(default: classic, while KIP-848 is an opt-in here: see docs/operations.md; "
        "logged at start; $AGENTS_STREAM_GROUP_PROTOCOL)",
    )
    p.add_argument(
        "--rerun-completed",
        action="store_true",
        help="DANGER: run records below their partition's completed-through marker again "
        "(after an offset reset they are skipped by default; re-running charges them twice)",
    )
    p.set_defaults(func=run)


class _Terminated(BaseException):
    """SIGTERM before the worker's own handlers are installed (import, broker start)."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated()


def run(args: argparse.Namespace) -> int:
    setup_logging(args.loglevel)
    if getattr(args, "log_format", "text") == "json":
        from ..runtime.logs import use_json_logs

        use_json_logs()
    previous = signal.signal(signal.SIGTERM, _terminate)
    embedded = None
    metrics = None
    app: App | None = None
    try:
        from ..runtime.worker import Worker

        app = load_app(args.app)
        if args.replication_factor is not None:
            app.replication_factor = args.replication_factor
        if args.min_insync_replicas is not None:
            app.min_insync_replicas = args.min_insync_replicas
        if getattr(args, "rerun_completed", False):
            app.rerun_completed = True
        guarantee = getattr(args, "processing_guarantee", None)
        if guarantee:
            app.processing_guarantee = guarantee.replace("-", "_")
        apply_registry(app, args)
        # Checked before anything touches a broker (or starts one).
        Worker.check_options(app)
        broker = _resolve_broker(app, args.broker)
        if broker == EMBEDDED:
            from ..runtime.embedded import EmbeddedBroker

            embedded = EmbeddedBroker().start()
            broker = embedded.bootstrap
            log.warning(
                "started an embedded in-memory broker on %s (development only)", embedded.url
            )
        if getattr(args, "processes", 1) > 1:
            signal.signal(signal.SIGTERM, previous)  # the supervisor installs its own
            return _supervise(args, app, broker if args.broker or embedded else None)
        if app.schema_registry_url:
            # Before any partition is taken: a refused or unreachable registry stops the
            # worker here in one line (nothing consumed, dead-lettered or committed)
            # instead of failing every record it would write (serde/startup.py).
            configure(app.kafka_config, args.kafka_config)  # schema.registry.* settings
            register_app_schemas(app)
        worker = Worker(
            app,
            broker=broker,
            data_dir=args.data_dir,
            worker_id=args.worker_id,
            shutdown_timeout=args.shutdown_timeout,
            max_in_flight=args.max_in_flight,
            code_block_threads=args.code_block_threads,
            startup_timeout=args.startup_timeout,
            kafka_config_file=args.kafka_config,
            group_protocol=getattr(args, "group_protocol", None),
        )
        if args.metrics_port is not None:
            from ..runtime.metrics import serve_metrics

            metrics = serve_metrics(worker, args.metrics_host, args.metrics_port)
        signal.signal(signal.SIGTERM, previous)  # the worker installs its own on its loop
        code = worker.run()
        refused = denial(worker.fatal) if worker.fatal is not None else None
        if refused is not None:  # the last line names the ACL, as startup failures do
            log.critical("worker stopped: %s", _scrub(refused, app))
        return code
    except _Terminated:
        log.info("stopped by SIGTERM during startup")
        return 0
    except AgentsStreamError as exc:
        # One line naming the fix; the traceback only at debug level.
        why = denial(exc) or exc
        log.critical("worker stopped: %s", _scrub(why, app), exc_info=_debug())
        return 1
    except KafkaException as exc:
        if not exc.args or exc.args[0].code() != KafkaError._INVALID_ARG:
            raise
        # librdkafka refused a client configuration (raised where the client is built).
        log.critical(
            "worker stopped: Kafka client configuration rejected: %s; fix --kafka-config, "
            "AGENTS_STREAM_KAFKA_* or App(kafka_config/consumer_config/producer_config)",
            _scrub(exc.args[0].str(), app),
            exc_info=_debug(),
        )
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if metrics is not None:
            metrics.close()
        if embedded is not None:
            embedded.stop()


def _supervise(args: argparse.Namespace, app: App, broker: str | None) -> int:
    """``--processes N``: N children running this command with ``--processes 1``."""
    from pathlib import Path

    from .processes import STARTUP_GRACE, Supervisor, child_args

    # Only what this command was given: a broker from the environment or the App is
    # resolved by each child the same way (and its credentials stay off command lines).
    base = ["-A", args.app, "--loglevel", args.loglevel, "--processes", "1"]
    base += ["--shutdown-timeout", str(args.shutdown_timeout)]
    base += ["--startup-timeout", str(args.startup_timeout)]
    base += ["--metrics-host", args.metrics_host, "--log-format", args.log_format]
    if broker is not None:
        base += ["--broker", broker]
    for flag, value in (
        ("--kafka-config", args.kafka_config),
        ("--max-in-flight", args.max_in_flight),
        ("--code-block-threads", args.code_block_threads),
        ("--replication-factor", args.replication_factor),
        ("--min-insync-replicas", args.min_insync_replicas),
        ("--processing-guarantee", args.processing_guarantee),
        ("--group-protocol", getattr(args, "group_protocol", None)),
        ("--schema-registry", args.schema_registry),
    ):
        if value is not None:
            base += [flag, str(value)]
    if args.rerun_completed:
        base.append("--rerun-completed")
    data_dir = Path(args.data_dir or app.data_dir or ".agents-stream")
    children = [
        child_args(
            base,
            i,
            data_dir=data_dir,
            metrics_port=args.metrics_port,
            worker_id=args.worker_id,
        )
        for i in range(args.processes)
    ]
    supervisor = Supervisor(
        children,
        startup_window=args.startup_timeout + STARTUP_GRACE,
        stop_timeout=args.shutdown_timeout,
    )
    return supervisor.run()


def _debug() -> bool:
    return log.isEnabledFor(logging.DEBUG)


def _scrub(error: object, app: App | None) -> str:
    confs = [app.kafka_config, app.consumer_config, app.producer_config] if app else []
    if app is not None:
        confs.append(url_secrets(app.schema_registry_url))
    return scrub(str(error), *confs)


def _resolve_broker(app: App, override: str | None) -> str:
    choice = override or os.environ.get(BROKER_ENV) or app.broker
    if not choice:
        raise ConfigurationError(NO_BROKER)
    if choice.strip().lower() == EMBEDDED:
        return EMBEDDED
    resolved = app.resolve_broker(override)
    assert resolved is not None
    return resolved
