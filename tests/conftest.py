"""Session fixtures: one broker subprocess of each chosen kind (--broker) for the whole run,
unique topic names."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import settings

from agents_stream.testing import BrokerStartError, EmbeddedBroker
from agents_stream.testing.kafka import KafkaBroker, KafkaUnavailable, kafka_missing
from agents_stream.testing.process import WorkerProcess
from agents_stream.testing.registry import RegistryServer, registry_missing

# No per-example deadline for any property test: on the 2-core CI machine, under a broker
# test's load, one example of a RocksDB model took 288 ms against hypothesis' default 200
# ms and failed the run as "unreliable timings" (the example itself passes). Examples
# stay bounded by pytest-timeout; slowness is the benches' business, not a test's.
settings.register_profile("agents_stream", deadline=None)
settings.load_profile("agents_stream")

ROOT = Path(__file__).resolve().parents[1]
_names = itertools.count()


BrokerKind = Literal["embedded", "kafka"]
KINDS: tuple[BrokerKind, ...] = ("embedded", "kafka")


class _Embedded(EmbeddedBroker):
    """The embedded broker, saying which kind it is (tests branch on ``broker.kind``)."""

    kind: BrokerKind = "embedded"


@dataclass
class _External:
    """The cluster named by AGENTS_STREAM_TEST_BROKER: addresses only, never started. Taken
    to be Apache Kafka (that is what the override is for)."""

    host: str
    port: int
    kind: BrokerKind = "kafka"
    pid: None = None
    log_file: None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"


AnyBroker = _Embedded | KafkaBroker | _External


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    if not pluginmanager.hasplugin("timeout"):
        # pyproject's `timeout = 300` is pytest-timeout's (a dev dependency); without the
        # plugin pytest warned "Unknown config option: timeout" on every run. Declared
        # here it is read by nobody: tests then run without a time limit.
        parser.addini("timeout", "per-test time limit in seconds (pytest-timeout's)")
    parser.addoption(
        "--broker",
        choices=["embedded", "kafka", "both"],
        default=None,
        help="broker(s) the `broker` fixture runs tests against (default: "
        "$AGENTS_STREAM_TEST_BROKERS or embedded); kafka starts Apache Kafka from Maven "
        "Central jars (needs java 17+, and mvn for the first fetch)",
    )
    parser.addoption(
        "--kafka-paths",
        default=None,
        help="with several brokers: comma-separated test paths (e.g. tests/integration,"
        "tests/fault) whose broker tests also run on Apache Kafka; the others run on the "
        "embedded broker only, kafka_only tests on Kafka wherever they are (default: "
        "$AGENTS_STREAM_TEST_KAFKA_PATHS, else every path)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kafka_only: needs Apache Kafka (compaction, restarts...); skips on embedded"
    )
    config.addinivalue_line(
        "markers",
        "kafka_proof: a long guarantee proof; with several brokers it runs on Apache Kafka "
        "only (DESIGN.md: the broker the guarantees are proven on), alone on embedded",
    )


def _external() -> _External | None:
    external = os.environ.get("AGENTS_STREAM_TEST_BROKER")
    if not external:
        return None
    host, _, port = external.removeprefix("kafka://").rpartition(":")
    return _External(host, int(port))


def broker_kinds(config: pytest.Config) -> list[BrokerKind]:
    """Kinds chosen by --broker, else AGENTS_STREAM_TEST_BROKERS ("kafka", "both",
    "embedded,kafka"); an external cluster replaces them all."""
    if _external() is not None:
        return ["kafka"]
    chosen = config.getoption("--broker") or os.environ.get("AGENTS_STREAM_TEST_BROKERS")
    chosen = (chosen or "embedded").strip().lower()
    names = list(KINDS) if chosen == "both" else [n.strip() for n in chosen.split(",")]
    bad = [n for n in names if n not in KINDS]
    if bad or not names:
        raise pytest.UsageError(
            f"unknown broker kind(s) {bad}: use embedded, kafka or both "
            "(--broker / AGENTS_STREAM_TEST_BROKERS)"
        )
    return [k for k in KINDS if k in names]


def pytest_report_header(config: pytest.Config) -> str:
    external = _external()
    where = f" (external {external.url})" if external else ""
    return f"brokers: {', '.join(broker_kinds(config))}{where}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With several kinds, every test that uses `broker` runs once per kind (ids
    ``[embedded]`` / ``[kafka]``); kafka_only tests only on Kafka. With one kind nothing
    is parametrized, so test ids stay as they were."""
    if "broker" not in metafunc.fixturenames:
        return
    chosen = broker_kinds(metafunc.config)
    if len(chosen) == 1:
        return
    # A kafka_proof test (chaos, failover, zombie...) also runs on the embedded broker when
    # that is the only one chosen (a Python-only machine); beside Kafka it would double a
    # minutes-long run on a broker whose slow group joins prove nothing more.
    marker = metafunc.definition.get_closest_marker
    kafka_only = marker("kafka_only") is not None or marker("kafka_proof") is not None
    kinds = ["kafka"] if kafka_only else chosen
    if not kafka_only and not _on_kafka(metafunc.config, Path(str(metafunc.definition.path))):
        kinds = [k for k in chosen if k != "kafka"]  # not among --kafka-paths: embedded only
    metafunc.parametrize("broker", kinds, indirect=True, scope="session")


