"""Running a job's stages as streaming queries in one Spark driver, under job control.

Each stage (bronze ingest, silver, gold) is its own streaming query with its
own checkpoint; they are chained through their Delta tables. The driver:

* **available-now** runs the stages one after the other, each until it has
  drained what its upstream held when it started, so when it returns every
  stage has caught up with what Kafka held at the start;
* **continuous** (processing-time triggers) runs all stages at once until
  stopped. It starts them one at a time: each query's sources are initialized
  (Spark starts a Python process for each ``streamlake-*`` source) before the
  next query starts, so a busy machine never has all of them starting at once.

A query that fails while Spark starts one of its Python processes ("Python
worker failed to connect back": Spark waits a fixed 10 s, not configurable, for
it to connect) is restarted with the rest of its group, at most
:data:`TRANSIENT_RESTARTS` times per run. That failure comes before the query
ran a batch or in place of one; a restart continues from the checkpoints and
the tables' commits, as after any crash, so it loses and duplicates nothing.
Every other failure ends the run.

It holds the job lock for its whole life and obeys the control files
(:mod:`streamlake.pipeline.control`): STOP ends the job at micro-batch
boundaries; PAUSE stops every running query at a micro-batch boundary,
reports PAUSED and starts them again once PAUSE is gone (savepoints use this).
Progress of every micro-batch of every stage goes to ``report`` and, as JSON
lines with a ``stage`` field, to the control directory's ``progress.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from streamlake.pipeline.control import JobControl

log = logging.getLogger(__name__)


@dataclass
class RunningQuery:
    """A started stage: its streaming query and how to turn Spark's progress into a line."""

    stage: str
    query: object
    progress_line: Callable[[dict], dict]


class Stage(Protocol):
    name: str

    def start(self, spark, available_now: bool) -> RunningQuery:
        """Start the stage's query (available-now, or its processing-time trigger)."""


def run_stages(spark, stages: Sequence[Stage], control: JobControl, *, available_now: bool,
               report: Callable[[str], None] = print, poll_s: float = 1.0, mode: str | None = None,
               query_name: str = "", record: bool = True, handover: str | None = None) -> dict:
    """Run ``stages`` until they end (available-now) or are stopped; see the module docstring.

    Holds the job lock meanwhile and, once it has it, claims the job
    (:meth:`~streamlake.pipeline.control.JobControl.claim`): ``handover`` names the operation
    whose handover this run awaited (its first claim marks it taken); any other run raises
    HandoverPending, having touched nothing, while another operation's handover binds the job.

    Returns a summary (batches and rows per stage, the stages' own counts summed:
    quarantined, duplicates, late...; seconds; whether stopped), recorded in the
    ``operations`` table as a ``pipeline-run`` of ``query_name`` when ``record``.
    Re-raises the first query failure after stopping the other queries."""
    started = time.monotonic()
    totals = {stage.name: {"batches": 0, "rows": 0} for stage in stages}
    launched = time.time()
    with control.running():
        control.claim(handover)
        control.clear_requests(older_than=launched)  # leftovers of earlier runs, not requests made now
        control.write_state(mode=mode or ("available-now" if available_now else "continuous"),
                            pid=os.getpid(), started_at=time.time(), query_name=query_name,
                            stages=[s.name for s in stages])
        follower = _Follower(control, report, poll_s, totals,
                             on_interval=(lambda t: _record_progress(query_name, t)) if record and not available_now
                             else None)
        stopped = False
        pending = list(stages)
        restarts = 0
        while pending:
            group = pending[:1] if available_now else pending
            try:
                outcome = follower.follow(start_group(spark, group, available_now))
            except Exception as exc:  # noqa: BLE001 - re-raised unless a transient start failure
                if not transient_failure(exc) or restarts >= TRANSIENT_RESTARTS:
                    raise
                restarts += 1
                report(f"restarting {', '.join(s.name for s in group)} ({restarts}/{TRANSIENT_RESTARTS}) after a "
                       f"transient failure: {describe_failure(exc)}")
                log.warning("restarting %s after a transient failure", [s.name for s in group], exc_info=True)
                time.sleep(TRANSIENT_BACKOFF_S * restarts)
                continue
            if outcome == "finished":
                pending = pending[len(group):]
                continue
            if outcome == "stopped":
                stopped = True
                break
            control.mark_paused({"paused_at": time.time(), "stages": [s.name for s in group]})
            report("paused at a micro-batch boundary")
            while control.pause_requested() and not control.stop_requested():
                time.sleep(0.2)
            control.clear_paused()
            if control.stop_requested():
                stopped = True
                break
            report("resuming")
        control.clear_requests()
    rows = {name: t["rows"] for name, t in totals.items()}
    summary = {"batches": sum(t["batches"] for t in totals.values()), "rows": next(iter(rows.values()), 0),
               "stages": totals, "seconds": round(time.monotonic() - started, 1), "stopped": stopped}
    if record and summary["batches"]:
        from streamlake.delta.records import record_operation

        record_operation("pipeline-run", query_name, {**summary, "mode": mode or (
            "available-now" if available_now else "continuous")})
    return summary


