"""Both example pipelines end to end, on real Spark, the local Kafka broker and Delta on disk.

For each definition in pipelines/ (the sensors demo and the orders example, different
shapes: doubles and ISO times vs exact decimals, epoch-millisecond times, an optional
field, a session window without keys), a labelled stream is produced one record at a
time while the pipeline runs continuously: out of order, late, duplicated and
malformed (every reason, rule violations included). Then a backfill applies the late
events, and the proofs run. Every expectation comes from what the test produced: the
quarantine reason of every malformed record (by its Kafka lineage), silver's typed
values, and every gold table window by window against the test's own plain-Python
aggregate (tests/oracle.py), never against the pipeline's code.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

import oracle
from streamlake.delta.table import open_table, read_table
from streamlake.pipeline.control import JobControl
from streamlake.pipeline.config import PipelineConfig
from streamlake.pipeline.definition import load_definition
from streamlake.pipeline.driver import read_progress, run_stages
from streamlake.pipeline.schemas import QUARANTINE, gold_spec, late_spec, silver_spec

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("sensors", "orders")
MIX = dict(late_fraction=0.06, out_of_order_seconds=5, malformed_fraction=0.08, duplicate_fraction=0.05)
RECORDS = 1500
# Silver, quarantine and late_events compacted once more than this many of their files are small
# (the default, 64, is more micro-batches than these runs have): every test here runs on them.
COMPACT_AFTER = 2
# A silver batch reads at most one bronze batch (bronze writes 4 files a batch here), a gold batch
# at most one of the orders pipeline's silver batches (6 files) and a few of the sensors pipeline's
# (1 or 2): on a slow machine, where a stage's batch outlasts bronze's 1 s trigger, the stages
# still run several batches with late events, so late_events gets more than COMPACT_AFTER files
# (unbounded, a run on a machine twice as slow as usual merged the labelled stream into 3 gold
# batches with late events, not more than the 4 small files it then took to compact).
MAX_FILES_PER_TRIGGER = {"silver": 4, "gold": 6}
# Silver and gold read a small micro-batch on the driver (stage.DRIVER_READ_MAX_BYTES), a large
# one with Spark's tasks. Here the orders pipeline reads every batch with Spark's tasks, so every
# test below checks both ways of reading, against the same oracle.
DRIVER_READ_MAX_BYTES = {"sensors": None, "orders": 0}


def definition_path(name: str) -> Path:
    return ROOT / "pipelines" / f"{name}.yaml"


def bounded_stages(cfg: PipelineConfig) -> list:
    """The run's stages, silver's and gold's batches bounded by MAX_FILES_PER_TRIGGER."""
    from dataclasses import replace

    from streamlake.pipeline.gold import GoldStage
    from streamlake.pipeline.silver import SilverStage

    bound = {SilverStage: MAX_FILES_PER_TRIGGER["silver"], GoldStage: MAX_FILES_PER_TRIGGER["gold"]}
    return [replace(s, max_files_per_trigger=bound[type(s)]) if type(s) in bound else s for s in cfg.build_stages()]


def run_available_now(spark, cfg: PipelineConfig) -> dict:
    return run_stages(spark, cfg.build_stages(), JobControl(cfg.control_dir), available_now=True,
                      report=lambda _line: None, poll_s=0.2)


def caught_up(cfg: PipelineConfig, produced: int) -> bool:
    """Every stage has consumed everything its upstream holds, and bronze holds every record."""
    from streamlake.delta.txn import committed_offsets
    from streamlake.kafka.client import KafkaMetadataClient, client_config
    from streamlake.operations.pipeline_checks import consumed_version, unread_versions

    try:
        bronze, silver = open_table(cfg.table("bronze")), open_table(cfg.table("silver"))
        golds = [open_table(cfg.table(a.gold_table)) for a in cfg.definition.aggregates]
    except FileNotFoundError:
        return False
    with KafkaMetadataClient(client_config()) as kafka:
        tps = kafka.partitions(topics=list(cfg.topics))
    rows = sum(committed_offsets(bronze, tps).values())
    return (rows >= produced and consumed_version(silver, "bronze") == bronze.version()
            and all(unread_versions(silver, consumed_version(g, "silver")) == 0 for g in golds))


