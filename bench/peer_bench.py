"""The peer bench (issue 71): our bronze ingest against the textbook Spark stack, same Kafka topics.

Two stacks, each a spark-submit application on the same Spark master
(``--master``, default ``local[2]``), one after the other, reading the same
Apache Kafka topics of a private local broker (``common.private_broker``):

* **textbook**: Spark's own Kafka source (``spark.readStream.format("kafka")``)
  -> ``foreachBatch`` -> a delta-spark append with Delta's idempotent writes
  (``txnAppId`` = the query, ``txnVersion`` = the micro-batch id): the standard
  way a Spark user writes Kafka into Delta exactly once
  (``bench/peer_textbook_job.py``, started with
  ``streamlake.spark.session.spark_submit_command`` and ``job_environment``:
  the platform's Spark defaults, Delta's SQL extension and catalog, the Kafka
  source and Delta's connector on the class path);
* **ours**: ``streamlake ingest --available-now`` (``--processing-time`` for the
  latency part), the bronze job as users run it, as ``bench/ingest_bench.py``
  and ``bench/latency_bench.py`` run it.

Each side at its best settings (``SETTINGS`` below says which and why). Two
shapes of topic, as ``ingest_bench.py`` produces them:

* ``bulk``: ``--records`` records (1,000,000) of ~``--value-bytes`` (1000) B in
  ``--partitions`` (6) partitions, produced in bulk (``linger.ms=20``);
* ``one-record``: the same number written one record per record batch
  (``linger.ms=0``, ``batch.num.messages=1``), as a live producer writes.

For each shape:

1. **Throughput**: each stack drains the topic (available-now) into a table of
   its own, ``--runs`` (2) times, alternated (textbook, ours; then ours,
   textbook), the faster counts. From each query's progress: the whole run
   (every micro-batch, the first included; JVM start-up apart, reported as end
   to end) and warm (the micro-batches after the first). Both read at most
   ``--max-offsets-per-trigger`` records per micro-batch (default half the
   topic plus one per partition: two micro-batches on both, as
   ``ingest_bench.py``'s 500,000 of 1,000,000; Spark's Kafka source rounds
   each partition's share down, so exactly half left a third micro-batch of a
   few records).
2. **Latency**: each stack at a ``--trigger-s`` (1 s) processing-time trigger
   on a fresh topic of its own while ``common.SteadyProducer`` writes
   ``--latency-rate`` (2,000) records/s for ``--latency-seconds`` (60), batched
   as the shape says (``bulk``: librdkafka's own batching, a producer
   application's; ``one-record``: one record per record batch), after a
   priming trickle that shows the job is up. A reader polls the table with
   delta-rs (``latency_bench.Poller``) and notes when each record is first in
   the table's latest version; latency = then - the record's Kafka timestamp
   (produce time). p50, p95, p99, max. A record still not visible
   ``--drain-timeout`` (300) s after the producer's end counts as then - its
   broker's ack, and the figures are marked as lower bounds.
3. **Exactly once**: every table (each throughput run's, each latency run's)
   holds every record of its topic exactly once: rows = Kafka's records, and
   per partition the distinct offsets = the rows = Kafka's range, first and
   last offsets included. Otherwise the bench says VIOLATED and exits 1.

Goal (issue 71): ours >= 1.0x the textbook's throughput on every shape (whole
run and warm), with a p99 no worse than the textbook's. Writes
``peer.json``, ``peer.md`` and ``peer.png`` to ``--results`` (default
bench/results; use another directory for trial runs); ``--render``: the .md
and .png again from the .json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ingest_bench  # noqa: E402
import latency_bench  # noqa: E402
from common import (  # noqa: E402
    RESULTS,
    SteadyProducer,
    load,
    machine,
    private_broker,
    progress,
    run_job,
    rewrite_results,
    spark_cores,
    write_results,
)

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "peer"
TEXTBOOK_JOB = HERE / "peer_textbook_job.py"
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
SHAPES = ("bulk", "one-record")
SHAPE_LABEL = {"bulk": "bulk-produced topic", "one-record": "one record per record batch"}
# How the latency part's steady producer batches, per shape (common.PRODUCER_BATCHING).
LATENCY_BATCHING = {"bulk": "client-defaults", "one-record": "one-record"}
STACKS = ("textbook", "ours")
TARGET_RATIO = 1.0
STOP_WAIT_S = 120
# The textbook job's Spark settings on top of the platform's (SETTINGS says why).
TEXTBOOK_CONF = {"spark.databricks.delta.snapshotPartitions": "1"}

SETTINGS = {
    "textbook": [
        "Spark's Kafka source with `startingOffsets=earliest`, `failOnDataLoss=true`, `maxOffsetsPerTrigger` as "
        "ours (the same micro-batches on both sides: a micro-batch's fixed costs weigh the same on each), "
        "`minPartitions` unset: one read task per Kafka partition (6 on 2 cores: three even waves; more would "
        "only cut each partition into smaller tasks, each with a Kafka consumer of its own to start and seek), "
        "the Kafka consumer's own defaults (`--textbook-option` passes others);",
        "`foreachBatch` with `df.write.format(\"delta\").mode(\"append\").option(\"txnAppId\", app)"
        ".option(\"txnVersion\", batch_id).save(path)`: the DataFrame as the source gives it (Spark's Kafka "
        "columns), unpartitioned, Delta's defaults (statistics on the first 32 columns, a checkpoint every "
        "10 commits) but `spark.databricks.delta.snapshotPartitions=1` (Delta's default 50, the platform's 4): "
        "with `txnAppId` every append computes the table's snapshot state in Spark jobs (the log replayed, "
        "shuffled into that many partitions) to read the application's last `txnVersion`, and for a log of "
        "tens of commits on 2 cores one partition did that fastest (tried here: 1 against 4, a few appends "
        "each; without `txnAppId` those jobs do not run, nor would the write be exactly once);",
        "the platform's other Spark defaults (`streamlake.spark.session.spark_defaults()`: Delta's SQL extension "
        "and catalog, the class archive, the parallel collector) and the JVM's tiered JIT: its data path (Kafka consumer, "
        "Parquet writer) is JVM code, which C2 compiles (our job stops at C1: its data path is Python).",
    ],
    "ours": [
        "`streamlake ingest --available-now --max-offsets-per-trigger N --master M` (`--processing-time 1` for "
        "the latency part), its defaults: one read task per core (`minPartitions` = Spark's default parallelism), "
        "the read tasks writing the bronze Parquet files with pyarrow (`--writer source`), one delta-rs commit "
        "per micro-batch with the offsets, the Python workers warmed up before the first micro-batch; the bronze "
        "table adds `ingest_time`, `batch_id` and the partition column `ingest_date` to Spark's Kafka columns.",
    ],
}


# -- the textbook stack ----------------------------------------------------------------------------

def textbook_command(topic: str, root: Path, args, mode: list[str]) -> list[str]:
    """spark-submit argv of the textbook job (``bench/peer_textbook_job.py``) reading ``topic``
    into ``root/table`` (checkpoint, progress, stop file in ``root``)."""
    from streamlake.spark.session import spark_submit_command

    job_args = ["--bootstrap", os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"], "--topic", topic,
                "--table", str(root / "table"), "--checkpoint", str(root / "checkpoint"),
                "--progress", str(root / "progress.jsonl"), "--stop-file", str(root / "stop"), *mode]
    if args.textbook_min_partitions:
        job_args += ["--min-partitions", str(args.textbook_min_partitions)]
    for option in args.textbook_option:
        job_args += ["--option", option]
    conf = {**TEXTBOOK_CONF, **dict(item.split("=", 1) for item in args.textbook_conf)}
    # An absolute path: spark_submit_command's jobs/<job> resolves to it.
    return spark_submit_command(str(TEXTBOOK_JOB), job_args, master=args.master, conf=conf,
                                name=f"peer_textbook:{root.name}")


def _read_batches(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def figures(batches: list[dict], wall: float) -> dict:
    """Throughput of an available-now run from its micro-batches' progress (as ingest_bench)."""
    processing = sum(b["durationMs"] or 0 for b in batches) / 1000
    records = sum(b["numInputRows"] for b in batches)
    out = {"wall_seconds": round(wall, 2), "processing_seconds": round(processing, 2),
           "startup_seconds": round(wall - processing, 2), "records": records,
           "records_per_second": round(records / processing, 1) if processing else 0.0,
           "end_to_end_records_per_second": round(records / wall, 1)}
    warm = [b for b in batches[1:] if b["numInputRows"]]
    if warm:
        warm_s = sum(b["durationMs"] for b in warm) / 1000
        out.update({"warm_records": sum(b["numInputRows"] for b in warm), "warm_seconds": round(warm_s, 2)})
        out["warm_records_per_second"] = round(out["warm_records"] / warm_s, 1)
    return out


