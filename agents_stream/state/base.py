"""Moved: the store interface is a port of the durable core (:mod:`agents_stream.durable.store`).

Kept so that imports written against earlier versions keep working.
"""

from ..durable.store import ActionStateStore, all_of, completed_future

__all__ = ["ActionStateStore", "all_of", "completed_future"]