class Run:
    """A pipeline that ran over a labelled stream, and what the test knows of that stream."""

    def __init__(self, name: str, cfg: PipelineConfig, producers):
        self.name, self.cfg, self.definition = name, cfg, cfg.definition
        self.raw = oracle.load(definition_path(name))
        self.records = [r for p in producers for r in p.records]
        self.where = [p.lineage[r.seq] for p in producers for r in p.records]  # (partition, offset) by record
        # the progress lines of the run (JSON), before any test ran anything on its root
        self.progress = read_progress(JobControl(cfg.control_dir))
        assert all(len(p.lineage) == len(p.records) for p in producers), "every record's delivery was confirmed"

    def kind(self, kind: str) -> list:
        return [(r, w) for r, w in zip(self.records, self.where) if r.kind == kind]

    @property
    def events(self) -> list[dict]:
        """The valid, de-duplicated events' typed values (valid and late records)."""
        return [r.fields for r in self.records if r.kind in ("valid", "late")]

    def tables(self) -> dict[str, str]:
        return {name: self.cfg.table(name) for name in self.definition.table_names()}

    @property
    def job(self):
        """The root as a named job (what backfills and proofs work on)."""
        from streamlake.operations.jobs import job_for_root, save_job

        return save_job(job_for_root(self.cfg.root, definition_file=str(definition_path(self.name)),
                                     name=f"e2e-{self.name}-{Path(self.cfg.root).parent.name}"))


@pytest.fixture(scope="module", params=PIPELINES)
def pipeline_run(request, spark, broker, tmp_path_factory):
    from dataclasses import replace

    name = request.param
    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    # The example as it is, on a topic of its own (recorded as the root's applied definition).
    definition = replace(load_definition(definition_path(name)), topics=(topic,))
    root = tmp_path_factory.mktemp(f"pipeline-{name}")
    cfg = PipelineConfig(root=str(root / "lake"), definition=definition, processing_time_s=1.0,
                         compact_after_files=COMPACT_AFTER, driver_read_max_bytes=DRIVER_READ_MAX_BYTES[name])
    control = JobControl(cfg.control_dir)
    errors: list[BaseException] = []

    def run():
        try:
            run_stages(spark, bounded_stages(cfg), control, available_now=False, report=lambda _l: None, poll_s=0.5)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the fixture
            errors.append(exc)

    from conftest import LiveProducer

    # A few on-time records first, through every stage, so the watermarks exist when the
    # labelled stream with its late records arrives.
    warmup = LiveProducer(broker, topic, 3, count=30, seed=10, definition=definition).start()
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    producer = None
    try:
        warmup.wait_delivered(30, timeout_s=60)
        warmup.stop()
        deadline = time.monotonic() + 120
        while not caught_up(cfg, 30) and time.monotonic() < deadline and not errors:
            time.sleep(0.5)
        producer = LiveProducer(broker, topic, 3, rate=150, count=RECORDS, seed=11, definition=definition,
                                **MIX).start()
        producer.wait_delivered(RECORDS, timeout_s=120)
    finally:
        for p in (warmup, producer):
            if p is not None:
                p.stop()
    total = 30 + RECORDS
    deadline = time.monotonic() + 240
    while not caught_up(cfg, total) and time.monotonic() < deadline and not errors:
        time.sleep(1)
    control.request_stop()
    runner.join(120)
    assert not errors, errors
    assert caught_up(cfg, total), "the pipeline did not catch up with the stream within 4 minutes"
    return Run(name, cfg, [warmup, producer])


def test_quarantine_holds_exactly_the_malformed_records_with_their_labelled_reasons(spark, pipeline_run):
    run = pipeline_run
    rows = read_table(spark, run.cfg.table("quarantine"), QUARANTINE).collect()
    expected = {(*where, r.reason) for r, where in run.kind("malformed")}
    assert {(r.partition, r.offset, r.reason) for r in rows} == expected
    reasons = set(run.definition.quarantine_reasons())
    assert {r.reason for r in rows} == reasons, "every reason, rules included, was produced and recognised"
    assert all(r.message for r in rows)
    # A wrong JSON type is named in lower case, as the record has it (the JSON value's own
    # type, seen from the test's copy of the record), the declared type as declared.
    fields = {f.name: f for f in run.definition.fields}
    json_type = {str: "string", bool: "boolean", dict: "object", list: "array"}
    sent = {where: record.value for record, where in run.kind("malformed")}
    for r in rows:
        if r.reason == "wrong_type":
            named = re.findall(r"(\w+) is JSON (.+?), not (.+?)(?=, \w+ is JSON |$)",
                               r.message.removeprefix("wrong JSON type: "))
            value = json.loads(sent[(r.partition, r.offset)])
            assert named, r.message
            for name, seen, declared in named:
                assert declared == fields[name].type.sql, r.message
                assert seen == seen.lower() and seen.startswith(json_type.get(type(value[name]), "")), r.message
        elif r.reason == "not_object":
            seen = re.fullmatch(r"the value is JSON (.+), not an object", r.message)
            assert seen and seen[1] == seen[1].lower(), r.message
            assert seen[1].startswith(json_type.get(type(json.loads(sent[(r.partition, r.offset)])), "")), r.message