def textbook_throughput(topic: str, tag: str, args, max_offsets: int) -> dict:
    """The textbook job, available-now, on ``topic`` into a table of its own; its micro-batches."""
    from streamlake.spark.session import job_environment

    root = WORK / f"textbook-{tag}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cmd = textbook_command(topic, root, args, ["--available-now", "--max-offsets-per-trigger", str(max_offsets)])
    log = root / "job.log"
    before = load()
    code, wall = run_job(cmd, log, env=job_environment(), new_session=True)
    if code != 0:
        raise SystemExit(f"the textbook job failed (exit {code}); see {log}")
    batches = [b for b in _read_batches(root / "progress.jsonl") if b["numInputRows"]]
    if not batches:
        raise SystemExit(f"the textbook job reported no micro-batch with rows; see {log}")
    return {"stack": "textbook", "table": str(root / "table"), "batches": batches, **figures(batches, wall),
            "load": [before, load()]}


# -- our stack -------------------------------------------------------------------------------------

def ours_throughput(topic: str, tag: str, args, max_offsets: int) -> dict:
    """``streamlake ingest --available-now`` on ``topic`` (``ingest_bench.ingest``, in this bench's
    work directory); the same figures as the textbook's."""
    ingest_bench.WORK = WORK / "ours"  # where ingest_bench.ingest puts its table, checkpoint and log
    ingest_bench.WORK.mkdir(parents=True, exist_ok=True)
    run = ingest_bench.ingest(topic, tag, args.master, max_offsets, None)
    batches = [b for b in run["batches"] if b["numInputRows"]]
    return {"stack": "ours", "table": run["table"], "batches": batches, **figures(batches, run["wall_seconds"]),
            "warm_up_seconds": run.get("warm_up_seconds"), "load": run["load"]}


# -- exactly once ----------------------------------------------------------------------------------

def verify(table: str, topic: str, partitions: int, complete: bool = True) -> dict:
    """Whether ``table`` (read with delta-rs, its latest version) holds every record Kafka holds of
    ``topic`` exactly once: per partition, rows = distinct offsets = Kafka's range, first and
    last offsets Kafka's. ``complete=False`` (a job stopped before it caught up): each partition's
    rows may be a prefix of Kafka's range, still each record once and no gap."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from streamlake.kafka.client import KafkaMetadataClient, client_config
    from streamlake.kafka.offsets import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with KafkaMetadataClient(client_config()) as kafka:
        start, end = kafka.earliest(tps), kafka.latest(tps)
    data = DeltaTable(table).to_pyarrow_dataset().to_table(columns=["topic", "partition", "offset"])
    grouped = data.group_by("partition").aggregate([("offset", "count"), ("offset", "count_distinct"),
                                                    ("offset", "min"), ("offset", "max")]).to_pylist()
    have = {g["partition"]: g for g in grouped}
    problems = []
    other_topics = sorted(set(pc.unique(data.column("topic")).to_pylist()) - {topic})
    if other_topics:
        problems.append(f"rows of other topics {other_topics}")
    for tp in tps:
        want = end[tp] - start[tp]
        g = have.pop(tp.partition, None)
        if g is None:
            if want:
                problems.append(f"partition {tp.partition}: no rows, Kafka holds {want}")
            continue
        rows = want if complete else g["offset_max"] - start[tp] + 1
        if not (g["offset_count"] == g["offset_count_distinct"] == rows and g["offset_min"] == start[tp]
                and g["offset_max"] <= end[tp] - 1):
            problems.append(f"partition {tp.partition}: {g['offset_count']} rows, {g['offset_count_distinct']} "
                            f"distinct offsets {g['offset_min']}..{g['offset_max']}; Kafka holds "
                            f"{start[tp]}..{end[tp] - 1} ({want})")
    for partition in have:
        problems.append(f"rows of partition {partition}, which the topic does not have")
    kafka_records = sum(end[tp] - start[tp] for tp in tps)
    distinct = sum(g["offset_count_distinct"] for g in grouped)
    return {"table": table, "rows": data.num_rows, "distinct_partition_offsets": distinct,
            "kafka_records": kafka_records, "complete": data.num_rows == kafka_records,
            "exactly_once": not problems and (data.num_rows == kafka_records or not complete),
            "problems": problems[:10]}


def _checked(run: dict, topic: str, partitions: int, keep: bool, complete: bool = True) -> dict:
    """``run`` with its table's verification (``verify``); the table deleted unless ``keep``."""
    run["verify"] = verify(run["table"], topic, partitions, complete)
    v = run["verify"]
    if v["exactly_once"]:
        progress(f"  {run['stack']}: exactly once ({v['rows']:,} rows = {v['distinct_partition_offsets']:,} distinct "
                 f"(partition, offset) {'=' if v['complete'] else 'of'} {v['kafka_records']:,} Kafka records"
                 + ("" if v["complete"] else ": the job stopped before it caught up, its rows a prefix of each "
                                             "partition") + ")")
    else:
        progress(f"  {run['stack']}: VIOLATED: {v['rows']:,} rows, {v['distinct_partition_offsets']:,} distinct "
                 f"(partition, offset), {v['kafka_records']:,} Kafka records: {'; '.join(v['problems'])}")
    if not keep:
        shutil.rmtree(run["table"], ignore_errors=True)
    return run


