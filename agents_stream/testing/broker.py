"""Re-export: the embedded broker lives in :mod:`agents_stream.runtime.embedded` (the CLI
starts it for ``--broker embedded`` and must not depend on test helpers)."""

from ..runtime.embedded import BrokerStartError, EmbeddedBroker, broker_binary, free_port

__all__ = ["BrokerStartError", "EmbeddedBroker", "broker_binary", "free_port"]
