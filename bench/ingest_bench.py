"""`make bench`: bronze ingest throughput against a no-Spark ceiling, same run, same records.

Two topics, each measured against its own ceiling:

* **bulk-produced** (the original rows): N records of ~B bytes in P partitions,
  produced in bulk (``linger.ms=20``: many records per record batch);
* **real-time-produced**: a smaller topic written as a live producer writes it,
  one record per record batch (``linger.ms=0``, ``batch.num.messages=1``, as
  fast as the broker takes them, from a background thread). On the embedded
  broker a fetch costs more the more record batches a partition holds, so this
  is the shape that starved readers before issue 6.

For each topic:

1. Produce it into a private embedded broker.
2. Ceiling: read it with confluent-kafka (the source's own range reader) and write
   Parquet with pyarrow, in this one process, without Spark (twice; the faster counts).
3. Ingest: `streamlake ingest --available-now` (spark-submit, local[*]) into a Delta table.
4. Audit the table against Kafka (the benchmark run must itself be exactly once).

Writes bench/results/ingest.md, ingest.json and ingest.png and prints the ratios
ingest / ceiling. Ratios are measured in the same run on the same machine, so a
busy machine slows both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "ingest"  # bench/work/checks belongs to check_bench.py
RESULTS = HERE / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ceiling(topic: str, partitions: int, out_dir: Path) -> dict:
    """confluent-kafka -> Arrow -> Parquet in one process: what Python can do without Spark."""
    import pyarrow.parquet as pq
    from streamlake.kafka.client import KafkaMetadataClient, client_config
    from streamlake.kafka.offsets import OffsetRange, TopicPartition
    from streamlake.kafka.reader import KAFKA_ARROW_SCHEMA, read_range
    from tqdm import tqdm

    conf = client_config()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with KafkaMetadataClient(conf) as kafka:
        start, end = kafka.earliest(tps), kafka.latest(tps)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = size = 0
    started = time.perf_counter()
    with tqdm(total=sum(end[tp] - start[tp] for tp in tps), unit="rec", unit_scale=True, desc="ceiling",
              file=sys.stderr, mininterval=1) as bar:
        for tp in tps:
            with pq.ParquetWriter(out_dir / f"part-{tp.partition}.parquet", KAFKA_ARROW_SCHEMA,
                                  compression="snappy") as writer:
                for batch in read_range(conf, OffsetRange(tp.topic, tp.partition, start[tp], end[tp]),
                                        poll_timeout_ms=60_000, fail_on_data_loss=True):
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    size += batch.column("value").nbytes + batch.column("key").nbytes
                    bar.update(batch.num_rows)
    seconds = time.perf_counter() - started
    from streamlake.kafka import fetch_wait

    return {"records": rows, "payload_bytes": size, "seconds": round(seconds, 2),
            "fetch_wait_ms": fetch_wait.current_ms(conf)}


def produce_live(topic: str, count: int, partitions: int, value_bytes: int, seed: int) -> dict:
    """Write ``count`` readings one record per record batch, as a real-time producer does
    (librdkafka ``linger.ms=0``, ``batch.num.messages=1``), as fast as the broker takes
    them, from a background thread; round-robin over the partitions."""
    from confluent_kafka import Producer
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import SensorReadings, ensure_topic
    from tqdm import tqdm

    conf = client_config()
    ensure_topic(conf, topic, partitions)
    state = {"sent": 0, "delivered": 0, "errors": []}

    def on_delivery(err, _msg) -> None:
        if err is None:
            state["delivered"] += 1
        else:
            state["errors"].append(str(err))

    def run() -> None:
        producer = Producer({"bootstrap.servers": conf["bootstrap.servers"], "linger.ms": 0,
                             "batch.num.messages": 1, "enable.idempotence": True, "acks": "all"})
        readings = SensorReadings(seed, value_bytes=value_bytes)
        while state["sent"] < count:
            if state["sent"] - state["delivered"] - len(state["errors"]) >= 2000:
                producer.poll(0.01)  # at the broker's pace, no deep local queue
                continue
            key, value = readings.next()
            producer.produce(topic, value=value, key=key, partition=state["sent"] % partitions,
                             on_delivery=on_delivery)
            state["sent"] += 1
            producer.poll(0)
        state["left"] = producer.flush(120)

    started = time.perf_counter()
    thread = threading.Thread(target=run, name="live-producer", daemon=True)
    thread.start()
    with tqdm(total=count, unit="rec", unit_scale=True, desc=f"produce {topic} (1 per batch)", file=sys.stderr,
              mininterval=1) as bar:
        while thread.is_alive():
            thread.join(0.5)
            bar.update(state["delivered"] - bar.n)
    seconds = time.perf_counter() - started
    if state["errors"] or state.get("left") or state["delivered"] != count:
        raise SystemExit(f"live producer delivered {state['delivered']} of {count} records "
                         f"({state['errors'][:1] or 'flush timed out'})")
    return {"records": count, "seconds": round(seconds, 2), "records_per_second": round(count / seconds, 1),
            "records_per_batch": 1}


def ingest(topic: str, table: Path, checkpoint: Path, master: str, max_offsets: int, min_partitions: int | None,
           log_name: str = "ingest.log") -> dict:
    from streamlake.pipeline.ingest import progress_file

    cmd = [str(Path(sys.executable).parent / "streamlake"), "ingest", "--topic", topic, "--table", str(table),
           "--checkpoint", str(checkpoint), "--available-now", "--master", master,
           "--max-offsets-per-trigger", str(max_offsets)]
    if min_partitions:
        cmd += ["--min-partitions", str(min_partitions)]
    log = WORK / log_name
    started = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, text=True)
        for line in proc.stdout:
            print(f"  {line.rstrip()}", file=sys.stderr)
        code = proc.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"ingest failed (exit {code}); see {log}")
    batches = [json.loads(line) for line in progress_file(checkpoint).read_text().splitlines()]
    processing = sum(b["durationMs"] for b in batches) / 1000
    return {"wall_seconds": round(wall, 2), "processing_seconds": round(processing, 2),
            "startup_seconds": round(wall - processing, 2), "batches": batches,
            "records": sum(b["numInputRows"] for b in batches)}


LIVE_LABEL = "real-time topic"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = result.get("live")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12 if live else 11, 4.6 if live else 4.2))
    labels = ["ceiling\n(kafka→parquet,\n1 process)", "ingest\n(processing)", "ingest\n(warm batches)",
              "ingest\n(end to end)"]

    def values(run: dict) -> list[float]:
        return [run["ceiling"]["records_per_second"], run["ingest"]["records_per_second"],
                run["ingest"].get("steady_records_per_second", 0), run["ingest"]["end_to_end_records_per_second"]]

    def ratios(run: dict) -> list[float]:
        return [1.0, run["ratio"], run.get("steady_ratio", 0.0), run["end_to_end_ratio"]]

    p = result["params"]
    if not live:
        vals = values(result)
        bars = left.bar(labels, vals, color=["#888888", "#2a7ab9", "#5b9bd5", "#8fbde0"])
        left.bar_label(bars, labels=[f"{v:,.0f}" for v in vals])
        left.axhline(0.5 * vals[0], color="#c0392b", linestyle="--", linewidth=1, label="target: 0.5 × ceiling")
        left.set_title(f"{p['records']:,} records × ~{p['value_bytes']} B")
    else:
        lp = live["params"]
        x = range(len(labels))
        width = 0.38
        for offset, run, name, color in (
                (-width / 2, result, f"bulk-produced: {p['records']:,} records", "#2a7ab9"),
                (width / 2, live, f"{LIVE_LABEL}: {lp['records']:,} records, 1 per record batch", "#e67e22")):
            vals = values(run)
            bars = left.bar([i + offset for i in x], vals, width, color=color, label=name)
            left.bar_label(bars, labels=[f"{v / 1000:,.0f}k\n{r:.2f}×" for v, r in zip(vals, ratios(run))],
                           fontsize=7)
            left.plot([-0.5, len(labels) - 0.5], [0.5 * vals[0]] * 2, color=color, linestyle="--", linewidth=0.8)
        left.set_xticks(list(x), labels)
        left.set_title(f"records × ~{p['value_bytes']} B; × = ratio to the ceiling of the same topic; "
                       "dashed: 0.5 × ceiling", fontsize=9)
        left.set_ylim(0, max(values(result)[0], values(live)[0]) * 1.25)
    left.set_ylabel("records / s")
    left.legend(loc="upper right", fontsize=8)
    runs = [("", result)] + ([(LIVE_LABEL[:9] + " ", live)] if live else [])
    names, secs, colors = [], [], []
    for (prefix, run), color in zip(runs, ("#2a7ab9", "#e67e22")):
        for b in run["ingest"]["batches"]:
            names.append(f"{prefix}{b['batchId']}")
            secs.append(b["durationMs"] / 1000)
            colors.append(color)
    right.bar(names, secs, color=colors)
    right.set_xlabel("micro-batch" + (" (blue: bulk, orange: real-time topic)" if live else ""))
    right.set_ylabel("seconds")
    startups = " / ".join(f"{run['ingest']['startup_seconds']:.0f} s" for _, run in runs)
    right.set_title(f"ingest micro-batches (start-up {startups} not shown)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _rows(run: dict, prefix: str = "") -> list[tuple]:
    """Table rows of one topic's run: ceiling, processing, warm micro-batches, end to end."""
    c, i = run["ceiling"], run["ingest"]
    rows = [
        (f"{prefix}ceiling: confluent-kafka → pyarrow Parquet, 1 process", c["records"], c["seconds"],
         c["records_per_second"], c["mb_per_second"], 1.0),
        (f"{prefix}ingest: Spark micro-batches (processing time)", i["records"], i["processing_seconds"],
         i["records_per_second"], i["mb_per_second"], run["ratio"]),
        (f"{prefix}ingest: end to end incl. JVM start-up", i["records"], i["wall_seconds"],
         i["end_to_end_records_per_second"], i["end_to_end_mb_per_second"], run["end_to_end_ratio"]),
    ]
    if "steady_records_per_second" in i:
        warm = i["batches"][1:]
        rows.insert(2, (f"{prefix}ingest: micro-batches after the first (warm workers)",
                        sum(b["numInputRows"] for b in warm), sum(b["durationMs"] for b in warm) / 1000,
                        i["steady_records_per_second"],
                        i["steady_records_per_second"] * c["mb_per_second"] / c["records_per_second"],
                        run["steady_ratio"]))
    return rows


