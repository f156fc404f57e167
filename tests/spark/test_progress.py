"""Progress of Spark job steps: records done / total from the planned ranges and the
status tracker's task counts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from agents_stream import App
from agents_stream.durable.journal import ActionDone, ActionRef
from agents_stream.spark.frames import ActionStateWriter
from agents_stream.spark.jobs import progress
from agents_stream.spark.jobs.audit import run_audit
from agents_stream.testing.topics import create_topics
from tests.apps.spark_app import Pipeline
from tests.spark.workload import PROCESS


@pytest.mark.broker
@pytest.mark.spark
def test_audit_steps_log_records_done_out_of_the_planned_total(
    spark, broker, topic_factory, monkeypatch, caplog
):
    monkeypatch.setattr(progress, "INTERVAL", 0.0)  # a line at every poll, however quick
    app = App(topic_factory("app"), partitions=2)
    app.agent(Pipeline, input=topic_factory("in"))
    create_topics(broker.bootstrap, [app.action_state_topic], 2)
    with ActionStateWriter(broker.bootstrap, app.action_state_topic) as writer:
        writer.write((i % 2, ActionDone(ActionRef(f"k{i}", i, PROCESS, i % 2))) for i in range(20))

    with caplog.at_level(logging.INFO, logger="agents_stream.spark.jobs"):
        run_audit(spark, app, broker.bootstrap, None, inputs=False, outputs=False)

    lines = [r.getMessage() for r in caplog.records if "records (" in r.getMessage()]
    step = f"audit: read and decode {app.action_state_topic}"
    assert any(line.startswith(f"{step}: 20/20 records (100%)") for line in lines), lines
    assert all("/s" in line for line in lines)


# Field and method names are PySpark's (SparkStageInfo, SparkJobInfo, StatusTracker).
@dataclass
class FakeStage:
    numTasks: int
    numCompletedTasks: int = 0
    numActiveTasks: int = 0


@dataclass
class FakeJob:
    stageIds: list[int]


@dataclass
class FakeTracker:
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    stages: dict[int, FakeStage] = field(default_factory=dict)

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return list(self.jobs)

    def getJobInfo(self, job_id: int) -> FakeJob | None:
        return self.jobs.get(job_id)

    def getStageInfo(self, stage_id: int) -> FakeStage | None:
        return self.stages.get(stage_id)


class FakeSpark:
    def __init__(self, tracker: FakeTracker) -> None:
        self.sparkContext = self
        self._tracker = tracker

    def statusTracker(self) -> FakeTracker:
        return self._tracker


def test_fraction_counts_only_this_steps_started_stages_and_never_goes_back(caplog):
    tracker = FakeTracker({7: FakeJob([0])}, {0: FakeStage(4, 4)})  # an earlier step's job
    steps = progress.StepProgress(FakeSpark(tracker), "g", "scan", 1000, interval=0, tty=False)
    assert steps.fraction() == 0.0

    tracker.jobs[8] = FakeJob([1, 2, 3])
    tracker.stages |= {1: FakeStage(4, 1, 2), 2: FakeStage(8), 3: FakeStage(2)}  # 2, 3 idle
    assert steps.fraction() == pytest.approx(1 / 4)
    steps._advance_to(int(1000 * steps.fraction()))
    tracker.stages[1] = FakeStage(4, 4)
    tracker.stages[2] = FakeStage(8, 0, 1)  # the next stage starts: the fraction drops
    assert steps.fraction() == pytest.approx(4 / 12)
    steps._advance_to(int(1000 * steps.fraction()))
    tracker.stages[2] = FakeStage(8, 0, 1)
    tracker.stages[3] = FakeStage(2, 0, 2)  # yet another stage starts
    assert steps.fraction() == pytest.approx(4 / 14)
    steps._advance_to(int(1000 * steps.fraction()))
    assert steps.progress.done == 333  # never backwards

    with caplog.at_level(logging.INFO, logger="agents_stream.spark.jobs"), steps:
        pass  # the step ends: everything planned was read
    assert steps.progress.done == 1000
    assert caplog.records[-1].getMessage().startswith("scan: 1,000/1,000 records (100%)")