# -- throughput ------------------------------------------------------------------------------------

def throughput(shape: str, topic: str, args, max_offsets: int) -> dict:
    """Each stack ``args.runs`` times on ``topic``, alternated; the faster run of each counts."""
    runs: dict[str, list[dict]] = {s: [] for s in STACKS}
    for n in range(1, args.runs + 1):
        order = STACKS if n % 2 else tuple(reversed(STACKS))
        for stack in order:
            progress(f"  {shape}: {stack}, run {n} of {args.runs} (available-now, maxOffsetsPerTrigger {max_offsets:,})")
            tag = f"{shape}-{n}"
            run = (textbook_throughput if stack == "textbook" else ours_throughput)(topic, tag, args, max_offsets)
            runs[stack].append(_checked(run, topic, args.partitions, args.keep_tables))
            warm = run.get("warm_records_per_second")
            progress(f"  {shape}: {stack}, run {n}: {run['records']:,} records in {run['processing_seconds']:.2f} s of "
                     f"micro-batches, {run['records_per_second']:,.0f} records/s"
                     + (f", warm {warm:,.0f}" if warm else "")
                     + f"; {run['wall_seconds']:.1f} s end to end")
    out = {}
    for stack, tries in runs.items():
        best = min(tries, key=lambda r: r["processing_seconds"])
        out[stack] = {**best, "tries_seconds": [t["processing_seconds"] for t in tries],
                      "tries_warm_records_per_second": [t.get("warm_records_per_second") for t in tries],
                      "exactly_once": all(t["verify"]["exactly_once"] for t in tries),
                      "verify_all": [t["verify"] for t in tries]}
    return out


# -- latency ---------------------------------------------------------------------------------------

class Poller(latency_bench.Poller):
    """latency_bench's poller, reading the timestamp column in whatever unit the file has
    (delta-spark's Parquet: INT96, nanoseconds; ours: microseconds)."""

    def _records(self, name: str, files: list[str], column: str, seen_at: float) -> None:
        import pyarrow.parquet as pq

        seen = self.seen[name]
        for f in files:
            data = pq.read_table(f, columns=["partition", "offset", column])
            col = data.column(column)
            per_us = {"s": 1e-6, "ms": 1e-3, "us": 1.0, "ns": 1e3}[col.type.unit]
            stamps = col.cast("int64").to_pylist()
            for p, o, ts in zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(), stamps):
                seen.setdefault((p, o), (ts / per_us / 1e6, seen_at))


def _compact(b: dict) -> dict:
    keys = ("batchId", "timestamp", "numInputRows", "durationMs", "durations", "sinkMs", "processedRowsPerSecond")
    return {k: b[k] for k in keys if k in b}


