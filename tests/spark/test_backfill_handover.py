"""Guarantee 4 across hosts: a backfill that journals its actions (``write_journal``)
and the worker that later consumes the same inputs put each output in the agent's output
topic exactly once, wherever the backfill sent its own copy.

- Outputs to Parquet: the ActionDones stay unmarked; the worker replays every action
  (nothing executes again) and sends their outputs. (Before, the backfill journaled
  them marked emitted, and the worker sent none: the outputs never reached the topic.)
- Outputs to the agent's own topic: sent with the worker's identity headers, then marked
  emitted; the worker replays every action and sends nothing. A job that died between
  the two leaves outputs the worker finds by their headers: it sends none either.
"""

from __future__ import annotations

import time

import pytest

from agents_stream.durable.output_identity import OUTPUT_HEADER
from agents_stream.host.output_log import OutputLog
from agents_stream.kafka.admin import TopicAdmin, compacted
from agents_stream.kafka.config import producer_config
from agents_stream.serde.journal import default_journal_codec
from agents_stream.spark.jobs.backfill import run_backfill
from agents_stream.spark.jobs.backfill_task import (
    BackfillTask,
    InputRecord,
    emit_rows,
    run_partition,
)
from agents_stream.spark.jobs.common import committed_offsets
from agents_stream.testing.topics import read_topic
from tests.spark.workload import APP_SPEC, SparkAppEnv, normal_inputs, wait_until

pytestmark = [pytest.mark.broker]
spark_job = pytest.mark.spark

N = 9


def _drained(env: SparkAppEnv, worker) -> None:
    """Waits until the worker group committed every input, then stops the worker."""

    def committed() -> bool:
        return sum(committed_offsets(env.bootstrap, env.app_id, env.input, 2).values()) == N

    wait_until(committed, timeout=90)
    time.sleep(0.5)  # anything the worker would send after its commit
    assert worker.terminate() == 0, worker.log()


@spark_job
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


@spark_job
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


def test_outputs_of_a_backfill_that_died_before_its_markers_are_found(
    broker, topic_factory, worker_factory, tmp_path
):
    """The job's executors journaled the actions and sent the outputs to the agent's
    topic, then the job died before the emitted markers were written: the worker that
    consumes the inputs finds every output by its identity header and sends none. Runs
    the backfill's task and send steps without Spark (they import none of it)."""
    env = SparkAppEnv.create(broker, topic_factory, tmp_path)
    env.send(normal_inputs(N))
    app = env.app()
    TopicAdmin(broker.bootstrap).ensure([compacted(app.action_state_topic, 2)])
    task = BackfillTask(
        app, 0, app.id, app.action_state_topic, broker.bootstrap, write_journal=True, emits=True
    )
    by_partition: dict[int, list[InputRecord]] = {}
    for r in read_topic(broker.bootstrap, env.input):
        rec = InputRecord(r.partition, r.offset, r.key or "", r.value)
        by_partition.setdefault(r.partition, []).append(rec)
    conf = producer_config(broker.bootstrap)
    codec = default_journal_codec(None, app.action_state_topic)
    for partition, records in by_partition.items():
        rows = run_partition(task, partition, records, [])
        assert sum(len(row["mark_keys"]) for row in rows) == len(records)
        emit_rows(conf, env.output, rows, bootstrap=broker.bootstrap, state_topic=None)
        # A retried attempt of the send step looks its outputs up first: none again.
        already = OutputLog(broker.bootstrap, env.output, app.id, window_s=600)
        sent = emit_rows(
            conf,
            env.output,
            rows,
            bootstrap=broker.bootstrap,
            state_topic=None,
            already=already,
            codec=codec,
        )
        already.close()
        assert sent == 0
    assert len(read_topic(broker.bootstrap, env.output)) == N

    worker = worker_factory(APP_SPEC, env.env)
    _drained(env, worker)
    assert len(read_topic(broker.bootstrap, env.output)) == N, worker.log()
    assert f"outputs_found={N}" in worker.log() and "outputs_resent=0" in worker.log()
    assert env.effects() == {}
