"""Crash injection for the exactly-once tests: SIGKILL the whole job at a named point.

Set ``STREAMLAKE_CRASH_AT`` to ``<point>`` or ``<point>:<batch_id>`` before
starting a job; when the job reaches that point (in that micro-batch) it kills
itself with SIGKILL, with no chance to clean up, exactly like ``kill -9`` of the
spark-submit process tree. Points:

``read``
    inside a Spark task, after records were fetched from Kafka;
``after_files``
    after the micro-batch's data files are written, before the Delta commit;
``after_commit``
    after the Delta commit, before Spark records the batch in its commit log.

and in the silver and gold stages, around each of their tables' commits
(``after_files_<table>``, ``after_commit_<table>`` for ``quarantine``,
``silver``, ``late_events``; ``after_commit_gold``; for the gold stages, the
first aggregate to reach the point): ``after_commit_quarantine`` lands between
silver's two commits, ``after_commit_late_events`` between a gold stage's.

With the variable unset (production) :func:`crash_point` is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV_CRASH_AT = "STREAMLAKE_CRASH_AT"
POINTS = ("read", "after_files", "after_commit", "after_files_quarantine", "after_commit_quarantine",
          "after_files_silver", "after_commit_silver", "after_files_late_events", "after_commit_late_events",
          "after_commit_gold")


def _spark_submit_ancestor():
    """The spark-submit JVM this process descends from (psutil.Process), if any; through its
    launcher for a process the fork server forked (streamlake.procs.spark_lineage)."""
    import psutil

    from streamlake.procs import spark_lineage

    for parent in spark_lineage():
        try:
            if any("SparkSubmit" in part for part in parent.cmdline()):
                return parent
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def kill_job() -> None:
    """SIGKILL the spark-submit JVM and every process below it (and those the fork server forked
    for it), then this process.

    The process tree, not process groups: whoever launched spark-submit (a
    shell, the CLI, an Airflow task) may share its group and must survive, as
    it would when a real job's machine dies.
    """
    import psutil

    from streamlake.procs import forked_below

    jvm = _spark_submit_ancestor()
    victims = []
    if jvm is not None:
        victims = [jvm]
        try:
            victims += jvm.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        victims += forked_below([p.pid for p in victims])  # Spark's Python processes the fork server forked
    me = os.getpid()
    for proc in victims:
        if proc.pid != me:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
    os.kill(me, signal.SIGKILL)


def crash_point(point: str, batch_id: int | None = None) -> None:
    """Kill the job here if ``STREAMLAKE_CRASH_AT`` names this point (and batch)."""
    spec = os.environ.get(ENV_CRASH_AT)
    if not spec:
        return
    name, _, batch = spec.partition(":")
    if name != point:
        return
    if batch and batch_id is not None and int(batch) != batch_id:
        return
    kill_job()
