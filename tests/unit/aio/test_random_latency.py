"""Property tests: random latencies, failures and watermarks never break ordering guarantees."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.aio import AsyncRetryStrategies, AsyncWaitOperator, Element

from .fixtures import Recorder

# Each item: (latency in 0.1 ms units, fails?) or a watermark marker None.
items = st.lists(
    st.one_of(st.tuples(st.integers(0, 20), st.booleans()), st.none()),
    min_size=1,
    max_size=40,
)


def run(
    plan: list[tuple[int, bool] | None], **options: Any
) -> tuple[Recorder, list[tuple[str, Any]]]:
    """Feeds ``plan`` (index = value) through an operator; returns recorder and input log."""
    recorder = Recorder()

    async def fn(value: int) -> int:
        delay, fails = plan[value]  # type: ignore[misc]
        await asyncio.sleep(delay / 10_000)
        if fails:
            raise ValueError(value)
        return value

    async def main() -> list[tuple[str, Any]]:
        op = AsyncWaitOperator(
            fn,
            emit=recorder.emit,
            fail=recorder.fail,
            emit_watermark=recorder.watermark,
            **options,
        )
        inputs: list[tuple[str, Any]] = []
        for index, item in enumerate(plan):
            if item is None:
                await op.process_watermark(index)
                inputs.append(("wm", index))
            else:
                await op.process(Element(index))
                inputs.append(("el", index))
        await op.drain()
        return inputs

    return recorder, asyncio.run(main())


@settings(max_examples=40, deadline=None)
@given(plan=items, capacity=st.integers(1, 8))
def test_ordered_output_equals_input_order(plan, capacity):
    recorder, inputs = run(plan, ordered=True, capacity=capacity)
    delivered = [("wm" if kind == "wm" else "el", value) for kind, value, _ in recorder.log]
    assert delivered == inputs
    for kind, value, out in recorder.log:
        if kind == "fail":
            assert isinstance(out, ValueError) and plan[value][1]
        elif kind == "emit":
            assert out == [value] and not plan[value][1]


@settings(max_examples=40, deadline=None)
@given(plan=items, capacity=st.integers(1, 8))
def test_unordered_event_time_respects_watermark_segments(plan, capacity):
    recorder, inputs = run(plan, ordered=False, time_mode="event", capacity=capacity)

    def segments(log: list[tuple[str, Any]]) -> list[Any]:
        # Split at watermarks; elements compare as sets inside a segment.
        out: list[Any] = [set()]
        for kind, value in log:
            if kind == "wm":
                out.extend([value, set()])
            else:
                out[-1].add(value)
        return out

    delivered = [("wm" if kind == "wm" else "el", value) for kind, value, _ in recorder.log]
    assert segments(delivered) == segments(inputs)


@settings(max_examples=25, deadline=None)
@given(plan=items)
def test_unordered_processing_time_settles_every_element_once(plan):
    recorder, inputs = run(
        plan,
        ordered=False,
        capacity=5,
        retry=AsyncRetryStrategies.fixed_delay(1, 0.0001).if_exception(ValueError),
    )
    settled = sorted(value for kind, value, _ in recorder.log if kind != "wm")
    assert settled == [value for kind, value in inputs if kind == "el"]
