"""LiveWorker: an App's worker on a real broker, in this process, for integration tests.

The in-process test context (``app.test_context()``) runs the journal state machine
without Kafka; this runs the real thing: a :class:`~agents_stream.runtime.worker.Worker`
in a thread against the embedded broker (started here unless ``broker=`` names one),
with records produced and outputs read through the app's own codecs::

    with LiveWorker(app) as live:
        live.send({"text": "refund please"}, key="u-1")
        outputs = live.outputs(2, timeout=60)

For crash tests (SIGKILL at a precise point) run the worker as a subprocess instead:
:class:`~agents_stream.testing.process.WorkerProcess`.
"""

from __future__ import annotations

import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer

from ..app import normalize_broker
from ..errors import ConfigurationError
from ..kafka.config import producer_config
from ..runtime.embedded import EmbeddedBroker
from ..serde.values import value_codec
from .topics import read_topic

if TYPE_CHECKING:
    from ..app import App
    from ..runtime.worker import Worker


class LiveWorker:
    """Runs ``app`` on a broker until :meth:`stop` (or the ``with`` block's end).

    Args:
        broker: ``kafka://host:port`` of a running cluster; default: an embedded broker
            started for this worker and stopped with it.
        data_dir: the worker's RocksDB caches (default: a temporary directory).
        ready_timeout: seconds to wait for the worker to own its partitions.
    """

    def __init__(
        self,
        app: App,
        *,
        broker: str | None = None,
        data_dir: str | Path | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.app = app
        self._broker_url = broker
        self._data_dir = data_dir
        self._ready_timeout = ready_timeout
        self._stack = ExitStack()
        self.worker: Worker | None = None
        self._thread: threading.Thread | None = None
        self._producer: Producer | None = None
        self.bootstrap = ""

    def start(self) -> LiveWorker:
        from ..runtime.worker import Worker  # the runtime only when a live test runs

        if self._broker_url is None:
            tmp = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
            broker = self._stack.enter_context(EmbeddedBroker(log_file=tmp / "broker.log"))
            self._broker_url = broker.url
        self.bootstrap = normalize_broker(self._broker_url)
        data_dir = self._data_dir
        if data_dir is None:
            data_dir = self._stack.enter_context(tempfile.TemporaryDirectory())
        self.worker = Worker(self.app, broker=self.bootstrap, data_dir=data_dir, worker_id="live")
        self._thread = threading.Thread(target=self.worker.run, name="live-worker", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self._ready_timeout
        while not self.worker.ready:
            if not self._thread.is_alive():
                raise ConfigurationError(
                    f"the worker of {self.app.id!r} stopped during startup (see its log)"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"the worker of {self.app.id!r} owned no partition after "
                    f"{self._ready_timeout:.0f}s on {self.bootstrap}"
                )
            time.sleep(0.05)
        self._producer = Producer(producer_config(self.bootstrap))
        return self

    def send(self, value: Any, *, key: str | None = None, topic: str | None = None) -> None:
        """Produce one record to an agent input (``topic`` may be left out when the app
        has one), encoded with that input's codec; returns once it is acknowledged."""
        binding = self._binding(topic)
        codec = value_codec(
            binding.input_schema,
            registry_url=self.app.schema_registry_url,
            topic=binding.input,
            strategy=self.app.subject_name_strategy,
        )
        assert self._producer is not None, "start() first"
        self._producer.produce(
            binding.input, codec.encode(value), key=key.encode() if key is not None else None
        )
        if self._producer.flush(30):
            raise TimeoutError(f"a record to {binding.input} was not acknowledged in 30s")

    def outputs(self, count: int, *, topic: str | None = None, timeout: float = 60.0) -> list[Any]:
        """The first ``count`` or more output values of the agent on input ``topic``,
        decoded with its output codec (TimeoutError after ``timeout`` s)."""
        binding = self._binding(topic)
        if binding.output is None:
            raise ConfigurationError(f"the agent on {binding.input} has no output topic")
        codec = value_codec(
            binding.output_schema,
            registry_url=self.app.schema_registry_url,
            topic=binding.output,
            strategy=self.app.subject_name_strategy,
        )
        deadline = time.monotonic() + timeout
        while True:
            records = read_topic(self.bootstrap, binding.output)
            if len(records) >= count:
                return [codec.decode(r.value) if r.value is not None else None for r in records]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{binding.output} has {len(records)} records, not {count}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.worker is not None and self._thread is not None:
            self.worker.stop()
            self._thread.join(60)
        self._stack.close()

    def __enter__(self) -> LiveWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _binding(self, topic: str | None) -> Any:
        agents = self.app.agents
        if topic is None:
            if len(agents) != 1:
                raise ConfigurationError(f"app {self.app.id!r} has several agents: pass topic=")
            return agents[0]
        for b in agents:
            if b.input == topic:
                return b
        raise ConfigurationError(f"{topic!r} is not an agent input of app {self.app.id!r}")
