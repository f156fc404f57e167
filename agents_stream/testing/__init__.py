"""Testing helpers: the in-process test context of an App (``app.test_context()``), a
worker on a broker for integration tests (``LiveWorker``), the embedded broker and topic
utilities for tests and demos."""

from .broker import BrokerStartError, EmbeddedBroker, free_port
from .kit import AgentTestContext, Call, Run
from .live import LiveWorker

__all__ = [
    "AgentTestContext",
    "BrokerStartError",
    "Call",
    "EmbeddedBroker",
    "LiveWorker",
    "Run",
    "free_port",
]
