"""How many code blocks of sync actions a worker runs at once, against the real broker.

A sync action's code block holds a thread while it runs, so the thread count caps how
many slow calls are in progress, whatever the in-flight limit: with 64 threads (the cap
before ``App(code_block_threads)``), a worker whose calls take 50 ms finished at most
1,280 records/s. Each record here waits at a barrier for all its peers' code blocks to
run at the same time, so it only succeeds when the worker runs that many at once.
"""

from __future__ import annotations

import time

import pytest

from agents_stream.testing.topics import create_topics, produce, wait_for_records

from .test_observability import free_port, get, sample

pytestmark = pytest.mark.broker


def _env(topic_factory, parties: int, wait_s: float) -> dict[str, str]:
    return {
        "AS_APP_ID": topic_factory("app"),
        "AS_INPUT": topic_factory("in"),
        "AS_OUTPUT": topic_factory("out"),
        "AS_PARTIES": str(parties),
        "AS_WAIT_S": str(wait_s),
    }


def test_default_runs_more_slow_calls_at_once_than_the_old_cap(
    broker, topic_factory, worker_factory
):
    """100 calls in progress together: more than the 64 threads a worker had before."""
    parties = 100
    env = _env(topic_factory, parties, 60)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    worker = worker_factory("tests.apps.slow_calls_app:app", env)
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"i": i}) for i in range(parties)])
    outputs = wait_for_records(broker.bootstrap, env["AS_OUTPUT"], parties, timeout=90)
    assert sorted(o.json() for o in outputs) == sorted(f"served k{i}" for i in range(parties))
    assert "code-block threads are busy" not in worker.log()
    assert worker.terminate() == 0


def test_a_full_pool_is_visible_in_metrics_and_logs(broker, topic_factory, worker_factory):
    """``--code-block-threads 4`` and calls that need 6 at once: the four running ones
    give up at the barrier (the records go to the dead letters, the worker goes on), and
    the operator sees why: the limit and the waits in /metrics, one warning in the log."""
    env = _env(topic_factory, 6, 2)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    port = free_port()
    worker = worker_factory(
        "tests.apps.slow_calls_app:app",
        env,
        extra_args=["--code-block-threads", "4", "--metrics-port", str(port)],
    )
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"i": i}) for i in range(6)])
    letters = wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", 6, timeout=90)
    assert len(letters) == 6, worker.log()
    deadline = time.monotonic() + 30
    while True:
        status, text = get(port, "/metrics")
        if sample(text, "agents_stream_code_blocks_waited_total") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200
    assert sample(text, "agents_stream_code_block_threads_limit") == 4, text
    assert sample(text, "agents_stream_code_blocks_waited_total") == 2, text
    assert sample(text, "agents_stream_code_blocks_waiting") == 0, text
    log = worker.log()
    assert log.count("all 4 code-block threads are busy") == 1, log
    assert "--code-block-threads" in log
    assert worker.terminate() == 0


def test_calls_in_flight_counts_the_calls_a_crash_now_would_run_again(
    broker, topic_factory, worker_factory
):
    """Three calls held at a barrier that waits for five: ``calls_in_flight`` reads 3 while
    they run (started, not journaled: a SIGKILL now runs them again on the next owner),
    then 0 once they failed and were journaled as failures."""
    env = _env(topic_factory, 5, 6)
    create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=2)
    port = free_port()
    worker = worker_factory(
        "tests.apps.slow_calls_app:app", env, extra_args=["--metrics-port", str(port)]
    )
    produce(broker.bootstrap, env["AS_INPUT"], [(f"k{i}", {"i": i}) for i in range(3)])
    seen: list[float | None] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _, text = get(port, "/metrics")
        except OSError:  # not serving yet
            time.sleep(0.2)
            continue
        seen.append(sample(text, "agents_stream_calls_in_flight"))
        if seen[-1] == 3:
            break
        time.sleep(0.1)
    assert seen and seen[-1] == 3, (seen[-5:], worker.log()[-2000:])
    letters = wait_for_records(broker.bootstrap, f"{env['AS_INPUT']}-dlq", 3, timeout=60)
    assert len(letters) == 3
    _, text = get(port, "/metrics")
    assert sample(text, "agents_stream_calls_in_flight") == 0, text
    assert worker.terminate() == 0
