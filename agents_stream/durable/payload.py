"""Payload codecs for call results, memory values and output values.

JSON is the default: journal bytes written by one topic writer must never be able to run
code in a worker, so nothing is unpickled unless the app opts in explicitly with
:class:`PickleCodec` (for trusted, private topics only).
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol

from .errors import PayloadError


class PayloadCodec(Protocol):
    name: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Plain data (dict, list, str, int, float, bool, None). Tuples come back as lists."""

    name = "json"

    def encode(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise PayloadError(
                f"{type(value).__name__} value is not JSON-serializable ({exc}); return plain "
                "data from code blocks or configure App(payload_codec=PickleCodec())"
            ) from exc

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


class PickleCodec:
    """Arbitrary Python objects. Opt-in only: unpickling runs code named by the data."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


JSON = JsonCodec()
