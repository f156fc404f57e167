"""ActionState stores: the interface, an in-memory one, and Kafka + RocksDB."""

from .base import ActionStateStore
from .memory import InMemoryActionStateStore

__all__ = ["ActionStateStore", "InMemoryActionStateStore"]
