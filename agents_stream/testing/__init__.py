"""Testing helpers: the embedded broker and topic utilities for tests and demos."""

from .broker import BrokerStartError, EmbeddedBroker, free_port

__all__ = ["BrokerStartError", "EmbeddedBroker", "free_port"]