def latency(stack: str, shape: str, bootstrap: str, args) -> dict:
    """One stack at a processing-time trigger on a fresh topic while a steady producer writes to it
    (as latency_bench.run); produce -> visible in the table's latest version."""
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic
    from streamlake.pipeline.control import JobControl
    from streamlake.spark.session import job_environment

    topic = f"peer-latency-{shape}-{stack}"
    root = WORK / f"latency-{shape}-{stack}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ensure_topic(client_config(), topic, args.partitions)
    if stack == "ours":
        table, checkpoint = root / "table", root / "checkpoint"
        cmd = [STREAMLAKE, "ingest", "--topic", topic, "--table", str(table), "--checkpoint", str(checkpoint),
               "--processing-time", str(args.trigger_s), "--master", args.master]
        control = JobControl.for_checkpoint(checkpoint)
        env, stop, progress_path = None, control.request_stop, control.progress_file
    else:
        cmd = textbook_command(topic, root, args, ["--processing-time", str(args.trigger_s)])
        table = root / "table"
        env, stop, progress_path = job_environment(), (root / "stop").touch, root / "progress.jsonl"
    poller = Poller({"table": (str(table), "records", "timestamp")}, args.poll_ms / 1000).start()
    make = latency_bench.Readings(args.partitions, args.value_bytes).make
    log = root / "job.log"
    launched = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        cpu = latency_bench.TreeCPU(proc.pid).start()
        try:
            priming = SteadyProducer(bootstrap, topic, latency_bench.PRIMING, 1.0, make).start()
            latency_bench.wait_for(lambda: len(poller.seen["table"]) >= latency_bench.PRIMING, 300,
                                   f"the first {latency_bench.PRIMING} records in the {stack} table", proc, log)
            priming.join()
            startup_s = time.monotonic() - launched
            progress(f"  {shape}: {stack} up after {startup_s:.0f} s; producing {args.latency_rate:,.0f} records/s for "
                     f"{args.latency_seconds:g} s ({LATENCY_BATCHING[shape]} batching)")
            since = time.time()
            cpu_start = cpu.mark()
            load_before = load()
            producer = SteadyProducer(bootstrap, topic, args.latency_rate, args.latency_seconds, make, keep=True,
                                      batching=LATENCY_BATCHING[shape]).start()
            producer.join()
            cpu_stream = cpu.mark()
            load_after = load()
            if producer.errors:
                raise SystemExit(f"producer failed: {producer.errors[:2]}")
            total = priming.sent + producer.sent
            drain_s = latency_bench.wait_for(lambda: len(poller.seen["table"]) >= total, args.drain_timeout,
                                             f"all {total:,} records in the {stack} table", proc, log, fail=False)
            waited_until = time.time()
        finally:
            stop()
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                progress(f"  {stack} did not stop within {STOP_WAIT_S} s: killed")
                os.killpg(proc.pid, 9)
            cpu.stop()
            poller.stop()
    batches = [b for b in _read_batches(progress_path) if b.get("numInputRows")]
    seen = poller.seen["table"]
    lat = latency_bench.record_latencies(poller, "table", since)
    # Records not visible when the wait ended: at least (then - the broker's ack) each.
    unseen = [waited_until - acked for key, acked in producer.acked.items() if key not in seen]
    out = {"stack": stack, "shape": shape, "topic": topic, "batching": LATENCY_BATCHING[shape],
           "table": str(table), "startup_seconds": round(startup_s, 1), "produced": producer.sent,
           "drain_seconds_after_producer": round(drain_s, 2) if drain_s is not None else None,
           "producer_behind_s": round(producer.behind_s, 3),
           "load": [load_before, load_after], "polls": poller.polls,
           "poll_cost_ms": round(1000 * poller.poll_seconds / max(1, poller.polls), 1),
           "cpu": latency_bench.cpu_between(cpu_start, cpu_stream, cpu.processes),
           "latency": {**latency_bench.stats(sorted(lat + unseen)), "unseen": len(unseen),
                       "lower_bound": bool(unseen)},
           "broker_ack": latency_bench.stats(sorted(
               acked - ts for key, (ts, _) in seen.items() if ts >= since - 0.001
               for acked in [producer.acked.get(key)] if acked)),
           "after_ack": latency_bench.stats(sorted(
               at - acked for key, (ts, at) in seen.items() if ts >= since - 0.001
               for acked in [producer.acked.get(key)] if acked)),
           "batches": [_compact(b) for b in batches], "stream_since": since}
    stages = latency_bench.summarize_batches(batches, since)
    out["stream_batches"] = next(iter(stages.values()), {"batches": 0, "rows": 0, "mean_ms": {}, "rows_per_batch": 0})
    s = out["latency"]
    progress(f"  {shape}: {stack}: p50 {s['p50_s']:.2f} s, p99 {s['p99_s']:.2f} s, max {s['max_s']:.2f} s "
             f"({s['records']:,} records" + (f"; {len(unseen):,} not visible within {args.drain_timeout:g} s of the "
                                              "producer's end, counted as then − their ack: lower bounds"
                                              if unseen else "") + ")")
    return _checked(out, topic, args.partitions, keep=True, complete=not unseen)


# -- per micro-batch -------------------------------------------------------------------------------

PARTS = ("offsets + logs", "planning", "Spark job: read Kafka, write Parquet", "Delta state (Spark jobs)",
         "Delta commit (driver)", "foreachBatch overhead", "other")
PART_NOTES = {
    "offsets + logs": "latestOffset (the end-offset probe) + walCommit (offset log) + commitOffsets (commit log)",
    "planning": "queryPlanning + getBatch",
    "Spark job: read Kafka, write Parquet": "ours: the read tasks' job (`sinkMs.write`); textbook: the Spark "
                                            "jobs inside `save()` (the status store's job times)",
    "Delta state (Spark jobs)": "textbook: the Spark jobs Delta runs in `save()` to compute the table's "
                                "snapshot state (\"Delta: Compute snapshot for version N\", the log replayed: what "
                                "the `txnAppId`/`txnVersion` check reads), beyond the write's own; ours: none "
                                "(delta-rs reads the log in the driver, in the next part)",
    "Delta commit (driver)": "ours: delta-rs plan + commit; textbook: the rest of `save()`, outside Spark jobs "
                             "(the write's analysis and planning, Delta's transaction and commit, the checksum "
                             "file, a checkpoint every 10th commit)",
    "foreachBatch overhead": "addBatch minus the sink's own timings (the Python foreachBatch call, the batch "
                             "DataFrame)",
    "other": "the rest of the trigger (progress, state)",
}


def breakdown(b: dict, stack: str) -> dict:
    """Where a micro-batch's time went (ms), in parts both stacks have."""
    d, sink = b.get("durations") or {}, b.get("sinkMs") or {}
    add = d.get("addBatch", 0)
    if stack == "ours":
        job = sink.get("write", add)
        commit = sink.get("plan", 0) + sink.get("commit", 0)
        inside = sum(sink.values()) if sink else add
        state = 0
    else:
        write = sink.get("write", add)
        jobs = sink.get("jobs", write)
        job = sink.get("dataJobs", jobs)
        state = jobs - job
        commit = write - jobs
        inside = write
    parts = {
        "offsets + logs": d.get("latestOffset", 0) + d.get("walCommit", 0) + d.get("commitOffsets", 0),
        "planning": d.get("queryPlanning", 0) + d.get("getBatch", 0),
        "Spark job: read Kafka, write Parquet": job,
        "Delta state (Spark jobs)": state,
        "Delta commit (driver)": commit,
        "foreachBatch overhead": max(0, add - inside),
    }
    parts["other"] = max(0, (b.get("durationMs") or 0) - sum(parts.values()))
    return parts


def mean_breakdown(batches: list[dict], stack: str) -> dict:
    if not batches:
        return {k: 0 for k in PARTS}
    parts = [breakdown(b, stack) for b in batches]
    return {k: round(sum(p[k] for p in parts) / len(parts)) for k in PARTS}


