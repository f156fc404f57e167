"""Payload codecs for call results, memory values and output values.

JSON is the default: journal bytes written by one topic writer must never be able to run
code in a worker, so nothing is unpickled unless the app opts in explicitly with
:class:`PickleCodec` (for trusted, private topics only).
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol

from .values import decode_value, encode_value


class PayloadCodec(Protocol):
    name: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """The journaled value domain (:mod:`.values`) in tagged JSON; replay is exact.

    Reads results written before the tagged encoding (plain JSON) as plain JSON. A
    value outside the domain raises :class:`UnsupportedValueError` naming its type.
    """

    name = "json"

    def encode(self, value: Any, *, where: str = "value") -> bytes:
        return encode_value(value, where=where)

    def decode(self, data: bytes) -> Any:
        return decode_value(data)


class PickleCodec:
    """Arbitrary Python objects. Opt-in only: unpickling runs code named by the data."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


JSON = JsonCodec()


def encode_result(codec: PayloadCodec, value: Any) -> bytes:
    """``codec.encode(value)``; refusals of the default codec name the value ``result``."""
    if isinstance(codec, JsonCodec):
        return codec.encode(value, where="result")
    return codec.encode(value)
