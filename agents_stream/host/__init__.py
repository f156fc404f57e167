"""The host kit: how any host (worker, Faust adapter, Spark backfill) wires the durable
core to Kafka. See :mod:`agents_stream.host.kit`."""

from .kit import Binding, DurableHost

__all__ = ["Binding", "DurableHost"]
