"""WatermarkGenerator: bounded out-of-orderness per partition, min over active ones."""

from __future__ import annotations

import pytest

from agents_stream.runtime.watermarks import WatermarkGenerator


def test_single_partition_watermark_trails_max_timestamp():
    gen = WatermarkGenerator(100, clock=lambda: 0)
    assert gen.current is None
    assert gen.on_record(0, 1_000) == 899
    assert gen.on_record(0, 950) is None  # out of order: the max did not move
    assert gen.on_record(0, 1_500) == 1_399
    assert gen.current == 1_399


def test_zero_out_of_orderness_is_ts_minus_one():
    gen = WatermarkGenerator(0, clock=lambda: 0)
    assert gen.on_record("p", 10) == 9


def test_combined_watermark_is_min_over_partitions_and_never_regresses():
    gen = WatermarkGenerator(0, clock=lambda: 0)
    assert gen.on_record(0, 100) == 99
    # a new partition behind the others cannot pull the watermark back
    assert gen.on_record(1, 50) is None
    assert gen.current == 99
    assert gen.on_record(1, 80) is None
    assert gen.on_record(0, 300) is None  # partition 1 (at 80) holds it back
    assert gen.on_record(1, 200) == 199
    assert gen.on_record(1, 400) == 299  # now partition 0 (at 300) is the minimum


def test_without_idle_timeout_a_silent_partition_stops_event_time():
    now = [0]
    gen = WatermarkGenerator(0, None, clock=lambda: now[0])
    gen.on_record(0, 100)
    gen.on_record(1, 100)
    now[0] = 10_000_000
    assert gen.on_record(0, 5_000) is None
    assert gen.on_idle_check(now[0]) is None
    assert not gen.is_idle(1, now[0])


def test_idle_partition_is_excluded_after_timeout_and_rejoins_on_next_record():
    now = [0]
    gen = WatermarkGenerator(10, 1_000, clock=lambda: now[0])
    assert gen.on_record(0, 100) == 89
    gen.on_record(1, 100)
    now[0] = 500
    assert gen.on_record(0, 2_000) is None  # partition 1 still active at 100
    now[0] = 999
    assert gen.on_idle_check(now[0]) is None
    now[0] = 1_000
    assert gen.is_idle(1, now[0])
    # partition 1 went quiet: the watermark follows partition 0 alone
    assert gen.on_idle_check(now[0]) == 1_989
    assert gen.on_record(0, 3_000) == 2_989
    # partition 1 returns behind the watermark: no regression, and it holds it back again
    assert gen.on_record(1, 1_000) is None
    assert gen.on_record(0, 5_000) is None
    assert gen.on_record(1, 4_000) == 3_989
    assert gen.current == 3_989


def test_all_partitions_idle_emits_nothing():
    now = [0]
    gen = WatermarkGenerator(0, 100, clock=lambda: now[0])
    assert gen.on_record(0, 1_000) == 999
    now[0] = 10_000
    assert gen.on_idle_check() is None
    assert gen.current == 999
    # the next record makes the partition active again and advances normally
    assert gen.on_record(0, 2_000) == 1_999


def test_forget_removes_a_revoked_partition_from_the_minimum():
    gen = WatermarkGenerator(0, clock=lambda: 0)
    gen.on_record(0, 100)
    gen.on_record(1, 1_000)
    gen.forget(0)
    assert gen.on_idle_check(0) == 999
    gen.forget("unknown")  # no error


def test_explicit_now_overrides_the_clock():
    gen = WatermarkGenerator(0, 100, clock=lambda: 0)
    assert gen.on_record(1, 500, now_ms=0) == 499
    assert gen.on_record(0, 50, now_ms=1_000) is None  # both active: min is 49 < 499
    assert gen.is_idle(1, 1_050)
    assert not gen.is_idle(0, 1_050)
    assert gen.on_record(0, 900, now_ms=1_050) == 899  # partition 1 (idle) left out


@pytest.mark.parametrize(("ooo", "idle"), [(-1, None), (0, 0), (0, -5)])
def test_invalid_configuration_is_rejected(ooo, idle):
    with pytest.raises(ValueError):
        WatermarkGenerator(ooo, idle)
