"""spark-submit job of bench/peer_bench.py: the textbook Kafka -> Delta stack, exactly once.

Spark's own Kafka source (``spark.readStream.format("kafka")``, the
``spark-sql-kafka-0-10`` jar) -> ``foreachBatch`` -> a delta-spark append with
Delta's idempotent writes (``txnAppId`` = the query, ``txnVersion`` = the
micro-batch id: a micro-batch replayed after a failure is skipped by Delta):
the standard way a Spark user writes Kafka into Delta exactly once. The
DataFrame is written as the source gives it (Spark's Kafka schema: key, value,
topic, partition, offset, timestamp, timestampType), unpartitioned.

    spark-submit ... bench/peer_textbook_job.py --bootstrap HOST:PORT --topic T \\
        --table DIR --checkpoint DIR --progress FILE --stop-file FILE \\
        (--available-now | --processing-time SECONDS) [--max-offsets-per-trigger N] \\
        [--min-partitions N] [--option KEY=VALUE ...]

Started by the bench with ``streamlake.spark.session.spark_submit_command`` and
``job_environment`` (Delta's connector and the Kafka source on the class path,
the platform's Spark defaults with Delta's SQL extension and catalog). The
bench's own measuring, outside the query's data path: a line per micro-batch to
stdout, and ``--progress`` gets each micro-batch's progress as a JSON line
(Spark's ``StreamingQueryProgress``) with, under ``sinkMs``, how long the
``save()`` took (``write``) and how much of it Spark jobs ran (``jobs``, from
the application's status store, read after the query ends); a ``--stop-file``
that appears stops the query (a processing-time run) at a micro-batch boundary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

STOP_GRACE_S = 90


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="peer_textbook_job", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True, help="the Delta table's directory")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True, help="JSON lines of the query's progress")
    parser.add_argument("--stop-file", required=True, help="stop the query when this file appears")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--available-now", action="store_true")
    mode.add_argument("--processing-time", type=float, metavar="SECONDS")
    parser.add_argument("--max-offsets-per-trigger", type=int)
    parser.add_argument("--min-partitions", type=int)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="another option of Spark's Kafka source (repeatable), e.g. kafka.max.poll.records=2000")
    return parser.parse_args(argv)


def spark_jobs(spark) -> list[tuple[str, int, int]]:
    """(name, submitted, completed) in epoch ms of every finished Spark job of the application
    (its status store, as the UI shows them); the name is "Delta: " and the job's call site for
    a job Delta runs (its description starts so, e.g. "Delta: Compute snapshot for version: 3"),
    else the call site. Empty if the store cannot be read."""
    out = []
    try:
        jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
        for i in range(jobs.size()):
            job = jobs.apply(i)
            start, end, description = job.submissionTime(), job.completionTime(), job.description()
            if start.isDefined() and end.isDefined():
                delta = description.isDefined() and str(description.get()).startswith("Delta")
                name = ("Delta: " if delta else "") + str(job.name())
                out.append((name, int(start.get().getTime()), int(end.get().getTime())))
    except Exception as exc:  # noqa: BLE001 - the split is a detail; the figures stand without it
        print(f"peer_textbook_job: no Spark job timings ({exc!r})", file=sys.stderr, flush=True)
    return out


def covered_ms(intervals: list[tuple[int, int]]) -> int:
    """Milliseconds covered by the union of (start, end) intervals (jobs may run concurrently)."""
    total, last = 0, None
    for start, end in sorted(intervals):
        if last is None or start > last:
            total += end - start
            last = end
        elif end > last:
            total += end - last
            last = end
    return total


def progress_line(p: dict, windows: dict, jobs: list) -> dict:
    """One micro-batch's progress (the fields the bench reads) with the sink's timings: ``write``
    the ``save()``, ``jobs`` the time Spark jobs ran in it, ``dataJobs`` the write's own jobs
    (read Kafka, write Parquet), the rest of ``jobs`` Delta's (its snapshot's state)."""
    batch = p.get("batchId")
    line = {
        "batchId": batch,
        "timestamp": p.get("timestamp"),
        "numInputRows": p.get("numInputRows", 0),
        "inputRowsPerSecond": round(p.get("inputRowsPerSecond") or 0.0, 1),
        "processedRowsPerSecond": round(p.get("processedRowsPerSecond") or 0.0, 1),
        "durationMs": (p.get("durationMs") or {}).get("triggerExecution"),
        "durations": p.get("durationMs") or {},
        "sources": [{k: s.get(k) for k in ("startOffset", "endOffset", "latestOffset", "numInputRows")}
                    for s in p.get("sources") or []],
    }
    window = windows.get(batch)
    if window is not None and p.get("numInputRows"):
        started, ended = (round(t * 1000) for t in window)
        sink = {"write": ended - started}
        mine = [(name, start, end) for name, start, end in jobs if start >= started - 5 and end <= ended + 5]
        if jobs:
            sink["jobs"] = min(sink["write"], covered_ms([(s, e) for _, s, e in mine]))
            sink["dataJobs"] = min(sink["jobs"], covered_ms([(s, e) for n, s, e in mine if not n.startswith("Delta")]))
            line["sparkJobs"] = [[name[:80], end - start] for name, start, end in mine]
        line["sinkMs"] = sink
    return line


def main(argv=None) -> int:
    args = parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"peer_textbook:{Path(args.table).name}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    app_id = f"peer-textbook-{Path(args.table).name}"  # one per query: its checkpoint and table
    windows: dict[int, tuple[float, float]] = {}

    def write(df, batch_id: int) -> None:
        started = time.time()
        (df.write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", batch_id)
         .save(args.table))
        windows[batch_id] = (started, time.time())

    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.topic)
              .option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true"))
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    if args.min_partitions:
        reader = reader.option("minPartitions", str(args.min_partitions))
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    writer = (reader.load().writeStream.queryName("peer_textbook")
              .option("checkpointLocation", args.checkpoint).foreachBatch(write))
    writer = (writer.trigger(processingTime=f"{args.processing_time} seconds") if args.processing_time
              else writer.trigger(availableNow=True))
    stop_file = Path(args.stop_file)
    progress_path = Path(args.progress)
    reported: dict[tuple, dict] = {}

    def collect() -> None:
        # The JVM's recent progress (at most spark.sql.streaming.numRecentProgressUpdates, 20),
        # one py4j call per entry: converting them into Python objects costs the driver more.
        for jp in query._jsq.recentProgress():
            p = json.loads(jp.json())
            key = (p.get("batchId"), p.get("timestamp"))
            if key in reported:
                continue
            reported[key] = p
            if p.get("numInputRows"):
                d = p.get("durationMs") or {}
                print(f"batch {p['batchId']}: {p['numInputRows']} rows, "
                      f"{p.get('processedRowsPerSecond') or 0:,.0f} rows/s, {d.get('triggerExecution', 0)} ms "
                      f"(addBatch {d.get('addBatch', 0)} ms)", flush=True)

    started = time.monotonic()
    query = writer.start()
    code = 0
    stop_asked = None
    try:
        while True:
            done = query.awaitTermination(0.5)
            collect()
            if done:
                break
            if stop_file.exists():
                # At a micro-batch boundary: a running micro-batch finishes (its progress
                # reported) first, unless it takes longer than STOP_GRACE_S.
                stop_asked = stop_asked or time.monotonic()
                if not query.status["isTriggerActive"] or time.monotonic() - stop_asked > STOP_GRACE_S:
                    query.stop()
                    break
        collect()
    except Exception as exc:  # noqa: BLE001 - the query failed: say why, exit 1
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        code = 1
    seconds = time.monotonic() - started
    jobs = spark_jobs(spark)
    lines = [progress_line(p, windows, jobs) for p in reported.values()]
    lines.sort(key=lambda line: (line["batchId"] if line["batchId"] is not None else -1, line["timestamp"] or ""))
    progress_path.parent.mkdir(parents=True, exist_ok=True)
    progress_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = sum(line["numInputRows"] for line in lines)
    print(f"textbook query finished: {rows} rows in {sum(1 for line in lines if line['numInputRows'])} "
          f"micro-batches, {seconds:.1f} s", flush=True)
    spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
