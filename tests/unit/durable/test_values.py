"""The journaled value domain: exact round trip and value digests (guarantee 7).

Properties are checked against a reference model written independently of the codec:
:func:`same` is recursive, type-aware equality (``type(a) is type(b)`` at every level,
every nan equal to every nan, ``-0.0`` not ``0.0``, ``Decimal`` by its exact text).
"""

from __future__ import annotations

import enum
import json
import math
import os
import pickle
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_stream.durable import UnsupportedValueError
from agents_stream.durable.identity import args_digest
from agents_stream.durable.payload import JSON
from agents_stream.durable.values import (
    MAGIC,
    decode_value,
    encode_value,
    register_codec,
    register_type,
    value_digest,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = (1, 2)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Point:
    x: int
    label: Any = None


@dataclass
class Basket:
    items: list[Any]
    total: Decimal = Decimal("0")
    note: str = field(default="", compare=True)


class Money:
    """A user type outside the domain, journaled through a registered codec."""

    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (
            other.amount,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.amount, self.currency))


register_codec(Money, "tests.Money", lambda m: (m.amount, m.currency), lambda v: Money(v[0], v[1]))


# -- reference model ------------------------------------------------------------------
def same(a: Any, b: Any, *, ordered: bool = True) -> bool:
    """Type-aware equality; ``ordered`` also requires the same dict order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime | time):
        return (
            a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.fold == b.fold
            and same_tz(a.tzinfo, b.tzinfo)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(
            same(x, y, ordered=ordered) for x, y in zip(a, b, strict=False)
        )
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        if ordered:
            return all(
                same(ka, kb, ordered=ordered) and same(va, vb, ordered=ordered)
                for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False)
            )
        return same_unordered(list(a.items()), list(b.items()))
    if isinstance(a, set | frozenset):
        return same_unordered(list(a), list(b))
    if isinstance(a, enum.Enum):
        return a is b
    if isinstance(a, Point | Basket | Money):
        return same(vars(a), vars(b), ordered=ordered)
    return a == b


def same_tz(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, timezone):
        return a.utcoffset(None) == b.utcoffset(None) and a.tzname(None) == b.tzname(None)
    return a.key == b.key


def same_unordered(xs: list[Any], ys: list[Any]) -> bool:
    if len(xs) != len(ys):
        return False
    left = list(ys)
    for x in xs:
        for i, y in enumerate(left):
            if same(x, y, ordered=False):
                del left[i]
                break
        else:
            return False
    return True


# -- strategies -----------------------------------------------------------------------
fixed_zones = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
) | st.builds(
    timezone,
    st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)),
    st.text(min_size=1, max_size=5),
)
zones = st.none() | fixed_zones | st.timezones() | st.just(UTC)


def datetimes_with_fold() -> st.SearchStrategy[datetime]:
    return st.builds(
        lambda d, fold: d.replace(fold=fold), st.datetimes(timezones=zones), st.sampled_from([0, 1])
    )


hashable_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary()
    | datetimes_with_fold()
    | st.dates()
    | st.times(timezones=st.none() | fixed_zones)
    | st.timedeltas()
    | st.decimals(allow_nan=False)
    | st.uuids()
    | st.sampled_from(list(Color) + list(Level))
    | st.builds(Point, st.integers(), st.text(max_size=3))
    | st.builds(Money, st.decimals(allow_nan=False), st.sampled_from(["EUR", "USD"]))
)
scalars = hashable_scalars | st.decimals(allow_nan=True)
hashables = st.recursive(
    hashable_scalars,
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
        | st.builds(Basket, st.lists(inner, max_size=3), st.decimals(allow_nan=False))
        | st.builds(Point, st.integers(), inner)
    )


values = st.recursive(scalars, containers, max_leaves=12)

small_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.sampled_from([0.0, -0.0, 1.0, math.nan, math.inf])
    | st.sampled_from(["", "1", "$t", "a"])
    | st.sampled_from([b"", b"1"])
    | st.sampled_from([Decimal("1"), Decimal("1.0"), Decimal("NaN")])
    | st.sampled_from([Color.RED, Level.LOW])
)
small_values = st.recursive(
    small_scalars,
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.lists(inner, max_size=2).map(tuple)
        | st.dictionaries(small_scalars, inner, max_size=2)
    ),
    max_leaves=4,
)

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- properties -----------------------------------------------------------------------
@PROPERTY
@given(values)
def test_round_trip_is_exact_types_included(value):
    data = JSON.encode(value)
    assert data[:1] == MAGIC
    assert same(JSON.decode(data), value)


@PROPERTY
@given(values)
def test_equal_values_digest_equally_whatever_the_dict_order(value):
    assert value_digest(reordered(value)) == value_digest(value)


@PROPERTY
@given(small_values, small_values)
def test_distinct_values_digest_differently(a, b):
    if same(a, b, ordered=False):
        assert value_digest(a) == value_digest(b)
    else:
        assert value_digest(a) != value_digest(b)


@pytest.mark.parametrize(
    "a, b",
    [
        (1, 1.0),
        (1, True),
        (1, "1"),
        (0, False),
        (0.0, -0.0),
        (1, Decimal(1)),
        (Decimal("1.0"), Decimal("1.00")),
        ([1, 2], (1, 2)),
        ({1}, frozenset({1})),
        ([1], {1}),
        (b"1", "1"),
        ({1: 5}, {"1": 5}),
        ({1: 5}, {1.0: 5}),
        ({"$t": [1]}, (1,)),
        (Color.RED, "red"),
        (Level.LOW, 1),
        (Point(1), Point(2)),
        (date(2024, 1, 1), datetime(2024, 1, 1)),
        (datetime(2024, 1, 1, 12), datetime(2024, 1, 1, 12, tzinfo=UTC)),
        (Decimal("10.00"), Decimal("10.01")),
        (uuid.UUID(int=1), uuid.UUID(int=2)),
        (None, math.nan),
    ],
)
def test_values_that_used_to_collide_digest_differently(a, b):
    assert value_digest(a) != value_digest(b)
    assert args_digest((a,), {}) != args_digest((b,), {})


def test_digest_is_identical_in_other_processes():
    """Same values, other interpreters with other str hash seeds: same digests."""
    examples: list[Any] = []

    @settings(max_examples=150, deadline=None, database=None)
    @given(values)
    def collect(value):
        examples.append(value)

    collect()
    blob = pickle.dumps(examples)  # test-only transport between trusted processes
    script = (
        "import pickle, sys\n"
        "from agents_stream.durable.values import value_digest\n"
        "import tests.unit.durable.test_values\n"
        "values = pickle.loads(sys.stdin.buffer.read())\n"
        "print('\\n'.join(value_digest(v) for v in values))\n"
    )
    root = Path(__file__).resolve().parents[3]
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            input=blob,
            capture_output=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert out.stdout.decode().split() == [value_digest(v) for v in examples]


def reordered(value: Any) -> Any:
    """An equal value whose dicts were built in reverse order."""
    if type(value) is dict:
        return {k: reordered(v) for k, v in reversed(list(value.items()))}
    if type(value) is list:
        return [reordered(v) for v in value]
    if type(value) is tuple:
        return tuple(reordered(v) for v in value)
    return value


# -- examples the issue names ---------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        {1: 5},
        {None: 1, b"k": 2, 1.5: 3, True: 4, "s": 5, (1, "a"): 6},
        (1, [2, (3,)]),
        {"$t": "user data that looks like a tag"},
        [math.nan, math.inf, -math.inf, -0.0],
        Decimal("-0.00"),
        Decimal("sNaN"),
        datetime(
            2024, 11, 3, 1, 30, fold=1, tzinfo=__import__("zoneinfo").ZoneInfo("America/New_York")
        ),
        time(23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5, minutes=30), "IST")),
        "lone surrogate \ud800",
        10**40,
        pytest.param(-(10**5000), id="int-over-4300-digits"),
        pytest.param([2**12_000, 2**12_000 - 1, -(2**12_001)], id="ints-at-the-json-edge"),
    ],
)
def test_named_examples_round_trip(value):
    assert same(decode_value(encode_value(value)), value)


def test_plain_json_from_older_journals_still_decodes():
    assert decode_value(b'{"1": 5, "xs": [1, 2.5]}') == {"1": 5, "xs": [1, 2.5]}
    assert decode_value(json.dumps("$t").encode()) == "$t"


def test_tagged_bytes_cannot_be_mistaken_for_json():
    with pytest.raises(ValueError):
        json.loads(encode_value({"a": 1}))


# -- the domain's edge ------------------------------------------------------------------
class Opaque:
    pass


@pytest.mark.parametrize(
    "value, where, culprit",
    [
        (Opaque(), "result", "Opaque"),
        ({"k": [1, Opaque()]}, "result['k'][1]", "Opaque"),
        (Point(1, label=Opaque()), "result.label", "Opaque"),
        ({(1, Opaque()): 1}, "result[(1, ", "Opaque"),
        (bytearray(b"x"), "result", "bytearray"),
        (object, "result", "type"),
        (Money(Decimal(1), Opaque()), "result<tests.Money>[1]", "Opaque"),  # type: ignore[arg-type]
    ],
)
def test_values_outside_the_domain_are_refused_naming_type_and_path(value, where, culprit):
    with pytest.raises(UnsupportedValueError) as err:
        JSON.encode(value, where="result")
    assert f"of type {culprit}" in str(err.value).replace(
        "tests.unit.durable.test_values.", ""
    ).replace("builtins.", "")
    assert f" at {where}" in str(err.value)


def test_local_dataclass_is_refused_at_encode_time_not_at_replay():
    @dataclass
    class Local:
        x: int

    with pytest.raises(UnsupportedValueError, match="register_type"):
        encode_value(Local(1))
    register_type(Local, "tests.Local")
    assert decode_value(encode_value(Local(1))) == Local(1)


def test_unknown_tzinfo_is_refused():
    class Odd(timezone.__base__):  # type: ignore[name-defined, misc]
        def utcoffset(self, dt):
            return timedelta(0)

    with pytest.raises(UnsupportedValueError, match="tzinfo"):
        encode_value(datetime(2024, 1, 1, tzinfo=Odd()))


def test_journal_data_never_imports_a_module():
    name = "tests_unit_never_imported_mod"
    data = MAGIC + b'\x01{"$dc":["' + name.encode() + b':Thing",{}]}'
    with pytest.raises(ValueError, match="not loaded"):
        decode_value(data)
    assert name not in sys.modules


def test_journal_data_can_only_build_dataclasses_and_enums():
    # os:system exists and is imported, but is not a dataclass: never called.
    for tag in ("$dc", "$enum"):
        data = MAGIC + b'\x01{"' + tag.encode() + b'":["os:system",{}]}'
        with pytest.raises((ValueError, TypeError)):
            decode_value(data)


def test_digest_of_mixed_key_types_does_not_crash():
    digest = args_digest(({None: 1, 2: "b", "a": 3, b"x": 4, 1.5: 5, (1,): 6},), {"k": {3, "x"}})
    assert len(digest) == 64


def test_app_and_package_register_codecs_for_the_journal():
    import agents_stream

    class Celsius:
        def __init__(self, degrees: float) -> None:
            self.degrees = degrees

    agents_stream.App("codecs").register_codec(
        Celsius, "tests.Celsius", lambda c: c.degrees, Celsius
    )
    back = decode_value(encode_value([Celsius(21.5)]))
    assert type(back[0]) is Celsius and back[0].degrees == 21.5
    with pytest.raises(ValueError, match="taken"):
        agents_stream.register_codec(Opaque, "tests.Celsius", repr, repr)
    with pytest.raises(ValueError, match="already in the journaled value domain"):
        agents_stream.register_codec(int, "int", int, int)


def test_class_lookup_never_runs_a_module_getattr():
    import types

    calls = []
    module = types.ModuleType("tests_unit_lazy_module")
    module.__getattr__ = lambda name: calls.append(name)  # type: ignore[method-assign]
    sys.modules[module.__name__] = module
    try:
        data = MAGIC + b'\x01{"$dc":["tests_unit_lazy_module:Lazy",{}]}'
        with pytest.raises(ValueError, match="not loaded"):
            decode_value(data)
    finally:
        del sys.modules[module.__name__]
    assert calls == []


# The encoding is a wire format: journals written today must decode, and digests must
# match, in every later version. Changing these bytes needs a new format version.
GOLDEN_VALUE = {
    "amount": Decimal("10.50"),
    1: (b"\x00", None),
    "at": datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
    "ids": {uuid.UUID(int=7)},
    "p": Point(1, "a"),
    "c": Color.RED,
    "f": [1.0, -0.0, math.nan],
}
GOLDEN_BYTES = (
    b'\x1e\x01{"$d":[["amount",{"$dec":"10.50"}],[1,{"$t":[{"$b":"AA=="},null]}],'
    b'["at",{"$dt":["2024-05-01T12:30:00",0,["fixed",{"$td":[0,0,0]},null]]}],'
    b'["ids",{"$set":[{"$uuid":"00000000-0000-0000-0000-000000000007"}]}],'
    b'["p",{"$dc":["tests.unit.durable.test_values:Point",{"x":1,"label":"a"}]}],'
    b'["c",{"$enum":["tests.unit.durable.test_values:Color","red"]}],'
    b'["f",[1.0,-0.0,{"$f":"nan"}]]]}'
)
GOLDEN_ARGS_DIGEST = "f33e85628cce290682d4976faa4e8fc30cfc317b2bcf8f7de3509652f5a95dfd"


def test_golden_encoding_and_digest_are_stable():
    assert encode_value(GOLDEN_VALUE) == GOLDEN_BYTES
    assert same(decode_value(GOLDEN_BYTES), GOLDEN_VALUE)
    assert args_digest((GOLDEN_VALUE,), {"k": 1}) == GOLDEN_ARGS_DIGEST