def _batch_table(batches: list[dict]) -> list[str]:
    out = [
        "| batch | rows | total | addBatch (read Kafka, write files, Delta commit) | latestOffset | "
        "walCommit | commitOffsets | other | rows/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in batches:
        d = b.get("durations", {})
        parts = [d.get(k, 0) for k in ("addBatch", "latestOffset", "walCommit", "commitOffsets")]
        out.append(f"| {b['batchId']} | {b['numInputRows']:,} | {b['durationMs']:,} | "
                   + " | ".join(f"{x:,}" for x in parts)
                   + f" | {b['durationMs'] - sum(parts):,} | {b['processedRowsPerSecond']:,.0f} |")
    return out


def markdown(result: dict) -> str:
    c, i, p = result["ceiling"], result["ingest"], result["params"]
    live = result.get("live")
    rows = _rows(result)
    if live:
        rows += _rows(live, f"{LIVE_LABEL} · ")
    out = [
        "# Bronze ingest benchmark",
        "",
        f"{p['records']:,} records of ~{p['value_bytes']} B in {p['partitions']} partitions, embedded broker, "
        f"Spark `{p['master']}`, maxOffsetsPerTrigger {p['max_offsets_per_trigger']:,}; "
        f"{result['machine']}; {result['date']}.",
    ]
    if live:
        lp = live["params"]
        out += [
            "",
            f"The **{LIVE_LABEL}** rows read a second topic, written the way a real-time producer writes: "
            f"{lp['records']:,} records of ~{lp['value_bytes']} B in {lp['partitions']} partitions, **one record "
            f"per record batch** (`linger.ms=0`, `batch.num.messages=1`; produced in {live['produce']['seconds']:.0f} s, "
            f"{live['produce']['records_per_second']:,.0f} records/s), ingested with maxOffsetsPerTrigger "
            f"{lp['max_offsets_per_trigger']:,}. The bulk topic was produced with `linger.ms=20` (many records "
            "per batch). Each topic's ratios are to the ceiling read of **that** topic (same reader, same "
            "process), so they compare the ingest with what the broker can serve for that shape of data.",
        ]
    out += [
        "",
        "| run | records | seconds | records/s | MB/s | × ceiling |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out += [f"| {name} | {n:,} | {s:.1f} | {rps:,.0f} | {mbps:.1f} | {ratio:.2f} |" for name, n, s, rps, mbps, ratio in rows]
    out += [
        "",
        f"Ceiling runs: {', '.join(f'{x:.1f} s' for x in c['runs_seconds'])} (the faster is the baseline). "
        f"JVM start-up and planning before the first batch: {i['startup_seconds']:.1f} s.",
        "",
        f"**Ratio ingest / ceiling: {result['ratio']:.2f}** (target ≥ 0.5; end to end {result['end_to_end_ratio']:.2f}). "
        f"Audit of the ingested table: **{'exactly once' if result['audit']['exactly_once'] else 'VIOLATED'}** "
        f"({result['audit']['table_rows']:,} rows, {result['audit']['kafka_records']:,} Kafka records, "
        f"audit took {result['audit']['seconds']:.0f} s).",
    ]
    if live:
        lc, li, la = live["ceiling"], live["ingest"], live["audit"]
        out += [
            "",
            f"**{LIVE_LABEL.capitalize()}: ratio ingest / ceiling {live['ratio']:.2f}** (end to end "
            f"{live['end_to_end_ratio']:.2f}"
            + (f", warm micro-batches {live['steady_ratio']:.2f}" if "steady_ratio" in live else "")
            + f"). Its ceiling reads {lc['records_per_second'] / c['records_per_second']:.2f}× as many records/s "
            f"as the bulk topic's (runs: {', '.join(f'{x:.1f} s' for x in lc['runs_seconds'])}; the reader's "
            f"fetch wait ended at {lc.get('fetch_wait_ms', '?')} ms). Audit: "
            f"**{'exactly once' if la['exactly_once'] else 'VIOLATED'}** ({la['table_rows']:,} rows, "
            f"{la['kafka_records']:,} Kafka records, audit took {la['seconds']:.0f} s). JVM start-up and planning "
            f"before the first batch: {li['startup_seconds']:.1f} s.",
        ]
    out += ["", "Micro-batches (Spark's own timing, ms):", ""] + _batch_table(i["batches"])
    if live:
        out += ["", f"Micro-batches of the {LIVE_LABEL} (ms):", ""] + _batch_table(live["ingest"]["batches"])
    first, warm = i["batches"][0], i["batches"][1:]
    if warm:
        warm_ms = sum(b["durationMs"] for b in warm) / len(warm)
        add_share = sum(b.get("durations", {}).get("addBatch", 0) for b in warm) / max(1, sum(b["durationMs"] for b in warm))
        out += [
            "",
            "Where the time goes:",
            "",
            f"- **Start-up, {i['startup_seconds']:.0f} s** (end to end only): JVM, SparkSession, initial offsets.",
            f"- **First micro-batch, {first['durationMs'] / 1000:.1f} s vs {warm_ms / 1000:.1f} s warm**: it starts "
            "Spark's Python workers (imports of pyspark, pyarrow, confluent-kafka) and runs cold JIT code.",
            f"- **Warm micro-batches: {add_share:.0%} in addBatch**, i.e. the Spark job: Python workers read Kafka "
            "into Arrow batches, the JVM turns them into rows and encodes Parquet. Task metrics show the JVM "
            "side as the largest CPU consumer; on 2 cores it shares the machine with the broker, which serves "
            "the same bytes to both runs. Offset planning, the offset log and the Delta commit are the rest.",
        ]
        if live:
            out.append(
                f"- **{LIVE_LABEL.capitalize()}**: the embedded broker lists every record batch of a partition for "
                "each fetch, so one-record batches make each fetch cost more as the partition grows; the readers "
                "start with a 10 ms fetch wait and move up a step when a read stalls "
                "(`streamlake.kafka.fetch_wait`), in the ceiling's process and in each Spark Python worker.")
    out += ["", "![throughput](ingest.png)", ""]
    return "\n".join(out)


def measure(topic: str, partitions: int, args, max_offsets: int, tag: str) -> dict:
    """Ceiling (twice), ingest and audit of one topic; rates and ratios to its own ceiling."""
    from streamlake.operations.audit import audit_offsets

    print(f"  ceiling of {topic}: confluent-kafka + pyarrow, one process, no Spark (twice; the faster counts)",
          file=sys.stderr)
    runs = [ceiling(topic, partitions, WORK / f"ceiling-{tag}{i}") for i in (1, 2)]
    ceil = min(runs, key=lambda r: r["seconds"])
    ceil["runs_seconds"] = [r["seconds"] for r in runs]
    print(f"  ingest of {topic}: streamlake ingest (spark-submit)", file=sys.stderr)
    ing = ingest(topic, WORK / f"bronze-{tag}", WORK / f"checkpoint-{tag}", args.master, max_offsets,
                 args.min_partitions, log_name=f"ingest-{tag}.log")
    print(f"  audit of {topic}", file=sys.stderr)
    started = time.perf_counter()
    report = audit_offsets(str(WORK / f"bronze-{tag}"), [topic])
    audit = {**report.totals(), "exactly_once": report.exactly_once,
             "seconds": round(time.perf_counter() - started, 1)}

    mb = ceil["payload_bytes"] / 1e6
    ceil["records_per_second"] = round(ceil["records"] / ceil["seconds"], 1)
    ceil["mb_per_second"] = round(mb / ceil["seconds"], 1)
    ing["records_per_second"] = round(ing["records"] / ing["processing_seconds"], 1)
    ing["mb_per_second"] = round(mb / ing["processing_seconds"], 1)
    ing["end_to_end_records_per_second"] = round(ing["records"] / ing["wall_seconds"], 1)
    warm = ing["batches"][1:]
    if warm:  # batch 0 also starts Spark's Python workers and warms the JIT
        warm_s = sum(b["durationMs"] for b in warm) / 1000
        ing["steady_records_per_second"] = round(sum(b["numInputRows"] for b in warm) / warm_s, 1)
    ing["end_to_end_mb_per_second"] = round(mb / ing["wall_seconds"], 1)
    out = {
        "ceiling": ceil, "ingest": ing, "audit": audit,
        "ratio": round(ing["records_per_second"] / ceil["records_per_second"], 3),
        "end_to_end_ratio": round(ing["end_to_end_records_per_second"] / ceil["records_per_second"], 3),
    }
    if "steady_records_per_second" in ing:
        out["steady_ratio"] = round(ing["steady_records_per_second"] / ceil["records_per_second"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=500_000)
    parser.add_argument("--min-partitions", type=int)
    parser.add_argument("--live-records", type=int, default=200_000,
                        help="records of the real-time-produced topic, one per record batch (0: skip it)")
    parser.add_argument("--live-partitions", type=int, help="partitions of the real-time topic (default --partitions)")
    parser.add_argument("--live-max-offsets-per-trigger", type=int, default=100_000,
                        help="its maxOffsetsPerTrigger (default: two micro-batches of the default topic, "
                             "like the bulk run)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where ingest.md/json/png go (default bench/results; use another for trial runs)")
    args = parser.parse_args()
    live_partitions = args.live_partitions or args.partitions

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    results = args.results
    results.mkdir(parents=True, exist_ok=True)
    os.environ["STREAMLAKE_HOME"] = str(WORK / "home")
    os.environ.pop("STREAMLAKE_KAFKA_BOOTSTRAP", None)
    from streamlake.kafka.producer import produce_sensor_readings
    from streamlake.platform import broker

    steps = 4 if args.live_records else 2
    state = broker.start(free_port())
    os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"] = state["bootstrap"]
    try:
        print(f"1/{steps} producing {args.records:,} records of ~{args.value_bytes} B into {args.partitions} "
              "partitions (bulk)", file=sys.stderr)
        produced = produce_sensor_readings("bench", args.records, partitions=args.partitions,
                                           value_bytes=args.value_bytes, seed=42)
        print(f"2/{steps} bulk-produced topic: ceiling, ingest, audit", file=sys.stderr)
        bulk = measure("bench", args.partitions, args, args.max_offsets_per_trigger, "bulk")
        live = None
        if args.live_records:
            print(f"3/{steps} producing {args.live_records:,} records of ~{args.value_bytes} B into "
                  f"{live_partitions} partitions, one record per batch (real-time producer)", file=sys.stderr)
            live_produced = produce_live("bench-live", args.live_records, live_partitions, args.value_bytes, seed=43)
            print(f"4/{steps} real-time-produced topic: ceiling, ingest, audit", file=sys.stderr)
            live = measure("bench-live", live_partitions, args, args.live_max_offsets_per_trigger, "live")
            live["params"] = {"records": args.live_records, "value_bytes": args.value_bytes,
                              "partitions": live_partitions, "records_per_batch": 1,
                              "max_offsets_per_trigger": args.live_max_offsets_per_trigger}
            live["produce"] = live_produced
    finally:
        broker.stop()

    result = {
        "params": {"records": args.records, "value_bytes": args.value_bytes, "partitions": args.partitions,
                   "master": args.master, "max_offsets_per_trigger": args.max_offsets_per_trigger},
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "produce": {"records": produced.records, "seconds": produced.seconds},
        **bulk,
    }
    if live:
        result["live"] = live
    (results / "ingest.json").write_text(json.dumps(result, indent=2))
    (results / "ingest.md").write_text(markdown(result))
    plot(result, results / "ingest.png")
    print(markdown(result))
    print(f"\ningest / ceiling = {result['ratio']:.2f} (end to end {result['end_to_end_ratio']:.2f})"
          + (f"; {LIVE_LABEL}: {live['ratio']:.2f} (end to end {live['end_to_end_ratio']:.2f})" if live else "")
          + f"; results in {results}/ingest.md", flush=True)
    ok = result["audit"]["exactly_once"] and (live is None or live["audit"]["exactly_once"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