# A query that failed starting a Python process (see the module docstring) is restarted this
# often per run, after TRANSIENT_BACKOFF_S, twice that, ...
TRANSIENT_RESTARTS = 3
TRANSIENT_BACKOFF_S = 5.0
_TRANSIENT_MESSAGES = ("Python worker failed to connect back",)
# How long a continuous run waits for a query's sources before it starts the next query anyway.
SOURCE_START_TIMEOUT_S = 120.0


def transient_failure(exc: BaseException) -> bool:
    """True for a failure the next attempt can be expected not to meet: Spark timed out waiting
    for a new Python process to connect back (a busy machine), nothing about the data or the
    tables."""
    text = str(exc)
    return any(message in text for message in _TRANSIENT_MESSAGES)


def start_group(spark, group: Sequence[Stage], available_now: bool) -> list[RunningQuery]:
    """Start the queries of ``group`` in order, each once the previous one's sources are
    initialized (or it ended, or SOURCE_START_TIMEOUT_S passed). If a start raises, the
    queries already started are stopped before the error propagates."""
    running: list[RunningQuery] = []
    try:
        for stage in group:
            if running:
                wait_for_sources(running[-1].query, SOURCE_START_TIMEOUT_S)
            running.append(stage.start(spark, available_now))
    except BaseException:
        for r in running:
            if r.query.isActive:
                r.query.stop()
        raise
    return running