def _kafka_required() -> bool:
    return os.environ.get("AGENTS_STREAM_TEST_REQUIRE_KAFKA", "") not in ("", "0")


def _on_kafka(config: pytest.Config, path: Path) -> bool:
    """Whether broker tests in ``path`` run on Kafka too (see --kafka-paths)."""
    chosen = config.getoption("--kafka-paths") or os.environ.get("AGENTS_STREAM_TEST_KAFKA_PATHS")
    if not chosen:
        return True
    roots = [(ROOT / p.strip()).resolve() for p in chosen.split(",") if p.strip()]
    return any(path.resolve().is_relative_to(r) for r in roots)


def _item_kind(item: pytest.Item, kinds: list[BrokerKind]) -> BrokerKind | None:
    """The broker kind a collected test runs on (None: it does not use `broker`)."""
    if "broker" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("broker") if callspec is not None else None
    return param or kinds[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kinds = broker_kinds(config)
    if "kafka" not in kinds:
        skip = pytest.mark.skip(reason="needs Apache Kafka: run with --broker=kafka (or both)")
        for item in items:
            if item.get_closest_marker("kafka_only"):
                item.add_marker(skip)
        return
    # No java, or no jars and no mvn: the Kafka runs skip, all under one line naming the fix
    # (CI, which must run them, sets AGENTS_STREAM_TEST_REQUIRE_KAFKA: the run fails).
    missing = None if _external() is not None else kafka_missing()
    if missing is not None and _kafka_required():
        raise pytest.UsageError(f"Apache Kafka is required here but unavailable: {missing}")
    if missing is not None:
        skip = pytest.mark.skip(reason=f"Apache Kafka unavailable: {missing}")
        for item in items:
            if _item_kind(item, kinds) == "kafka":
                item.add_marker(skip)


class _Brokers:
    """One broker of each kind per session, started on first use, stopped at the end.
    Parametrized session fixtures may be torn down and set up again when pytest cannot
    group all tests of one kind together; the brokers outlive that."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._started: dict[BrokerKind, _Embedded | KafkaBroker] = {}
        self._unavailable: str | None = None
        self._failed: BrokerStartError | None = None

    def get(self, kind: BrokerKind) -> AnyBroker:
        external = _external()
        if external is not None:
            return external
        if kind in self._started:
            return self._started[kind]
        if kind == "embedded":
            embedded = _Embedded(log_file=self._base / "tansu.log")
            embedded.start()
            self._started[kind] = embedded
            return embedded
        if self._unavailable is not None:
            pytest.skip(self._unavailable)
        if self._failed is not None:  # one start attempt per session, not one per test
            raise self._failed
        kafka = KafkaBroker(data_dir=self._base / "kafka", log_file=self._base / "kafka.log")
        try:
            kafka.start()
        except KafkaUnavailable as exc:  # e.g. mvn cannot reach Maven Central: skip
            if _kafka_required():
                self._failed = exc
                raise
            self._unavailable = f"Apache Kafka unavailable: {exc}"
            pytest.skip(self._unavailable)
        except BrokerStartError as exc:
            self._failed = exc
            raise
        self._started[kind] = kafka
        return kafka

    def close(self) -> None:
        for b in self._started.values():
            b.stop()
        self._started.clear()


@pytest.fixture(scope="session")
def _brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Brokers]:
    brokers = _Brokers(tmp_path_factory.mktemp("brokers"))
    yield brokers
    brokers.close()


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest, _brokers: _Brokers) -> AnyBroker:
    """The broker of this test's kind (``broker.kind``): the embedded Tansu broker or
    Apache Kafka (--broker), or the cluster named by AGENTS_STREAM_TEST_BROKER."""
    kind: BrokerKind = getattr(request, "param", None) or broker_kinds(request.config)[0]
    return _brokers.get(kind)


@pytest.fixture
def topic_factory(request: pytest.FixtureRequest):
    """Returns unique topic names per test so tests never see each other's records."""

    def make(prefix: str = "t") -> str:
        base = request.node.name.replace("[", "-").replace("]", "")[:40]
        return f"{prefix}-{base}-{os.getpid()}-{next(_names)}"

    return make


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def worker_factory(broker, tmp_path):
    """Starts worker CLI subprocesses on the test broker; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def make(
        app: str, env: dict[str, str], *, extra_args: list[str] | None = None
    ) -> WorkerProcess:
        n = next(_names)
        proc = WorkerProcess(
            app,
            broker=broker.url,
            data_dir=tmp_path / "data",
            log_file=tmp_path / f"worker-{n}.log",
            env=env,
            cwd=ROOT,
            extra_args=[*(extra_args or []), "--worker-id", f"w{n}"],
        )
        started.append(proc.start())
        return proc

    yield make
    for proc in started:
        if proc.alive:
            proc.kill()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """Apicurio Registry (Confluent API, BACKWARD global rule), started once per session
    on first use (~5 s, ~220 MB RSS) and stopped at its end; tests use their own subjects
    (topic_factory). Skips with one line when java/mvn are missing, unless Kafka is
    required (CI): then it fails."""
    missing = registry_missing()
    if missing is not None:
        if _kafka_required():
            raise pytest.UsageError(f"Apicurio Registry is required but unavailable: {missing}")
        pytest.skip(f"Apicurio Registry unavailable: {missing}")
    server = RegistryServer(log_file=tmp_path_factory.mktemp("registry") / "apicurio.log")
    server.start()
    yield server
    server.stop()
