"""jsontext (orjson where it is exact) against the reference, the standard json module.

Reading: for any bytes, ``loads`` gives what ``json.loads(data.decode("utf-8"))`` gives,
types and float signs included, or raises the same kind of error. Writing: a plain tree
written by ``dumps_plain`` reads back as the same tree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agents_stream.durable import jsontext

orjson = pytest.importorskip("orjson")

# Every JSON scalar json.dumps can write, long ints and non-finite floats included.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text()
)
trees = st.recursive(
    scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=25
)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1 vs 1.0 vs True, -0.0 vs 0.0, nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def outcome(read: Callable[[bytes], Any], data: bytes) -> tuple[str, Any]:
    """What ``read`` makes of ``data``: its value, or the kind of error it raised."""
    try:
        return "value", read(data)
    except UnicodeDecodeError:
        return "unicode", None
    except ValueError:
        return "json", None
    except RecursionError:
        return "recursion", None


def check_loads(data: bytes) -> None:
    want = outcome(lambda d: json.loads(d.decode("utf-8")), data)
    got = outcome(jsontext.loads, data)
    assert want[0] == got[0], (data, want, got)
    assert same(want[1], got[1]), (data, want, got)


@given(trees, st.sampled_from([{}, {"indent": 1}, {"ensure_ascii": False}]))
@example(2**64, {})
@example(-(2**63) - 1, {})
@example(123456789012345678, {})  # 18 digits: orjson's
@example(float("nan"), {})
@example({"a": 1, "b": [1e-7, -0.0, 1e308, 5e-324]}, {})
def test_loads_reads_what_json_writes_as_json_reads_it(tree: Any, options: dict[str, Any]) -> None:
    check_loads(json.dumps(tree, **options).encode("utf-8", "surrogatepass"))


# Texts near JSON: fragments of valid texts, cut and spliced, odd whitespace, bad escapes,
# invalid UTF-8, duplicate keys, numbers at every edge.
pieces = st.sampled_from(
    [
        b"{", b"}", b"[", b"]", b",", b":", b'"', b'"a"', b'"\\ud800"', b'"\\u00e9"', b"\\",
        b"1", b"-", b"0", b"01", b"1.5", b"1e400", b"-1e-400", b"1E+2", b".5", b"1.",
        b"18446744073709551615", b"18446744073709551616", b"-9223372036854775809",
        b"NaN", b"Infinity", b"-Infinity", b"true", b"false", b"null", b"nul",
        b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"\xc2\xa0", b"\xef\xbb\xbf",
        b"\xed\xa0\x80", b"\xff", b"\x00", b"\x1f", b"\x7f", b'"\x01"', b"\xe2\x80\xa8",
        b'{"a":1,"a":2}', b'{"a":1,"b":2,"a":3}', b"[1,]", b"{}", b"[]",
    ]
)  # fmt: skip


@given(st.lists(pieces, max_size=12).map(b"".join) | st.binary(max_size=40))
@example(b'{"a":1,"b":2,"a":3}')
@example(b"[" * 3000 + b"]" * 3000)
def test_loads_agrees_with_json_on_any_bytes(data: bytes) -> None:
    check_loads(data)


plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
plain_trees = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=25,
)


@given(plain_trees)
@example(1e-7)
@example(-0.0)
@example("\ud800")
@example(2**64)
def test_dumps_plain_reads_back_as_the_tree_or_declines(tree: Any) -> None:
    written = jsontext.dumps_plain(tree)
    if written is None:  # orjson refused: only long ints and lone surrogates
        text = json.dumps(tree, ensure_ascii=False)
        assert any(c in text for c in "0123456789") or "\\ud" in json.dumps(tree), tree
        return
    assert same(json.loads(written.decode("utf-8")), tree)
    assert json.loads(written) == json.loads(json.dumps(tree, separators=(",", ":")))


def test_without_orjson_everything_goes_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsontext, "_fast_loads", None)
    monkeypatch.setattr(jsontext, "_fast_dumps", None)
    assert jsontext.loads(b'{"a":[1,2.5]}') == {"a": [1, 2.5]}
    assert jsontext.dumps_plain({"a": 1}) is None
    assert jsontext.plain_writer(lambda t: json.dumps(t))({"a": 1}) == b'{"a": 1}'


# Decimal texts with many significant digits but no run of 19: orjson's float parsing
# must round as Python's does.
decimal_texts = st.builds(
    lambda neg, whole, frac, exp: (
        ("-" if neg else "") + f"{whole}.{frac:018d}" + ("" if exp is None else f"e{exp}")
    ).encode(),
    st.booleans(),
    st.integers(0, 10**18 - 1),
    st.integers(0, 10**18 - 1),
    st.none() | st.integers(-350, 330),
)


@given(decimal_texts)
@example(b"0.30000000000000004")
@example(b"2.2250738585072011e-308")
def test_loads_rounds_long_decimals_as_json_does(data: bytes) -> None:
    check_loads(data)


@given(
    trees.map(lambda t: json.dumps(t).encode("utf-8", "surrogatepass"))
    | st.lists(pieces | st.just(b'{"$t":[1]}') | st.just(b'"\\u0024t"'), max_size=10).map(b"".join)
)
@example(b'{"\\u0024t":[1,2]}')
@example(b'{"$enum": null}')
@example(b'{"a":"\xed\xa0\x80"}')
def test_journal_values_without_tags_read_as_through_the_hook(body: bytes) -> None:
    """``decode_value`` skips the object hook when no tag can be in the text; what it
    returns (or raises) is what the hook path does. Malformed data raises ValueError
    only (the journal names the slot), whatever a tag's payload holds."""
    from agents_stream.durable.values import _decode_tagged, decode_value

    want = outcome(_decode_tagged, body)
    got = outcome(lambda b: decode_value(b"\x1e\x01" + b), body)
    assert want[0] == got[0], (body, want, got)
    assert same(want[1], got[1]), (body, want, got)