def test_silver_holds_each_valid_event_once_with_its_typed_values(spark, pipeline_run):
    run = pipeline_run
    d = run.definition
    silver = read_table(spark, run.cfg.table("silver"), silver_spec(d)).toArrow().to_pylist()
    ids = [r[d.event_id] for r in silver]
    assert len(ids) == len(set(ids)), "an event id twice in silver"
    expected = {e[d.event_id]: e for e in run.events}
    assert set(ids) == set(expected)
    for row in silver:
        assert {f: row[f] for f in d.field_names} == expected[row[d.event_id]], row


def test_late_events_are_kept_not_dropped(spark, pipeline_run):
    run = pipeline_run
    for agg in run.definition.aggregates:
        late = read_table(spark, run.cfg.table(agg.late_table), late_spec(run.definition, agg)).collect()
        assert late, f"late events were produced, none was kept for {agg.name}: lateness is not being decided"
        for row in late:  # every late event missed the watermark its batch started with
            assert all(w.end <= row.watermark for w in row.windows), row
            assert not row.applied


def test_the_proof_and_data_quality_pass(spark, pipeline_run):
    """The proof an operation runs: bronze against Kafka, every bronze row once downstream,
    every gold table against a recompute (windows with late events pending set apart),
    Great Expectations on every table."""
    from streamlake.operations.verify import verify_job

    run = pipeline_run
    summary = verify_job(spark, run.job, "test")
    kinds = [c["kind"] for c in summary["checks"]]
    assert kinds.count("gold") == len(run.definition.aggregates) and "pipeline-accounting" in kinds
    assert all(c["passed"] for c in summary["checks"]), summary["checks"]
    assert {q["table"] for q in summary["quality"]} == set(run.definition.table_names())
    assert all(q["status"] in ("PASS", "WARN") for q in summary["quality"]), summary["quality"]


def _rows(df) -> list:
    """The frame's rows, sorted (the tables here are small: one Spark job, compared in Python)."""
    return sorted((tuple(r.values()) for r in df.toArrow().to_pylist()), key=repr)


def _delta_history(spark, path: str) -> list:
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()