# -- results ---------------------------------------------------------------------------------------

def finish(result: dict) -> None:
    """The ratios, goals and summary from the raw figures (also for ``--render``)."""
    for name, shape in result["shapes"].items():
        tp, lat = shape.get("throughput"), shape.get("latency")
        if tp:
            t, o = tp["textbook"], tp["ours"]
            shape["ours_over_textbook"] = {
                "whole": round(o["records_per_second"] / t["records_per_second"], 3),
                "warm": (round(o["warm_records_per_second"] / t["warm_records_per_second"], 3)
                         if o.get("warm_records_per_second") and t.get("warm_records_per_second") else None),
                "end_to_end": round(o["end_to_end_records_per_second"] / t["end_to_end_records_per_second"], 3),
            }
        if lat:
            shape["p99_s"] = {s: lat[s]["latency"]["p99_s"] for s in STACKS}
        ratios = shape.get("ours_over_textbook") or {}
        checks = [r >= TARGET_RATIO for r in (ratios.get("whole"), ratios.get("warm")) if r is not None]
        if lat:
            checks.append(shape["p99_s"]["ours"] <= shape["p99_s"]["textbook"]
                          and not lat["ours"]["latency"].get("unseen"))
        shape["goal_met"] = bool(checks) and all(checks)
        runs = ([tp[s] for s in STACKS] if tp else []) + ([lat[s] for s in STACKS] if lat else [])
        shape["exactly_once"] = all(r.get("exactly_once", r["verify"]["exactly_once"]) for r in runs)
    result["goal_met"] = all(s["goal_met"] for s in result["shapes"].values())
    result["exactly_once"] = all(s["exactly_once"] for s in result["shapes"].values())
    result["summary"] = summary_lines(result)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def summary_lines(result: dict) -> list[str]:
    lines = []
    for name, shape in result["shapes"].items():
        parts = []
        r = shape.get("ours_over_textbook")
        if r:
            warm = f"{r['warm']:.2f}×" if r.get("warm") is not None else "– (one micro-batch)"
            parts.append(f"throughput ours/textbook whole {r['whole']:.2f}×, warm {warm} (goal ≥ {TARGET_RATIO:g}×)")
        p = shape.get("p99_s")
        if p:
            parts.append(f"p99 ours {p['ours']:.2f} s vs textbook {p['textbook']:.2f} s (goal: no worse)")
        lines.append(f"peer, {SHAPE_LABEL[name]}: " + "; ".join(parts) + f": {_met(shape['goal_met'])}")
        lines.append(f"peer audit, {SHAPE_LABEL[name]}: "
                     + ("every table exactly once (both stacks)" if shape["exactly_once"] else "VIOLATED"))
    return lines


