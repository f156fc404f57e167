"""ActionState stores: the interface, an in-memory one, and Kafka + RocksDB."""

from ..durable.store import ActionStateStore
from .memory import InMemoryActionStateStore

__all__ = ["ActionStateStore", "InMemoryActionStateStore"]