def wait_for_sources(query, timeout_s: float) -> bool:
    """Wait until ``query`` is past initializing its sources ("Initializing ..." in its status)
    or no longer active; False if ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and str(query.status.get("message", "")).startswith("Initializing"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


RECORD_EVERY_S = 300  # a continuous run records its counts in the operations table this often


def _record_progress(job: str, totals: dict) -> None:
    from streamlake.delta.records import record_operation

    try:
        record_operation("pipeline-progress", job, {"stages": totals, "mode": "continuous"})
    except Exception:  # noqa: BLE001 - bookkeeping must never stop the job
        log.exception("could not record the pipeline's progress")


class _Follower:
    """Reports progress of running queries and handles stop/pause requests; every
    RECORD_EVERY_S seconds hands the counts since the last time to ``on_interval``."""

    def __init__(self, control: JobControl, report: Callable[[str], None], poll_s: float, totals: dict,
                 on_interval: Callable[[dict], None] | None = None):
        self.control, self.report, self.poll_s, self.totals = control, report, poll_s, totals
        self.on_interval = on_interval
        self.interval_start, self.interval_totals = time.monotonic(), self._snapshot()
        self.progress_path = control.progress_file
        self.progress_path.parent.mkdir(parents=True, exist_ok=True)

    def _snapshot(self) -> dict:
        return {stage: dict(t) for stage, t in self.totals.items()}

    def _maybe_record(self) -> None:
        if self.on_interval is None or time.monotonic() - self.interval_start < RECORD_EVERY_S:
            return
        now = self._snapshot()
        since = {stage: {k: v - self.interval_totals.get(stage, {}).get(k, 0) for k, v in t.items()}
                 for stage, t in now.items()}
        self.on_interval(since)
        self.interval_start, self.interval_totals = time.monotonic(), now

    def follow(self, running: list[RunningQuery]) -> str:
        """Until every query ended: "finished", "stopped" or "paused"."""
        seen: dict[str, int] = {}
        outcome = "finished"
        try:
            while any(r.query.isActive for r in running):
                for r in running:
                    if r.query.isActive:
                        r.query.awaitTermination(self.poll_s / len(running))
                    if r.query.exception() is not None:
                        raise r.query.exception()
                self._drain(running, seen)
                self._maybe_record()
                request = "stopped" if self.control.stop_requested() else \
                    "paused" if self.control.pause_requested() else None
                if request:
                    outcome = request
                    self.report(f"{'stop' if request == 'stopped' else 'pause'} requested: finishing the "
                                "current micro-batch")
                    for r in running:
                        stop_at_boundary(r.query)
        finally:
            for r in running:  # a failure or an interrupt: never leave a query running
                if r.query.isActive:
                    r.query.stop()
        self._drain(running, seen)
        for r in running:
            if r.query.exception() is not None:
                raise r.query.exception()
        return outcome

    def _drain(self, running: list[RunningQuery], seen: dict[str, int]) -> None:
        for r in running:
            for p in map(_plain_progress, r.query.recentProgress):
                if p["batchId"] <= seen.get(r.stage, -1):
                    continue
                seen[r.stage] = p["batchId"]
                try:
                    line = {"stage": r.stage, **r.progress_line(p)}
                except Exception:  # noqa: BLE001 - reporting must never stop the job
                    log.exception("could not report progress of %s batch %s", r.stage, p.get("batchId"))
                    continue
                stage_totals = self.totals[r.stage]
                stage_totals["batches"] += 1
                stage_totals["rows"] += line.get("numInputRows", 0)
                for key in _COUNTED:
                    if isinstance(line.get(key), int):
                        stage_totals[key] = stage_totals.get(key, 0) + line[key]
                with self.progress_path.open("a") as fh:
                    fh.write(json.dumps(line, default=str) + "\n")
                self.report(format_line(line))


def _plain_progress(progress) -> dict:
    """A progress report as the plain dict of Spark's JSON. On Spark Connect, pyspark 4.2 hands
    out StreamingQueryProgress objects whose dict items are partly None (``numInputRows``
    among them) while their attributes and ``json`` are right."""
    return json.loads(progress.json) if hasattr(progress, "json") else progress


def stop_at_boundary(query) -> None:
    """Stop ``query`` between two micro-batches: wait for the running one, then stop."""
    while query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()


# Counts of a stage's progress line that a run's summary adds up.
_COUNTED = ("quarantined", "duplicates", "events", "valid", "late", "windows")
_PLAIN_KEYS = {"stage", "batchId", "timestamp", "numInputRows", "processedRowsPerSecond", "durationMs", "endOffset"}


def format_line(line: dict) -> str:
    """One progress line (as written to progress.jsonl) for people: stage, batch, rows, and
    the stage's own counts (lag for bronze; quarantined/duplicates, late/watermark downstream)."""
    stage = line.get("stage", "bronze")
    if stage == "bronze":
        return f"bronze {format_bronze(line)}"
    extra = ", ".join(f"{k} {v}" for k, v in line.items() if k not in _PLAIN_KEYS)
    return (f"{stage} batch {line['batchId']}: {line['numInputRows']} rows, "
            f"{line.get('processedRowsPerSecond') or 0:,.0f} rows/s" + (f", {extra}" if extra else ""))


def format_bronze(p: dict) -> str:
    """A bronze progress line (:func:`streamlake.pipeline.ingest.batch_progress`): its lag per
    Kafka partition, its Delta version, the offsets it skipped."""
    lag = p["lag"]
    lag_text = ", ".join(f"{tp}={n}" for tp, n in lag.items())
    version = p["deltaVersion"] if p["deltaVersion"] is not None else "-"
    return (f"batch {p['batchId']}: {p['numInputRows']} rows, {p['processedRowsPerSecond']:,.0f} rows/s, "
            f"lag {sum(lag.values())} ({lag_text}), delta version {version}"
            + (f"; skipped offsets Kafka no longer held (failOnDataLoss=false): {p['skipped']}"
               if p.get("skipped") else ""))


def read_progress(control: JobControl, stage: str | None = None) -> list[dict]:
    """The job's progress lines (optionally of one stage), oldest first."""
    path = control.progress_file
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if stage is None or line.get("stage", "bronze") == stage]


# "streamlake.delta.log.ChangeCommitError: ..." as Py4J and Python workers print it.
_ERROR_LINE = re.compile(r"streamlake\.(?:\w+\.)*?(\w+(?:Error|GaveUp)): (.+)")


def platform_error(message: str) -> bool:
    """True if a :func:`describe_failure` message names one of the platform's own errors."""
    from streamlake.errors import StreamLakeError

    def names(cls: type) -> set[str]:
        return {cls.__name__}.union(*(names(sub) for sub in cls.__subclasses__()))

    return message.split(":")[0] in names(StreamLakeError)


def describe_failure(exc: BaseException) -> str:
    """The platform error inside a (Py4J/streaming) exception, else its first line."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"