def test_delta_spark_reads_every_table_as_the_platform_does(spark, pipeline_run):
    """Delta Lake's own Spark connector (on every Spark JVM of the platform) reads every table
    of the pipeline, by path and by delta.`path`, row for row as the platform's reader does; its
    DESCRIBE HISTORY shows each commit with the positions it carries (bronze: the Kafka offsets
    the test's producer was acknowledged; silver and gold: the upstream table they read); its
    streaming source reads bronze from a given version, each row once. A savepoint is taken for
    the time-travel test after the backfill."""
    from streamlake.operations.savepoints import create_savepoint
    from streamlake.pipeline.schemas import table_spec

    run = pipeline_run
    for name, path in run.tables().items():
        ours = read_table(spark, path, table_spec(run.definition, name))
        theirs = spark.sql(f"SELECT * FROM delta.`{path}`") if name == "bronze" else \
            spark.read.format("delta").load(path)
        assert _rows(theirs.select(*ours.columns)) == _rows(ours), name
        assert _rows(ours) or name.startswith("late_events"), name

    # Bronze's history: every append names the offsets it covers; the newest per partition is
    # the end the test's producer was acknowledged (its last offset + 1).
    history = _delta_history(spark, run.cfg.table("bronze"))
    assert [h.version for h in history] == list(range(len(history)))
    ends: dict[int, int] = {}
    for h in history[1:]:
        assert h.operation == "WRITE", h
        facts = json.loads(h.userMetadata)
        assert facts["operation"] == "ingest" and facts["records"] >= 0, facts
        for topic, by_partition in facts["endOffsets"].items():
            assert topic == run.definition.topics[0], facts
            for partition, offset in by_partition.items():
                ends[int(partition)] = max(ends.get(int(partition), 0), offset)
    expected_ends: dict[int, int] = {}
    for partition, offset in run.where:
        expected_ends[partition] = max(expected_ends.get(partition, 0), offset + 1)
    assert ends == expected_ends
    # Silver and each gold: every data commit says which upstream table it read, and to where.
    for name, upstream in [("silver", "bronze"), *((a.gold_table, "silver") for a in run.definition.aggregates)]:
        commits = [json.loads(h.userMetadata) for h in _delta_history(spark, run.cfg.table(name))
                   if h.userMetadata and json.loads(h.userMetadata).get("source") == upstream]
        assert commits and all(c["to"] for c in commits), name

    if run.name != "sensors":  # the streaming source does not depend on the definition's shape
        return
    # The streaming source from a version in the middle: each row of the versions from there once.
    bronze = run.cfg.table("bronze")
    start = len(history) // 2
    seen: list[tuple] = []

    def collect(df, _batch_id):
        seen.extend((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    import tempfile

    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("delta").option("startingVersion", start).load(bronze)
                 .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
    now = {(r.partition, r.offset) for r in spark.read.format("delta").load(bronze).collect()}
    before = {(r.partition, r.offset) for r in
              read_table(spark, bronze, table_spec(run.definition, "bronze"), version=start - 1).collect()}
    assert len(seen) == len(set(seen)), "a row twice from delta-spark's streaming source"
    assert set(seen) == now - before and seen

    run.savepoint = create_savepoint(run.job, note="before the backfill (test_pipelines)")


def test_backfill_then_every_gold_table_equals_the_tests_own_aggregate(spark, pipeline_run):
    """After a backfill of every pending late event, each gold table holds exactly the
    windows the test computes from the events it produced (after de-duplication)."""
    from streamlake.operations.backfills import backfill_job

    run = pipeline_run
    summary = backfill_job(spark, run.job)
    assert summary["late_events"] > 0 and all(c["passed"] for c in summary["checks"]), summary
    for agg in run.definition.aggregates:
        gold = read_table(spark, run.cfg.table(agg.gold_table), gold_spec(run.definition, agg)).toArrow().to_pylist()
        expected = oracle.expected_gold(run.raw, agg.name, run.events)
        problems = oracle.compare_gold(expected, gold, list(agg.keys))
        assert not problems, f"gold/{agg.name}:\n" + "\n".join(problems[:20])
        assert len(expected) >= 2
        late = read_table(spark, run.cfg.table(agg.late_table), late_spec(run.definition, agg))
        assert late.where("NOT applied").count() == 0


def test_delta_spark_time_travels_to_a_savepoints_versions(spark, pipeline_run):
    """``VERSION AS OF`` a savepoint's version of each table, through Delta's connector, is the
    data the platform reads at that version; gold, which the backfill changed since, differs
    from its current state there. The backfill's commit is in gold's history with its facts."""
    from streamlake.pipeline.schemas import table_spec

    run = pipeline_run
    if run.name != "sensors":
        pytest.skip("one pipeline suffices: time travel does not depend on the definition's shape")
    savepoint = getattr(run, "savepoint", None)
    if savepoint is None:
        pytest.skip("needs the savepoint of test_delta_spark_reads_every_table_as_the_platform_does")
    for state in savepoint.tables:
        spec = table_spec(run.definition, state.name)
        ours = read_table(spark, state.path, spec, version=state.version)
        theirs = spark.sql(f"SELECT * FROM delta.`{state.path}` VERSION AS OF {state.version}").select(*ours.columns)
        assert _rows(theirs) == _rows(ours), state.path
    for agg in run.definition.aggregates:
        path = run.cfg.table(agg.gold_table)
        then = next(s.version for s in savepoint.tables if s.path == path)
        spec = gold_spec(run.definition, agg)
        current = read_table(spark, path, spec)
        old = spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF {then}").select(*current.columns)
        assert _rows(old) != _rows(current), "the backfill changed gold since the savepoint"
        backfills = [json.loads(h.userMetadata) for h in _delta_history(spark, path)
                     if h.version > then and h.userMetadata]
        assert any(f["operation"] == "backfill" and f["aggregate"] == agg.name for f in backfills), backfills


def _sql(*args: str):
    import subprocess
    import sys

    from conftest import SPARK_CONNECT_PORT

    return subprocess.run([str(Path(sys.executable).parent / "streamlake"), "sql",
                           "--remote", f"sc://127.0.0.1:{SPARK_CONNECT_PORT}", *args],
                          capture_output=True, text=True, timeout=120)


def test_streamlake_sql_names_every_table(spark, pipeline_run):
    """``streamlake sql`` on the Spark Connect server (the test session's): the job's tables as
    ``<job>.<table>`` and the platform's as ``streamlake.<table>``; counts equal what the test
    produced; an unknown table and a syntax error are one line each, exit 2."""
    run = pipeline_run
    if run.name != "sensors":
        pytest.skip("one pipeline suffices: the names do not depend on the definition's shape")
    job = re.sub(r"[^A-Za-z0-9_]", "_", run.job.name)  # Spark's catalog takes letters, digits and _
    agg = run.definition.aggregates[0]
    query = (f"SELECT (SELECT count(*) FROM `{job}`.bronze) AS bronze, "
             f"(SELECT count(DISTINCT {run.definition.event_id}) FROM `{job}`.silver) AS events, "
             f"(SELECT count(*) FROM `{job}`.quarantine) AS quarantined, "
             f"(SELECT count(*) FROM `{job}`.{agg.gold_table.replace('/', '_')}) AS windows, "
             f"(SELECT count(*) FROM `{job}`.{agg.late_table.replace('/', '_')} WHERE NOT applied) AS pending, "
             f"(SELECT count(*) FROM streamlake.consistency_checks WHERE job = '{run.job.name}') AS checks")
    done = _sql("--json", query)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["bronze"] == len(run.records)
    assert row["events"] == len({e[run.definition.event_id] for e in run.events})
    assert row["quarantined"] == len(run.kind("malformed"))
    windows = len(oracle.expected_gold(run.raw, agg.name, run.events))
    # every window once the backfill applied the late events (test_backfill_then_... ran first)
    assert row["windows"] == windows if row["pending"] == 0 else 0 < row["windows"] <= windows
    assert row["checks"] >= 1

    unknown = _sql(f"SELECT * FROM `{job}`.no_such_table")
    assert unknown.returncode == 2 and unknown.stdout == ""
    [line] = unknown.stderr.strip().splitlines()
    assert "TABLE_OR_VIEW_NOT_FOUND" in line and f"{job}.bronze" in line and "streamlake.operations" in line, line
    bad = _sql("SELEC 1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "PARSE_SYNTAX_ERROR" in bad.stderr
    assert "stacktrace" not in bad.stderr and " at org.apache" not in bad.stderr, bad.stderr


def test_a_restarted_pipeline_with_lost_checkpoints_writes_nothing_twice(spark, pipeline_run):
    """The run's checkpoints are resumed, then silver's and gold's are deleted (lost): each
    stage resumes from its tables' own position and writes nothing."""
    from streamlake.operations.pipeline_checks import account_for_bronze

    run = pipeline_run
    from dataclasses import replace

    cfg = replace(run.cfg, processing_time_s=None)
    watched = ["silver", "quarantine", *(t for a in run.definition.aggregates for t in (a.gold_table, a.late_table))]
    before = {t: open_table(cfg.table(t)).version() for t in watched}
    run_available_now(spark, cfg)
    for stage in ["silver", *(a.stage for a in run.definition.aggregates)]:
        shutil.rmtree(cfg.checkpoint(stage))
    summary = run_available_now(spark, cfg)
    assert all(summary["stages"][s]["rows"] == 0 for s in summary["stages"] if s != "bronze"), summary
    after = {t: open_table(cfg.table(t)).version() for t in watched}
    assert all(after[t] - before[t] <= 2 for t in before), (before, after)
    assert account_for_bronze(spark, run.tables(), run.definition).passed


def test_a_users_optimize_through_delta_spark_keeps_every_position_and_proof(spark, pipeline_run):
    """A user compacts bronze, silver and a gold table with delta-spark's OPTIMIZE (commits of
    dataChange=false files): the rows stay, every position the tables carry (bronze's offsets,
    silver's and gold's upstream versions) stays, the next run writes nothing twice and the
    proof passes."""
    from streamlake.delta.txn import committed_offsets
    from streamlake.kafka.client import KafkaMetadataClient, client_config
    from streamlake.operations.verify import verify_job

    run = pipeline_run
    if run.name != "orders":
        pytest.skip("one pipeline suffices: OPTIMIZE does not depend on the definition's shape")
    from dataclasses import replace

    tables = ["bronze", "silver", run.definition.aggregates[0].gold_table]
    with KafkaMetadataClient(client_config()) as kafka:
        tps = kafka.partitions(topics=list(run.definition.topics))
    offsets = committed_offsets(open_table(run.cfg.table("bronze")), tps)
    counts = {t: spark.read.format("delta").load(run.cfg.table(t)).count() for t in tables}
    compacted = {}
    for t in tables:
        before = open_table(run.cfg.table(t))
        files = len(before.file_uris())
        # OPTIMIZE bins the files of one partition: a partition of one file has nothing to compact
        # (bronze's ingest_date and gold's window dates split at midnight UTC)
        compacted[t] = sum(n for n in _files_per_partition(before).values() if n > 1)
        metrics = spark.sql(f"OPTIMIZE delta.`{run.cfg.table(t)}`").first()["metrics"]
        after = open_table(run.cfg.table(t))
        assert metrics["numFilesRemoved"] == compacted[t], t
        if compacted[t]:
            assert len(after.file_uris()) < files and after.version() == before.version() + 1, t
        assert spark.read.format("delta").load(run.cfg.table(t)).count() == counts[t], t
    assert compacted["bronze"] > 0, compacted  # its micro-batches' files: something was compacted
    assert committed_offsets(open_table(run.cfg.table("bronze")), tps) == offsets
    summary = run_available_now(spark, replace(run.cfg, processing_time_s=None))
    assert all(summary["stages"][s]["rows"] == 0 for s in summary["stages"]), summary
    assert {t: spark.read.format("delta").load(run.cfg.table(t)).count() for t in tables} == counts
    proof = verify_job(spark, run.job, "after-optimize", quality=False)
    assert all(c["passed"] for c in proof["checks"]), proof["checks"]


def test_silver_quarantine_and_late_events_compact_their_small_files_as_the_stream_runs(pipeline_run):
    """While the stream ran, silver, quarantine and each aggregate's late_events were compacted
    each time more than COMPACT_AFTER of their files were small: each OPTIMIZE commit left
    fewer files holding the same rows, and the upstream position the table carries unchanged.
    (The other tests of this module check the tables' rows against what the test produced,
    after those compactions: late events kept, backfills applying them, the proofs.)"""
    import pyarrow as pa
    from deltalake import DeltaTable

    from streamlake.delta.table import SMALL_FILE_BYTES
    from streamlake.pipeline.stage import committed_position

    run = pipeline_run
    tables = [("silver", "bronze"), ("quarantine", "bronze"),
              *((agg.late_table, "silver") for agg in run.definition.aggregates)]
    for name, upstream in tables:
        path = run.cfg.table(name)
        # the stage's (delta-rs); the orders pipeline's silver also has the user's OPTIMIZE test's (delta-spark)
        history = open_table(path).history()
        compactions = [h["version"] for h in history
                       if h["operation"] == "OPTIMIZE" and "delta-rs" in str(h.get("engineInfo"))]
        assert compactions, f"{name} was never compacted: {[(h['version'], h['operation']) for h in history]}"
        for version in compactions:
            before, after = DeltaTable(path, version=version - 1), DeltaTable(path, version=version)
            files_before, files_after = (pa.table(before.get_add_actions(flatten=True)).to_pydict(),
                                         pa.table(after.get_add_actions(flatten=True)).to_pydict())
            assert sum(size < SMALL_FILE_BYTES for size in files_before["size_bytes"]) > COMPACT_AFTER, \
                (name, version)
            assert len(files_after["path"]) < len(files_before["path"]), (name, version)
            assert sum(files_after["num_records"]) == sum(files_before["num_records"]), (name, version)
            assert committed_position(after, upstream) == committed_position(before, upstream), (name, version)


def test_silver_and_gold_read_their_batches_where_the_run_says(pipeline_run):
    """Every silver and gold micro-batch of the sensors run (small: the default) was read on the
    driver, every one with rows of the orders run (``driver_read_max_bytes=0``) by Spark's tasks; each
    progress line's input rows are the rows the batch read, counted in either way (the sum over
    silver's batches is every record the test produced: silver reads each bronze row once)."""
    run = pipeline_run
    stages = ("silver", *(agg.stage for agg in run.definition.aggregates))
    batches = [b for b in run.progress if b.get("stage") in stages]
    assert {b["stage"] for b in batches} == set(stages)
    # (a batch of no files is "read on the driver" under any limit: there is nothing to read)
    assert {b["read_on_driver"] for b in batches if b["numInputRows"]} == {DRIVER_READ_MAX_BYTES[run.name] != 0}
    assert sum(b["numInputRows"] for b in batches if b["stage"] == "silver") == len(run.records)


def test_gold_freshness_is_the_age_of_the_oldest_record_gold_lacks(pipeline_run, broker):
    """What the Pipelines view shows as gold's freshness: 0 s once gold holds every record
    Kafka holds; then, with records the pipeline has not run on, produced with timestamps
    the test sets (90, 60 and 30 s ago, one per partition), the age of the oldest of them.
    (The last test of its pipeline: nothing runs on that topic after it.)"""
    from confluent_kafka import Producer

    from streamlake.monitoring.freshness import gold_freshness_s

    run = pipeline_run
    if run.name != "sensors":
        pytest.skip("one pipeline suffices: the positions followed are those of every definition")
    job = run.job
    assert gold_freshness_s(job) == 0.0
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": broker, "enable.idempotence": True})
    for partition, age_s in enumerate((90, 60, 30)):
        producer.produce(run.definition.topics[0], b'{"not": "run yet"}', partition=partition,
                         timestamp=now_ms - age_s * 1000)
    assert producer.flush(30) == 0
    assert gold_freshness_s(job, now=now_ms / 1000) == pytest.approx(90.0, abs=0.01)


def _files_per_partition(table) -> dict[tuple, int]:
    import collections

    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    keys = sorted(k for k in actions if k.startswith("partition."))
    return collections.Counter(tuple(actions[k][i] for k in keys) for i in range(len(actions["path"])))


def test_a_kill_while_a_stage_planned_its_first_batch_does_not_block_the_restart(spark, produce, topic_name,
                                                                                   tmp_path):
    """A job SIGKILLed while Spark wrote a stage's first offset-log entry leaves the entry's
    temp file (seen in CI: gold's ``offsets/.0.<uuid>.tmp``). Spark 4.2 then refuses to start
    that query (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY); the restart must run every stage
    and lose or double nothing."""
    from helpers import example, interrupted_checkpoint_write, pipeline_config, run_available_now
    from streamlake.operations.pipeline_checks import account_for_bronze, check_gold

    cfg = pipeline_config(tmp_path / "lake", example("orders", tmp_path, topic_name, lateness="5s"))
    produce(topic_name, 300, seed=41, late_fraction=0.05, duplicate_fraction=0.05, malformed_fraction=0.05,
            definition=cfg.definition)
    stages = ["bronze", "silver", *(a.stage for a in cfg.definition.aggregates)]
    for stage in stages:
        interrupted_checkpoint_write(Path(cfg.checkpoint(stage)) / "offsets")
    summary = run_available_now(spark, cfg)
    assert summary["stages"]["bronze"]["rows"] == 300, summary
    for stage in stages:
        assert [p.name for p in (Path(cfg.checkpoint(stage)) / "offsets").iterdir() if ".tmp" in p.name] == []
    tables = {n: cfg.table(n) for n in cfg.definition.table_names()}
    assert account_for_bronze(spark, tables, cfg.definition).passed
    for agg in cfg.definition.aggregates:
        assert check_gold(spark, tables, cfg.definition, agg).passed


def test_a_change_commit_upstream_stops_the_stage_naming_the_version(spark, produce, topic_name, tmp_path):
    from helpers import example, pipeline_config, run_available_now
    from streamlake.errors import StreamLakeError
    from streamlake.pipeline.driver import describe_failure

    cfg = pipeline_config(tmp_path / "lake", example("sensors", tmp_path, topic_name))
    produce(topic_name, 200, seed=5, definition=cfg.definition)
    run_available_now(spark, cfg)
    open_table(cfg.table("bronze")).delete("partition = 0")  # someone rewrites bronze behind the pipeline's back
    changed = open_table(cfg.table("bronze")).version()
    produce(topic_name, 50, seed=6, definition=cfg.definition)
    with pytest.raises(Exception) as failure:
        run_available_now(spark, cfg)
    message = describe_failure(failure.value)
    assert f"version {changed}" in message and "skipChangeCommits" in message, message
    assert isinstance(failure.value, StreamLakeError) or "ChangeCommitError" in message