def _tp_rows(name: str, shape: dict) -> list[str]:
    rows = []
    for stack in STACKS:
        r = shape["throughput"][stack]
        warm = (f"{r['warm_records_per_second']:,.0f} ({r['warm_records']:,} in {r['warm_seconds']:.2f} s)"
                if r.get("warm_records_per_second") else "–")
        rows.append(f"| {SHAPE_LABEL[name]} | {stack} | {r['records']:,} | {len(r['batches'])} | "
                    f"{r['processing_seconds']:.2f} | {r['records_per_second']:,.0f} | {warm} | "
                    f"{r['wall_seconds']:.1f} | {r['startup_seconds']:.1f} | "
                    f"{', '.join(f'{s:.2f}' for s in r['tries_seconds'])} | {r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    return rows


def _lat_rows(name: str, shape: dict) -> list[str]:
    rows = []
    for stack in STACKS:
        r = shape["latency"][stack]
        s, a, b = r["latency"], r["broker_ack"], r["stream_batches"]
        ge = "≥ " if s.get("lower_bound") else ""
        rows.append(f"| {SHAPE_LABEL[name]} | {stack} | {s['records']:,}"
                    + (f" ({s['unseen']:,} not visible)" if s.get("unseen") else "")
                    + f" | {ge}{s['p50_s']:.2f} | {ge}{s['p95_s']:.2f} | "
                    f"**{ge}{s['p99_s']:.2f}** | {ge}{s['max_s']:.2f} | {a['p99_s']:.2f} | {b['batches']} × "
                    f"{b['rows_per_batch']:,} rows, {b['mean_ms'].get('triggerExecution', 0):,} ms | "
                    f"{r['cpu']['cpu_s_per_min']:.0f} | {r['startup_seconds']:.0f} s | "
                    f"{r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    return rows


def _batch_table(batches: list[dict], stack: str) -> list[str]:
    out = ["| batch | rows | total | " + " | ".join(PARTS) + " | rows/s |",
           "|---:|---:|---:|" + "---:|" * len(PARTS) + "---:|"]
    for b in batches:
        parts = breakdown(b, stack)
        out.append(f"| {b['batchId']} | {b['numInputRows']:,} | {b['durationMs']:,} | "
                   + " | ".join(f"{parts[k]:,}" for k in PARTS) + f" | {b.get('processedRowsPerSecond') or 0:,.0f} |")
    return out


def _biggest(ours: dict, textbook: dict) -> tuple[str, int, int]:
    """The part whose time differs most between the stacks (name, ours ms, textbook ms)."""
    key = max(PARTS, key=lambda k: abs(ours[k] - textbook[k]))
    return key, ours[key], textbook[key]


def explain(name: str, shape: dict) -> list[str]:
    """Which stack wins where on a shape, and where the time goes, from the figures."""
    lines = []
    tp = shape.get("throughput")
    if tp:
        t, o = tp["textbook"], tp["ours"]
        for what, tb, ob in (("first micro-batch", t["batches"][:1], o["batches"][:1]),
                             ("warm micro-batches (mean)", t["batches"][1:], o["batches"][1:])):
            if not tb or not ob:
                continue
            tm, om = mean_breakdown(tb, "textbook"), mean_breakdown(ob, "ours")
            t_ms = sum(b["durationMs"] for b in tb) / len(tb)
            o_ms = sum(b["durationMs"] for b in ob) / len(ob)
            t_rows = sum(b["numInputRows"] for b in tb) / len(tb)
            o_rows = sum(b["numInputRows"] for b in ob) / len(ob)
            key, ours_ms, text_ms = _biggest(om, tm)
            winner = "ours" if o_rows / max(o_ms, 1) >= t_rows / max(t_ms, 1) else "the textbook"
            lines.append(
                f"- **{what}** ({o_rows:,.0f} rows ours, {t_rows:,.0f} textbook): ours {o_ms:,.0f} ms, textbook "
                f"{t_ms:,.0f} ms: **{winner}** faster. The largest difference: {key} (ours {ours_ms:,} ms, "
                f"textbook {text_ms:,} ms). Ours: " + ", ".join(f"{k} {v:,}" for k, v in om.items() if v)
                + "; textbook: " + ", ".join(f"{k} {v:,}" for k, v in tm.items() if v) + " (ms).")
        lines.append(f"- **Start-up** (not in the throughput): ours {o['startup_seconds']:.1f} s before and after the "
                     f"micro-batches (JVM, SparkSession, initial offsets, the Python workers' warm-up "
                     f"{o.get('warm_up_seconds') or 0:.1f} s, stop), textbook {t['startup_seconds']:.1f} s (JVM, "
                     f"SparkSession, the query's start, stop); end to end ours/textbook "
                     f"{shape['ours_over_textbook']['end_to_end']:.2f}×.")
    lat = shape.get("latency")
    if lat:
        t, o = lat["textbook"], lat["ours"]
        tm, om = (mean_breakdown([b for b in r["batches"] if _in_stream(b, r)], s) for s, r in
                  (("textbook", t), ("ours", o)))
        tb, ob = t["stream_batches"], o["stream_batches"]
        key, ours_ms, text_ms = _biggest(om, tm)
        better = "ours" if o["latency"]["p99_s"] <= t["latency"]["p99_s"] else "the textbook's"
        lines.append(
            f"- **Latency** (trigger every {shape.get('trigger_s', 1):g} s): p99 ours {o['latency']['p99_s']:.2f} s, "
            f"textbook {t['latency']['p99_s']:.2f} s: **{better}** lower. A record waits for the next trigger, then "
            f"its micro-batch: ours {ob['batches']} micro-batches of ~{ob['rows_per_batch']:,} rows, "
            f"{ob['mean_ms'].get('triggerExecution', 0):,} ms each on average, textbook {tb['batches']} of "
            f"~{tb['rows_per_batch']:,} rows, {tb['mean_ms'].get('triggerExecution', 0):,} ms; the largest difference: "
            f"{key} (ours {ours_ms:,} ms, textbook {text_ms:,} ms). In Kafka (produce → broker's ack) p99 ours' run "
            f"{o['broker_ack']['p99_s']:.2f} s, the textbook's {t['broker_ack']['p99_s']:.2f} s; CPU of the job's "
            f"processes while the stream ran: ours {o['cpu']['cpu_s_per_min']:.0f}, textbook "
            f"{t['cpu']['cpu_s_per_min']:.0f} CPU-s per minute.")
    return lines


def _in_stream(b: dict, run: dict) -> bool:
    import datetime as dt

    stamp = b.get("timestamp")
    if not stamp:
        return False
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() >= run["stream_since"]


def markdown(result: dict) -> str:
    p = result["params"]
    out = [
        "# Peer bench: our bronze ingest against the textbook Spark stack",
        "",
        f"Same Apache Kafka broker (local, one node) and topics for both, one stack after the other; Spark "
        f"`{p['master']}` for both; {result['machine']}; {result['date']}. Load average (1 min) next to each figure: "
        "the machine is shared.",
        "",
        "- **textbook**: Spark's own Kafka source (`spark.readStream.format(\"kafka\")`) → `foreachBatch` → "
        "delta-spark append with Delta's idempotent writes (`txnAppId`, `txnVersion` = batch id): the standard "
        "exactly-once Kafka → Delta of a Spark user (`bench/peer_textbook_job.py`, spark-submit).",
        "- **ours**: `streamlake ingest` (bronze), spark-submit.",
        "",
        f"**Goal** (issue 71): ours ≥ {TARGET_RATIO:g}× the textbook's throughput on every shape (whole run, first "
        "micro-batch included, JVM start-up apart; and warm, the micro-batches after the first) with a p99 "
        "latency (produce → visible in the table) no worse than the textbook's.",
        "",
        "| shape | ours/textbook whole | warm | end to end (reported) | p99 ours | p99 textbook | goal | exactly once |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, shape in result["shapes"].items():
        r, q = shape.get("ours_over_textbook") or {}, shape.get("p99_s") or {}

        def x(v):
            return f"{v:.2f}×" if v is not None else "–"

        out.append(f"| {SHAPE_LABEL[name]} | {x(r.get('whole'))} | {x(r.get('warm'))} | {x(r.get('end_to_end'))} | "
                   + (f"{q['ours']:.2f} s | {q['textbook']:.2f} s" if q else "– | –")
                   + f" | **{_met(shape['goal_met'])}** | {'yes' if shape['exactly_once'] else '**VIOLATED**'} |")
    out += ["", "## Settings (each side at its best)", ""]
    for stack in STACKS:
        out += [f"- **{stack}**: " + " ".join(result["settings"][stack])]
    extra = [f"`{o}`" for o in p.get("textbook_option") or []] + [f"`{c}`" for c in p.get("textbook_conf") or []]
    if extra or p.get("textbook_min_partitions"):
        out += [f"- this run's textbook extras: {', '.join(extra)}"
                + (f" minPartitions {p['textbook_min_partitions']}" if p.get("textbook_min_partitions") else "")]
    out += [
        "",
        "## Throughput",
        "",
        f"{p['records']:,} records of ~{p['value_bytes']} B in {p['partitions']} partitions per shape: **bulk** "
        "produced in bulk (`linger.ms=20`, many records per record batch); **one record per record batch** "
        "(`linger.ms=0`, `batch.num.messages=1`, a live producer's smallest batches). Each stack drains the "
        f"topic available-now, maxOffsetsPerTrigger {p['max_offsets_per_trigger']:,} on both; {p['runs']} run(s) "
        "each, alternated, the faster counts (all runs' micro-batch seconds in *tries*). Micro-batch time = the "
        "sum of the query's `triggerExecution` (first micro-batch included); end to end = the spark-submit "
        "application's wall time (start-up = end to end − micro-batches).",
        "",
        "| shape | stack | records | micro-batches | seconds | records/s | warm records/s | end to end s | "
        "start-up + stop s | tries s | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, shape in result["shapes"].items():
        if shape.get("throughput"):
            out += _tp_rows(name, shape)
    if any(s.get("latency") for s in result["shapes"].values()):
        out += [
            "",
            "## Latency",
            "",
            f"Each stack at a {p['trigger_s']:g} s processing-time trigger on a fresh topic of its own "
            f"({p['partitions']} partitions) while a steady producer writes {p['latency_rate']:,.0f} records/s of "
            f"~{p['value_bytes']} B for {p['latency_seconds']:g} s (sensor readings keyed by sensor; **bulk**: "
            "librdkafka's own batching, `linger.ms` 5 ms, a producer application's; **one record per record batch**: "
            "`linger.ms=0`, `batch.num.messages=1`), after a priming trickle that shows the job is up (not counted). "
            f"A reader polls the table with delta-rs every {p['poll_ms']} ms; a record is visible when the table's "
            "latest version holds it; latency = then − its Kafka timestamp (produce time).",
            "",
            "| shape | stack | records | p50 s | p95 s | p99 s | max s | in Kafka p99 s | micro-batches (mean) | "
            "CPU-s/min | job up after | load |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
        ]
        for name, shape in result["shapes"].items():
            if shape.get("latency"):
                out += _lat_rows(name, shape)
    out += ["", "## Exactly once", "",
            "Every table, read with delta-rs at its latest version, against Kafka's offsets of its topic: rows, "
            "distinct (partition, offset), per partition the first and last offset.", ""]
    for name, shape in result["shapes"].items():
        checks = []
        for stack in STACKS:
            for n, v in enumerate((shape.get("throughput") or {}).get(stack, {}).get("verify_all", []), 1):
                checks.append((f"{stack} throughput run {n}", v))
            if shape.get("latency"):
                checks.append((f"{stack} latency run", shape["latency"][stack]["verify"]))
        out.append(f"- {SHAPE_LABEL[name]}: " + "; ".join(
            f"{what}: {'exactly once' if v['exactly_once'] else '**VIOLATED** (' + '; '.join(v['problems']) + ')'}"
            f"{'' if v.get('complete', True) else ', a prefix of each partition (stopped before it caught up)'} "
            f"({v['rows']:,} rows, {v['distinct_partition_offsets']:,} distinct, {v['kafka_records']:,} in Kafka)"
            for what, v in checks) + ".")
    out += ["", "## Who wins where, and why", "",
            "Each micro-batch's time in parts both stacks have (ms): "
            + "; ".join(f"**{k}**: {v}" for k, v in PART_NOTES.items()) + ".", ""]
    for name, shape in result["shapes"].items():
        out += [f"**{SHAPE_LABEL[name].capitalize()}**", ""] + explain(name, shape) + [""]
        for stack in STACKS:
            if shape.get("throughput"):
                out += [f"Throughput micro-batches, {stack} ({SHAPE_LABEL[name]}):", ""]
                out += _batch_table(shape["throughput"][stack]["batches"], stack) + [""]
        if shape.get("latency"):
            out += [f"Latency run, mean micro-batch while the stream ran ({SHAPE_LABEL[name]}, ms):", "",
                    "| stack | micro-batches | rows | " + " | ".join(PARTS) + " |",
                    "|---|---:|---:|" + "---:|" * len(PARTS)]
            for stack in STACKS:
                r = shape["latency"][stack]
                m = mean_breakdown([b for b in r["batches"] if _in_stream(b, r)], stack)
                sb = r["stream_batches"]
                out.append(f"| {stack} | {sb['batches']} | {sb['rows_per_batch']:,} | "
                           + " | ".join(f"{m[k]:,}" for k in PARTS) + " |")
            out.append("")
    out += ["![peer](peer.png)", ""]
    return "\n".join(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"textbook": "#7f8c8d", "ours": "#2a7ab9"}
    shapes = list(result["shapes"].items())
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(19, 5.2), gridspec_kw={"width_ratios": [1.1, 0.8, 1.6]})
    labels, width = [], 0.38
    for i, (name, shape) in enumerate(s for s in shapes if s[1].get("throughput")):
        for j, kind in enumerate(("whole", "warm")):
            x = i * 2 + j
            labels.append((x, f"{name}\n{kind}"))
            for k, stack in enumerate(STACKS):
                r = shape["throughput"][stack]
                v = r["records_per_second"] if kind == "whole" else r.get("warm_records_per_second") or 0
                bar = a.bar(x + (k - 0.5) * width, v, width, color=colors[stack],
                            label=stack if x == 0 else None)
                text = f"{v / 1000:,.0f}k" if v >= 10_000 else f"{v:,.0f}"
                ratio = (shape.get("ours_over_textbook") or {}).get(kind)
                if stack == "ours" and ratio is not None:
                    text += f"\n{ratio:.2f}×"
                a.bar_label(bar, labels=[text if v else "–"], fontsize=7)
    a.set_xticks([x for x, _ in labels], [t for _, t in labels], fontsize=7)
    a.margins(y=0.12)
    a.set_ylabel("records / s (micro-batches)")
    a.set_title("throughput (× = ours / textbook; goal ≥ 1×)", fontsize=9)
    a.legend(fontsize=8)
    lat = [(n, s) for n, s in shapes if s.get("latency")]
    for i, (name, shape) in enumerate(lat):
        for k, stack in enumerate(STACKS):
            s = shape["latency"][stack]["latency"]
            x = i + (k - 0.5) * width
            b.bar(x, s["p99_s"], width, color=colors[stack], label=f"{stack} p99" if i == 0 else None)
            b.bar(x, s["p50_s"], width * 0.5, color="white", alpha=0.6, label="p50" if i == 0 and k == 0 else None)
            b.text(x, s["p99_s"], f"{s['p99_s']:.2f}", ha="center", va="bottom", fontsize=7)
    b.set_xticks(range(len(lat)), [n for n, _ in lat], fontsize=7)
    b.set_ylabel("produce → visible (s)")
    b.set_title(f"latency at a {result['params']['trigger_s']:g} s trigger (goal: ours' p99 no worse)", fontsize=9)
    if lat:
        b.legend(fontsize=7)
    names, stacks = [], {k: [] for k in PARTS}
    for name, shape in shapes:
        short = "bulk" if name == "bulk" else "1-rec"
        for stack in STACKS:
            for bt in (shape.get("throughput") or {}).get(stack, {}).get("batches", []):
                names.append(f"{short} {stack[:4]} {bt['batchId']}")
                for k, v in breakdown(bt, stack).items():
                    stacks[k].append(v / 1000)
            if shape.get("latency"):
                r = shape["latency"][stack]
                names.append(f"{short} {stack[:4]} lat")
                for k, v in mean_breakdown([bt for bt in r["batches"] if _in_stream(bt, r)], stack).items():
                    stacks[k].append(v / 1000)
    bottom = [0.0] * len(names)
    for k, secs in stacks.items():
        c.bar(range(len(names)), secs, bottom=bottom, label=k)
        bottom = [x + y for x, y in zip(bottom, secs)]
    c.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    c.set_ylabel("seconds")
    c.set_title("where each micro-batch's time goes (throughput batches by id; lat = latency run's mean batch)",
                fontsize=9)
    c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main ------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records of each shape's topic")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-offsets-per-trigger", type=int,
                        help="records per micro-batch, both stacks (default: half of --records plus one per "
                             "partition: two micro-batches on both)")
    parser.add_argument("--runs", type=int, default=2, help="throughput runs per stack and shape (the faster counts)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--latency-rate", type=float, default=2000.0, help="records/s of the latency part")
    parser.add_argument("--latency-seconds", type=float, default=60.0, help="length of the latency part's stream "
                                                                           "(0: no latency part)")
    parser.add_argument("--trigger-s", type=float, default=1.0, help="processing-time trigger of the latency part")
    parser.add_argument("--poll-ms", type=int, default=50, help="how often the latency part polls the tables")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="how long the latency part waits, after the producer's end, for every record to be "
                             "visible (a stack that has not caught up by then: its latest records' latencies are "
                             "reported as lower bounds)")
    parser.add_argument("--textbook-min-partitions", type=int, help="minPartitions of Spark's Kafka source")
    parser.add_argument("--textbook-option", action="append", default=[], metavar="KEY=VALUE",
                        help="another option of Spark's Kafka source (repeatable)")
    parser.add_argument("--textbook-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="another Spark setting of the textbook job (repeatable)")
    parser.add_argument("--keep-tables", action="store_true", help="keep the throughput runs' tables")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where peer.md/json/png go (default bench/results; use another for trial runs)")
    parser.add_argument("--render", action="store_true", help="peer.md and .png again from peer.json")
    args = parser.parse_args()
    if args.render:
        return rewrite_results(args.results, "peer", finish, markdown, plot)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes: of {', '.join(SHAPES)}")
    # Half the topic plus one record per partition: Spark's Kafka source rounds each partition's
    # share of maxOffsetsPerTrigger down, so exactly half would leave a few records to a third,
    # near-empty micro-batch, which costs the textbook stack a whole micro-batch's fixed costs.
    max_offsets = args.max_offsets_per_trigger or -(-args.records // 2) + args.partitions
    if not TEXTBOOK_JOB.exists():
        raise SystemExit(f"{TEXTBOOK_JOB} missing")

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    args.results.mkdir(parents=True, exist_ok=True)
    per_shape = 2 if args.latency_seconds > 0 else 1
    steps, step = len(shapes) * (1 + per_shape), 0
    result_shapes: dict[str, dict] = {}
    with private_broker(WORK) as bootstrap:
        from streamlake.kafka.producer import produce_records
        from streamlake.pipeline.definition import load_definition

        for shape in shapes:
            topic = f"peer-{shape}"
            step += 1
            progress(f"{step}/{steps} {shape}: producing {args.records:,} records of ~{args.value_bytes} B into "
                     f"{args.partitions} partitions ({SHAPE_LABEL[shape]})")
            if shape == "bulk":
                produced = produce_records(load_definition(ingest_bench.SENSORS), topic, args.records,
                                           partitions=args.partitions, value_bytes=args.value_bytes, seed=42,
                                           progress=False)
                produce = {"records": produced.records, "seconds": round(produced.seconds, 2), "records_per_batch": "many"}
            else:
                produce = ingest_bench.produce_live(topic, args.records, args.partitions, args.value_bytes, seed=43)
            step += 1
            progress(f"{step}/{steps} {shape}: throughput, textbook and ours, {args.runs} run(s) each")
            entry = {"topic": topic, "produce": produce, "trigger_s": args.trigger_s,
                     "throughput": throughput(shape, topic, args, max_offsets)}
            if args.latency_seconds > 0:
                step += 1
                progress(f"{step}/{steps} {shape}: latency at a {args.trigger_s:g} s trigger, "
                         f"{args.latency_rate:,.0f} records/s for {args.latency_seconds:g} s, each stack on a topic "
                         "of its own")
                order = STACKS if shape == SHAPES[0] else tuple(reversed(STACKS))
                entry["latency"] = {stack: latency(stack, shape, bootstrap, args) for stack in order}
            result_shapes[shape] = entry

    result = {
        "params": {"records": args.records, "value_bytes": args.value_bytes, "partitions": args.partitions,
                   "master": args.master, "cores": spark_cores(args.master), "max_offsets_per_trigger": max_offsets,
                   "runs": args.runs, "latency_rate": args.latency_rate, "latency_seconds": args.latency_seconds,
                   "trigger_s": args.trigger_s, "poll_ms": args.poll_ms, "drain_timeout_s": args.drain_timeout,
                   "textbook_min_partitions": args.textbook_min_partitions,
                   "textbook_option": args.textbook_option, "textbook_conf": args.textbook_conf},
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "settings": SETTINGS,
        "shapes": result_shapes,
        "goal": {"ours_over_textbook_at_least": TARGET_RATIO, "p99": "ours <= textbook"},
    }
    finish(result)
    write_results(args.results, "peer", result, markdown, plot)
    if not result["exactly_once"]:
        print("ERROR: a table does not hold its topic exactly once (VIOLATED above and in peer.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
