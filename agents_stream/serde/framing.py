"""Wire framings of Avro bodies, detected from the first bytes of a record.

* Single-object encoding (Avro spec): ``C3 01`` + 8-byte CRC-64-AVRO fingerprint of the
  writer schema. Self-describing without any service: the default.
* Confluent wire format: ``00`` + 4-byte big-endian schema id, used when a Schema
  Registry is configured so that other Confluent clients can read the topics.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from .errors import SerdeError

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
_SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
_CONFLUENT_HEADER = len(CONFLUENT_MAGIC) + 4


class FramingError(SerdeError):
    """The bytes carry neither framing (or a truncated header)."""


@dataclass(frozen=True)
class Frame:
    """What the header of one record says about its writer schema."""

    kind: Literal["single-object", "confluent"]
    fingerprint: bytes = b""
    schema_id: int = -1
    body_offset: int = 0


def single_object_header(fingerprint: bytes) -> bytes:
    return SINGLE_OBJECT_MAGIC + fingerprint


def confluent_header(schema_id: int) -> bytes:
    return CONFLUENT_MAGIC + struct.pack(">I", schema_id)


def read_frame(data: bytes) -> Frame:
    """Parse the header of ``data``.

    Raises:
        FramingError: unknown magic bytes or a header cut short.
    """
    if data[:2] == SINGLE_OBJECT_MAGIC:
        if len(data) < _SINGLE_OBJECT_HEADER:
            raise FramingError(f"truncated single-object header ({len(data)} bytes)")
        return Frame("single-object", fingerprint=bytes(data[2:10]), body_offset=10)
    if data[:1] == CONFLUENT_MAGIC:
        if len(data) < _CONFLUENT_HEADER:
            raise FramingError(f"truncated Confluent header ({len(data)} bytes)")
        (schema_id,) = struct.unpack(">I", data[1:5])
        return Frame("confluent", schema_id=schema_id, body_offset=5)
    if not data:
        raise FramingError("empty value")
    raise FramingError(f"unknown framing (first bytes {bytes(data[:2]).hex()})")
