"""Package namespaces whose names load on first use (PEP 562).

A package ``__init__`` lists where each public name lives and gets ``__getattr__`` and
``__dir__`` from :func:`lazy_namespace`: importing one component then never loads its
siblings (the generic Spark Kafka source without the app, ``agents_stream`` without
PySpark), and each name is imported once, then cached in the package's globals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any


def lazy_namespace(
    package: str, namespace: dict[str, Any], homes: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``homes`` maps a public name to the
    module (relative to ``package``) that defines it; ``names`` is ``__all__``."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home, package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
