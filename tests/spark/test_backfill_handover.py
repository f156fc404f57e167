"""Guarantee 4 across hosts: a backfill that journals its actions (``write_journal``)
and the worker that later consumes the same inputs put each output in the agent's output
topic exactly once, wherever the backfill sent its own copy.

- Outputs to Parquet: the ActionDones stay unmarked; the worker replays every action
  (nothing executes again) and sends their outputs. (Before, the backfill journaled
  them marked emitted, and the worker sent none: the outputs never reached the topic.)
- Outputs to the agent's own topic: sent with the worker's identity headers, then marked
  emitted; the worker replays every action and sends nothing.
"""

from __future__ import annotations

import time

import pytest

from agents_stream.durable.output_identity import OUTPUT_HEADER
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.spark.jobs.common import committed_offsets
from agents_stream.testing.topics import read_topic
from tests.spark.workload import APP_SPEC, SparkAppEnv, normal_inputs, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.spark]

N = 9


def _drained(env: SparkAppEnv, worker) -> None:
    """Waits until the worker group committed every input, then stops the worker."""

    def committed() -> bool:
        return sum(committed_offsets(env.bootstrap, env.app_id, env.input, 2).values()) == N

    wait_until(committed, timeout=90)
    time.sleep(0.5)  # anything the worker would send after its commit
    assert worker.terminate() == 0, worker.log()


def test_outputs_kept_out_of_the_topic_are_sent_by_the_worker(
    spark, broker, topic_factory, worker_factory, tmp_path
):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send(normal_inputs(N))
    done = run_backfill(
        spark, env.app(), broker.bootstrap, write_journal=True, output_path=tmp_path / "out"
    )
    assert done.summary["actions_run"] == N * 2
    assert done.summary["outputs"] == N
    assert read_topic(broker.bootstrap, env.output) == []

    worker = worker_factory(APP_SPEC, env.env)
    try:
        env.outputs(N)
    except TimeoutError:
        raise AssertionError(worker.log()) from None
    _drained(env, worker)
    out = read_topic(broker.bootstrap, env.output)
    assert sorted(r.json()["n"] for r in out) == list(range(N))
    assert env.effects() == {}, "the worker replayed the backfill's calls"


def test_outputs_sent_to_the_agents_topic_are_not_sent_again(
    spark, broker, topic_factory, worker_factory, tmp_path
):
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send(normal_inputs(N))
    done = run_backfill(
        spark, env.app(), broker.bootstrap, write_journal=True, output_topic=env.output
    )
    assert done.summary["outputs_unsent"] == N
    sent = read_topic(broker.bootstrap, env.output)
    assert sorted(r.json()["n"] for r in sent) == list(range(N))
    prefix = f"{env.app_id}/{env.input}/".encode()
    assert all(r.headers[OUTPUT_HEADER].startswith(prefix) for r in sent), sent[0].headers

    # A second backfill into the topic finds every ActionDone marked: nothing to send.
    again = run_backfill(
        spark, env.app(), broker.bootstrap, write_journal=True, output_topic=env.output
    )
    assert again.summary["outputs_unsent"] == 0
    assert again.summary["actions_run"] == 0

    worker = worker_factory(APP_SPEC, env.env)
    _drained(env, worker)
    assert len(read_topic(broker.bootstrap, env.output)) == N, worker.log()
    assert env.effects() == {}
