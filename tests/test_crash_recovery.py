"""Kill the ingest job with SIGKILL at the worst moments, restart it, prove exactly-once.

Each job that crashes is a real ``streamlake ingest`` -> spark-submit process tree;
the crash is injected with STREAMLAKE_CRASH_AT (see streamlake.faults), which kills
the whole tree with SIGKILL at that point, like ``kill -9``. The restart after it
runs the same ingest in the test's SparkSession (a warm JVM): what it recovers from
is on disk (the table, its commits' positions, the checkpoint), not in a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import delta_log_entries, ingest
from streamlake.delta.table import open_table, snapshot_files, vacuum_table

pytestmark = pytest.mark.slow
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


def cli_ingest(lake, topic, *extra, env=None, wait=True):
    cmd = [STREAMLAKE, "ingest", "--topic", topic, "--table", lake["table"], "--checkpoint", lake["checkpoint"],
           "--available-now", "--master", "local[2]", *extra]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def cli_audit(lake, topic) -> dict:
    done = subprocess.run([STREAMLAKE, "audit", "--topic", topic, "--table", lake["table"]],
                          capture_output=True, text=True, env=os.environ, timeout=120)
    assert done.returncode == 0, f"audit not clean:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def committed_attempts(table: str) -> list[dict]:
    return [a["commitInfo"]["streamlake"] for commit in delta_log_entries(table) for a in commit
            if "commitInfo" in a and "streamlake" in a["commitInfo"]]


def files_on_disk(table: str, parquet_only: bool = True) -> set[str]:
    root = Path(table)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet" if parquet_only else "*")
            if p.is_file() and "_delta_log" not in p.parts}


def files_in_snapshot(table: str) -> set[str]:
    root = Path(table).resolve()
    return {str(Path(f).resolve().relative_to(root)) for f in snapshot_files(open_table(table))}


@pytest.mark.parametrize("point", ["read", "after_files", "after_commit"])
def test_sigkill_at_each_crash_point_then_restart(spark, produce, topic_name, lake, point):
    produce(topic_name, 1500, partitions=3, seed=21)
    ingest(spark, lake, topic_name)  # some history: the crash happens in a later batch
    version_before = open_table(lake["table"]).version()
    produce(topic_name, 1500, partitions=3, seed=22)

    code, out = cli_ingest(lake, topic_name, "--max-offsets-per-trigger", "600", env={"STREAMLAKE_CRASH_AT": point})
    assert code == 128 + 9, f"the job should have been SIGKILLed at {point}:\n{out[-3000:]}"
    version_crashed = open_table(lake["table"]).version()
    orphans = files_on_disk(lake["table"]) - files_in_snapshot(lake["table"])
    if point == "read":  # killed inside a Spark task: at most a file under _temporary
        assert version_crashed == version_before
        assert all("/_temporary/" in f for f in orphans), orphans
    elif point == "after_files":
        assert version_crashed == version_before
        assert orphans, "the killed attempt had written its data files"
    else:  # after_commit: the Delta commit landed, Spark never recorded the batch
        assert version_crashed == version_before + 1

    ingest(spark, lake, topic_name, max_offsets_per_trigger=600)  # the restart
    summary = cli_audit(lake, topic_name)
    assert summary["table_rows"] == summary["kafka_records"] == 3000

    # No file of an aborted attempt is visible, and each micro-batch was committed once.
    attempts = committed_attempts(lake["table"])
    committed_ids = {a["attempt"] for a in attempts}
    visible = files_in_snapshot(lake["table"])
    assert all(any(aid in f for aid in committed_ids) for f in visible)
    assert not (orphans & visible)
    batches = [(a["queryId"], a["batchId"]) for a in attempts]
    assert len(batches) == len(set(batches)), f"a batch was committed twice: {batches}"
    # Abort = never referenced; the platform's vacuum deletes every leftover, and only those.
    assert {f for f in vacuum_table(lake["table"], retention_hours=0, dry_run=True) if f.endswith(".parquet")} == orphans
    vacuum_table(lake["table"], retention_hours=0, dry_run=False)
    assert files_on_disk(lake["table"], parquet_only=False) == visible
    cli_audit(lake, topic_name)


@pytest.mark.scenario
def test_two_ingest_processes_race_on_one_table(produce, topic_name, lake, tmp_path):
    produce(topic_name, 4000, partitions=3, seed=31)
    jobs = [
        cli_ingest({**lake, "checkpoint": str(tmp_path / f"ck{i}")}, topic_name, "--max-offsets-per-trigger", "300",
                   "--query-name", f"racer{i}", wait=False)
        for i in (1, 2)
    ]
    outputs = [job.communicate(timeout=400)[0] for job in jobs]
    for job, out in zip(jobs, outputs):
        assert job.returncode == 0, out[-3000:]
    summary = cli_audit(lake, topic_name)
    assert summary["table_rows"] == 4000

    # Committed ranges tile each partition without overlap, whoever wrote them.
    ranges: dict[str, list[tuple[int, int]]] = {}
    for a in committed_attempts(lake["table"]):
        for topic, parts in a["endOffsets"].items():
            for p, end in parts.items():
                ranges.setdefault(p, []).append((a["startOffsets"][topic][p], end))
    for p, rs in ranges.items():
        rs.sort()
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(rs, rs[1:])), f"overlapping commits on {p}: {rs}"
    writers = {a["queryId"] for a in committed_attempts(lake["table"])}
    lost = sum(out.count("lost to a concurrent commit") for out in outputs)
    print(f"{len(writers)} writers committed; {lost} commit attempts lost the race and were re-planned")
