"""The counting fast path of CallShape.bind_error agrees with inspect.Signature.bind."""

from __future__ import annotations

import inspect

from hypothesis import given
from hypothesis import strategies as st

from agents_stream.durable.identity import CallShape, _shape_of

P = inspect.Parameter
KINDS = [
    P.POSITIONAL_ONLY,
    P.POSITIONAL_OR_KEYWORD,
    P.VAR_POSITIONAL,
    P.KEYWORD_ONLY,
    P.VAR_KEYWORD,
]


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    params: list[inspect.Parameter] = []
    floor = 0
    defaulted = False
    for i in range(draw(st.integers(0, 5))):
        kind_index = draw(st.integers(floor, len(KINDS) - 1))
        kind = KINDS[kind_index]
        floor = kind_index + (kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD))
        name = draw(st.sampled_from(["call_id", f"a{i}"]))
        if any(p.name == name for p in params):
            name = f"b{i}"
        default: object = P.empty
        if kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            if defaulted or draw(st.booleans()):
                default, defaulted = 0, True
        elif kind is P.KEYWORD_ONLY and draw(st.booleans()):
            default = 0
        params.append(P(name, kind, default=default))
        if floor >= len(KINDS):
            break
    return inspect.Signature(params)


@given(signatures(), st.integers(0, 7))
def test_fast_path_agrees_with_bind(sig: inspect.Signature, nargs: int) -> None:
    def fn(*args: object, **kwargs: object) -> None: ...

    fn.__signature__ = sig  # type: ignore[attr-defined]
    shape = _shape_of(fn)
    reference = CallShape(shape.call_id, shape.signature)  # no fast path: always binds
    args = tuple(range(nargs))
    assert (shape.bind_error(args, {}) is None) == (reference.bind_error(args, {}) is None)
