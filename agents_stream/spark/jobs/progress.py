"""Records done / total, rate and ETA of a Spark job step, from the driver.

The total is known before anything runs: the planner resolves every offset range the
step reads (:func:`planned_records`). What Spark reports while it runs is tasks, so a
daemon thread on the driver polls ``SparkContext.statusTracker()`` for the Spark jobs of
the step's job group and scales the total by the fraction of their tasks completed. It
is an estimate (tasks differ in size; a step can be several Spark jobs whose later stages
appear only when they start), never shown above the total nor going backwards, and exact
at the end. Lines go through :class:`agents_stream.progress.Progress`: rewritten in place
on a terminal, a log line every :data:`INTERVAL` seconds otherwise. Polling only reads
the driver's status store, so it works the same in local mode and on a cluster, with or
without the Spark UI.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ...errors import AgentsStreamError
from ...progress import Progress
from ..source.offsets import plan_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("agents_stream.spark.jobs")

INTERVAL = 5.0
"""Seconds between progress log lines when stderr is not a terminal."""
POLL = 0.5
"""Seconds between status tracker polls (reading the driver's in-memory status store)."""

# PySpark pins a py4j connection to each Python thread and py4j logs its closing at INFO:
# one line of noise per step from the polling thread, unless the app chose a level.
_PY4J = logging.getLogger("py4j.clientserver")


def planned_records(bootstrap: str, topics: Sequence[str], **options: Any) -> int | None:
    """Records that reads of ``topics`` (options as for :func:`read_kafka`) cover now.

    A topic that cannot be planned (missing, unreachable) counts for nothing and is only
    logged at debug level: progress is a convenience, the step itself reports the error.
    ``None`` when no topic could be planned.
    """
    total: int | None = None
    for topic in topics:
        try:
            ranges = plan_ranges(bootstrap, topic, **options)
        except AgentsStreamError as exc:
            log.debug("no record total for %s: %s", topic, exc)
            continue
        total = (total or 0) + sum(r.size for r in ranges)
    return total


class StepProgress:
    """Reports a step's progress while its Spark actions run in job group ``group``.

    Args:
        spark: the session running the step.
        group: the job group the step's actions run in (already set by the caller).
        label: what the step does, e.g. ``"audit: read and decode app-action-state"``.
        total: records the step reads.
        interval: seconds between log lines (default :data:`INTERVAL`).
        stream, tty: as for :class:`~agents_stream.progress.Progress`.
    """

    def __init__(
        self,
        spark: SparkSession,
        group: str,
        label: str,
        total: int,
        *,
        interval: float | None = None,
        stream: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        if _PY4J.level == logging.NOTSET:
            _PY4J.setLevel(logging.WARNING)
        self._tracker = spark.sparkContext.statusTracker()
        self._group = group
        self._total = total
        self.progress = Progress(
            label,
            total=total,
            interval=INTERVAL if interval is None else interval,
            stream=stream,
            tty=tty,
            logger=log,
        )
        # Jobs of the group before this step belong to earlier steps.
        self._earlier = set(self._tracker.getJobIdsForGroup(group))
        # stage id -> (completed, tasks): kept once seen, since the tracker forgets
        # finished stages beyond its retention limit.
        self._stages: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{group}", daemon=True)

    def __enter__(self) -> StepProgress:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self._advance_to(self._total)
        self.progress.close()

    def fraction(self) -> float:
        """Completed tasks / tasks of the step's started stages so far."""
        for job_id in self._tracker.getJobIdsForGroup(self._group):
            if job_id in self._earlier:
                continue
            job = self._tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = self._tracker.getStageInfo(stage_id)
                # Stages that never start (skipped: their output is cached or already
                # shuffled) would hold the fraction below 1 forever.
                if stage is not None and stage.numActiveTasks + stage.numCompletedTasks > 0:
                    self._stages[stage_id] = (stage.numCompletedTasks, stage.numTasks)
        tasks = sum(t for _, t in self._stages.values())
        return sum(c for c, _ in self._stages.values()) / tasks if tasks else 0.0

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            try:
                self._advance_to(int(self._total * self.fraction()))
            except Exception as exc:
                # A display must never fail the job (e.g. py4j errors while the session
                # stops); the step goes on without it.
                log.debug("progress poll failed: %s", exc)
                return

    def _advance_to(self, done: int) -> None:
        done = min(done, self._total)
        if done > self.progress.done:
            self.progress.advance(done - self.progress.done)
