"""A job has one identity: two roots are two jobs, one root is one job whichever command
reaches it first, and its settings are recorded as given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import SPARK_CONNECT_PORT
from helpers import run_available_now
from streamlake.operations.jobs import identity_file, job_for_root, load_job, root_identity, save_job

ROOT = Path(__file__).resolve().parents[1]
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


def definition_file(tmp_path: Path, name: str, topic: str) -> Path:
    """The sensors example under another name and topic."""
    data = yaml.safe_load((ROOT / "pipelines" / "sensors.yaml").read_text())
    data.update(name=name, topics=[topic])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_two_roots_of_one_definition_are_two_jobs_and_a_root_keeps_its_job(tmp_path):
    definition = definition_file(tmp_path, "pipe", "pipe-topic")
    a, b = tmp_path / "A" / "pipe", tmp_path / "B" / "pipe"
    job_a = save_job(job_for_root(a, definition_file=str(definition)))
    job_b = save_job(job_for_root(b, definition_file=str(definition)))
    assert job_a.name == "pipe" and job_b.name.startswith("pipe-") and job_b.name != job_a.name
    assert root_identity(a) == job_a.name and root_identity(b) == job_b.name
    # whichever command comes next, each root is its own job
    assert job_for_root(b).name == job_b.name and job_for_root(a).name == job_a.name
    assert load_job(job_b.name).root == str(b)
    # a root is one job: another name for it is refused, as is taking another root's name
    with pytest.raises(ValueError, match="is the root of job 'pipe'"):
        job_for_root(a, name="other")
    with pytest.raises(ValueError, match="already lives at"):
        save_job(job_for_root(tmp_path / "C", definition_file=str(definition), name="pipe"))
    assert json.loads(identity_file(a).read_text()) == {"name": "pipe"}


def _run(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([STREAMLAKE, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done


def _versions(root: Path) -> dict[str, int]:
    from streamlake.delta.table import open_table

    return {name: open_table(root / name).version() for name in ("bronze", "silver", "quarantine",
                                                                   "gold/per_minute", "late_events/per_minute")}


@pytest.mark.slow
@pytest.mark.scenario
def test_pipeline_run_and_backfill_of_two_roots_each_touch_only_their_own_tables(tmp_path, produce, broker, spark,
                                                                                monkeypatch):
    """The user's sequence from issue 22: `pipeline run --root A/pipe`, `pipeline run --root
    B/pipe`, then `backfill --root B/pipe` and `backfill --root A/pipe`. Both backfills
    succeed and each touches only its own tables; the job spec records the options given.
    The second wave of data goes through each root's recorded job in the test's SparkSession
    (the same stages `pipeline run` runs, without two more JVM starts). Every run and backfill
    is a client of the session's Spark Connect server (the CLI's spark-submit way is run by
    test_pipeline_crashes for `pipeline run` and test_object_storage's cluster test for both)."""
    topic_a, topic_b = f"pipe-a-{os.getpid()}", f"pipe-b-{os.getpid()}"
    a, b = tmp_path / "A" / "pipe", tmp_path / "B" / "pipe"
    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))  # a user's home: no job named pipe yet
    monkeypatch.setenv("STREAMLAKE_KAFKA_BOOTSTRAP", broker)
    env = {**os.environ, "STREAMLAKE_KAFKA_BOOTSTRAP": broker}
    runs = []
    for root, topic in ((a, topic_a), (b, topic_b)):
        folder = tmp_path / f"definition-{root.parent.name}"
        folder.mkdir()
        runs.append(["pipeline", "run", "--definition", str(definition_file(folder, "pipe", topic)), "--root",
                     str(root), "--available-now", "--max-offsets-per-trigger", "1500",
                     "--kafka-option", "fetch.wait.max.ms=100"])
    remote = ["--remote", f"sc://127.0.0.1:{SPARK_CONNECT_PORT}"]  # the test session's Spark Connect server
    runs = [run + remote for run in runs]
    # Two waves: gold's first micro-batch has no watermark yet, the second finds late readings.
    for wave, late in ((1, 0.0), (2, 0.3)):
        for topic in (topic_a, topic_b):
            produce(topic, 200, partitions=2, late_fraction=late, malformed_fraction=0.05, duplicate_fraction=0.05,
                    seed=wave)
        for run, root in zip(runs, (a, b)):
            if wave == 1:
                done = _run(run, env)  # the user's CLI: it names and records each root's job
                assert "on the Spark Connect server sc://" in done.stderr, done.stderr
                assert "pipeline finished: bronze 200 rows" in done.stdout, done.stdout
            else:
                run_available_now(spark, job_for_root(root).pipeline_config())
    name_a, name_b = root_identity(a), root_identity(b)
    assert name_a == "pipe" and name_b.startswith("pipe-")
    spec = load_job(name_a)
    assert spec.max_offsets_per_trigger == 1500, "recorded as given, not replaced by a default"
    assert spec.kafka == {"fetch.wait.max.ms": "100"}
    assert (spec.min_partitions, spec.gold_partitions, spec.processing_time_s) == (None, None, None), \
        "options not given are not recorded"
    before_a, before_b = _versions(a), _versions(b)
    done_b = _run(["backfill", "--root", str(b), *remote], env)
    assert "on the Spark Connect server sc://" in done_b.stderr, done_b.stderr
    out_b = done_b.stdout
    assert _versions(a) == before_a, "a backfill of B touched A's tables"
    after_b = _versions(b)
    assert after_b["gold/per_minute"] > before_b["gold/per_minute"], out_b
    done_a = _run(["backfill", "--root", str(a), *remote], env)
    assert "on the Spark Connect server sc://" in done_a.stderr, done_a.stderr
    out_a = done_a.stdout
    assert _versions(b) == after_b, "a backfill of A touched B's tables"
    assert _versions(a)["late_events/per_minute"] > before_a["late_events/per_minute"], out_a
    for out in (out_a, out_b):
        assert "restated" in out and "VIOLATED" not in out and "FAIL" not in out, out
