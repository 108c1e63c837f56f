"""`make bench` (second part): consistency checks, full and incremental, on 1M and 4M rows.

1. Start a private local Kafka broker. For each size, produce the records to a topic
   of its own in bulk and build the matching bronze table without Spark: bronze
   Parquet files and Delta commits carrying the offsets as ``txn`` actions and the
   ``streamlake.operation = ingest`` commit info, as the sink writes them. Each
   table is the ``bronze`` table of a root of its own (``<root>/bronze``, the layout
   of a job), and the checks are of a bronze-only job of that root and topic
   (:func:`streamlake.operations.jobs.job_for_root`: a real ``JobSpec``, not saved),
   as ``streamlake check --root`` checks one.
2. Full audit (``check --full``, which also records the proof) of each table, in a
   subprocess of its own: time and peak RSS.
3. Three rounds of: 10,000 new records produced and committed to each table, then
   an incremental check (``check``) in a subprocess: time and peak RSS.

Targets (issue 10): incremental on 4M < 5 % of the full audit of 4M, and within
1.5x of the incremental on 1M. Writes bench/results/checks.md, checks.json and
checks.png (``--results DIR``: there instead) and prints each target with whether it is met.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import RESULTS, free_port, machine  # noqa: E402

WORK = HERE / "work" / "checks"
PARTITIONS = 3
COMMIT_RECORDS = 100_000  # records per Delta commit while building (like a micro-batch)
NEW_RECORDS = 10_000
ROUNDS = 3
FULL_RUNS = 2
BASE_TS_MS = 1_795_000_000_000
INGEST_DATE = "2026-11-20"
KEYS = [b"sensor-%04d" % i for i in range(64)]


def records(partition: int, start: int, end: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """Keys, values and timestamps (ms) of offsets [start, end) of a partition (deterministic)."""
    keys = [KEYS[(i * 7 + partition) % 64] for i in range(start, end)]
    values = [b'{"i":%d,"p":%d,"t":%d.%d}' % (i, partition, 15 + i % 13, i % 10) for i in range(start, end)]
    return keys, values, [BASE_TS_MS + i for i in range(start, end)]


def keep_records(conf: dict, topic: str) -> None:
    """Create ``topic`` (unless it exists) with ``retention.ms=-1``: its records carry timestamps
    from BASE_TS_MS on, weeks old by now, and under Kafka's default retention (7 days; the local
    broker checks every few seconds) the broker would delete them while the bench runs, leaving
    the table's offsets unverifiable."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    from streamlake.kafka.client import librdkafka_config

    admin = AdminClient(librdkafka_config(conf))
    future = admin.create_topics([NewTopic(topic, PARTITIONS, config={"retention.ms": "-1"})])[topic]
    try:
        future.result(60)
    except KafkaException as exc:
        if exc.args[0].code() != exc.args[0].TOPIC_ALREADY_EXISTS:
            raise


def produce(topic: str, ranges: dict[int, tuple[int, int]]) -> float:
    """Produce the records of ``ranges`` (partition -> [start, end)) in bulk; seconds."""
    from confluent_kafka import Producer
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic

    conf = client_config()
    keep_records(conf, topic)
    ensure_topic(conf, topic, PARTITIONS)
    producer = Producer({**conf, "linger.ms": "50", "batch.size": str(1 << 20), "batch.num.messages": "100000",
                         "queue.buffering.max.messages": "2000000", "queue.buffering.max.kbytes": "1048576",
                         "enable.idempotence": "true", "acks": "all"})
    failures: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    started = time.perf_counter()
    for p, (start, end) in sorted(ranges.items()):
        for block in range(start, end, 50_000):
            keys, values, stamps = records(p, block, min(end, block + 50_000))
            for k, v, ts in zip(keys, values, stamps):
                while True:
                    try:
                        producer.produce(topic, value=v, key=k, partition=p, timestamp=ts, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
    left = producer.flush(120)
    if left or failures:
        raise SystemExit(f"produce to {topic} failed: {left} undelivered, {failures[:1]}")
    return time.perf_counter() - started


def commit(table_path: str, topic: str, ranges: dict[int, tuple[int, int]], batch_id: int, query_id: str) -> int:
    """One ingest commit of ``ranges`` as the sink makes it: bronze Parquet files
    (one per partition) and the next offsets as ``txn``; returns the version."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake.transaction import AddAction, CommitProperties
    from streamlake.delta.table import ensure_table
    from streamlake.delta.txn import commit_info, committed_offsets, offset_transactions
    from streamlake.kafka.offsets import TopicPartition, offsets_to_json
    from streamlake.pipeline.bronze import BRONZE

    table = ensure_table(table_path, BRONZE)
    tps = {p: TopicPartition(topic, p) for p in ranges}
    known = committed_offsets(table, tps.values())
    attempt = uuid.uuid4().hex
    directory = f"ingest_date={INGEST_DATE}/attempt-{attempt}"
    os.makedirs(os.path.join(table_path, directory))
    actions = []
    ingest_time = pa.scalar(BASE_TS_MS * 1000 + batch_id, pa.timestamp("us", tz="UTC"))
    for p, (start, end) in sorted(ranges.items()):
        keys, values, stamps = records(p, start, end)
        n = end - start
        data = pa.table({
            "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
            "topic": pa.array([topic] * n, pa.string()), "partition": pa.array([p] * n, pa.int32()),
            "offset": pa.array(range(start, end), pa.int64()),
            "timestamp": pa.array([t * 1000 for t in stamps], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * n, pa.int32()),
            "headers": pa.nulls(n, BRONZE.schema.field("headers").type),
            "ingest_time": pa.repeat(ingest_time, n), "batch_id": pa.array([batch_id] * n, pa.int64()),
        }, schema=BRONZE.file_schema)
        rel = f"{directory}/part-{p:05d}-{attempt}.snappy.parquet"
        full = os.path.join(table_path, rel)
        pq.write_table(data, full, compression="snappy", row_group_size=128 * 1024)
        stats = {"numRecords": n,
                 "minValues": {"topic": topic, "partition": p, "offset": start, "batch_id": batch_id},
                 "maxValues": {"topic": topic, "partition": p, "offset": end - 1, "batch_id": batch_id},
                 "nullCount": {"topic": 0, "partition": 0, "offset": 0, "batch_id": 0}}
        st = os.stat(full)
        actions.append(AddAction(rel, st.st_size, {"ingest_date": INGEST_DATE}, int(st.st_mtime * 1000), True,
                                 json.dumps(stats)))
    nexts = {tps[p]: end for p, (_s, end) in ranges.items()}
    firsts = {tps[p]: start for p, (start, _e) in ranges.items() if tps[p] not in known}
    properties = CommitProperties(
        app_transactions=offset_transactions(nexts, firsts, query_id, batch_id),
        custom_metadata=commit_info({
            "operation": "ingest", "queryId": query_id, "batchId": batch_id, "attempt": attempt,
            "startOffsets": offsets_to_json({tps[p]: s for p, (s, _e) in ranges.items()}),
            "endOffsets": offsets_to_json(nexts), "records": sum(e - s for s, e in ranges.values())}))
    table.create_write_transaction(actions, "append", BRONZE.schema, partition_by=["ingest_date"],
                                   commit_properties=properties)
    return ensure_table(table_path, BRONZE).version()


def split(total: int) -> dict[int, int]:
    """Records per partition for ``total`` records."""
    return {p: total // PARTITIONS + (1 if p < total % PARTITIONS else 0) for p in range(PARTITIONS)}


def build(topic: str, table: str, total: int) -> dict:
    """Produce ``total`` records and build the matching table in commits of COMMIT_RECORDS."""
    counts = split(total)
    produce_s = produce(topic, {p: (0, n) for p, n in counts.items()})
    started = time.perf_counter()
    query_id = str(uuid.uuid4())
    per_part = COMMIT_RECORDS // PARTITIONS
    batch = 0
    start = 0
    while start < max(counts.values()):
        ranges = {p: (start, min(n, start + per_part)) for p, n in counts.items() if start < n}
        commit(table, topic, ranges, batch, query_id)
        batch += 1
        start += per_part
    return {"records": total, "produce_seconds": round(produce_s, 1),
            "table_seconds": round(time.perf_counter() - started, 1), "commits": batch, "query_id": query_id,
            "next": counts, "batch": batch}


def add_records(topic: str, table: str, state: dict, count: int) -> None:
    """``count`` new records: produced, then committed as one ingest commit."""
    ranges = {p: (state["next"][p], state["next"][p] + n) for p, n in split(count).items()}
    produce(topic, ranges)
    commit(table, topic, ranges, state["batch"], state["query_id"])
    state["batch"] += 1
    state["next"] = {p: end for p, (_s, end) in ranges.items()}


def measure(kind: str, name: str, topic: str, root: str) -> dict:
    """Run one check in a fresh interpreter: its time and the process's peak memory."""
    cmd = [sys.executable, __file__, "--measure", kind, "--job", name, "--topic", topic, "--root", root]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    if done.returncode != 0:
        raise SystemExit(f"measurement {kind} {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_rss_bytes() -> int:
    """This process's peak resident set size since it started (``VmHWM``). Not
    ``getrusage().ru_maxrss``: Linux carries that over from the parent across
    fork and exec, so a child of a big process would report the parent's peak."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def job_of(name: str, topic: str, root: str):
    """The bronze-only job of ``root`` (its table ``<root>/bronze``) ingesting ``topic``, as
    ``streamlake check --root`` finds or makes it: a JobSpec, not saved."""
    from streamlake.operations.jobs import job_for_root

    job = job_for_root(root, name=name, topics=[topic])
    assert job.source_topics == [topic] and job.table == table_of(root), (job, topic, root)
    return job


def table_of(root: str) -> str:
    """A job root's bronze table (what the checks audit)."""
    return os.path.join(root, "bronze")


def measure_here(kind: str, name: str, topic: str, root: str) -> dict:
    """(In the subprocess.) One check, timed; peak RSS of this process."""
    import psutil
    from streamlake.operations.consistency import check_consistency

    job = job_of(name, topic, root)
    me = psutil.Process()
    baseline = me.memory_info().rss
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:  # RSS over the check: flat if memory does not follow the rows read so far
        while not done.wait(0.05):
            samples.append((time.perf_counter() - started, me.memory_info().rss))

    started = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = check_consistency(job, f"bench-{kind}", full=(kind == "full"))
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    peak = peak_rss_bytes()
    d = result.to_dict()
    step = max(1, len(samples) // 100)
    return {"kind": kind, "seconds": round(seconds, 3), "peak_rss_mb": round(peak / 2**20, 1),
            "baseline_rss_mb": round(baseline / 2**20, 1), "passed": result.passed, "mode": d["mode"],
            "table_rows": d["table_rows"], "kafka_records": d["kafka_records"],
            "kafka_records_read": d["kafka_records_read"], "table_rows_read": d["table_rows_read"],
            "delta_version": d["delta_version"], "summary": result.summary,
            "rss_mb": [[round(t / seconds, 3), round(rss / 2**20, 1)] for t, rss in samples[::step]]}


def rss_quarters(m: dict) -> list[float]:
    """Median RSS (MB) in each quarter of a measured check's duration."""
    out = []
    for q in range(4):
        values = [rss for t, rss in m["rss_mb"] if q / 4 <= t < (q + 1) / 4]
        out.append(statistics.median(values) if values else float("nan"))
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s["label"] for s in result["sizes"]]
    full = [s["full"]["seconds"] for s in result["sizes"]]
    inc = [s["incremental_seconds"] for s in result["sizes"]]
    fig, (left, right, timeline) = plt.subplots(1, 3, figsize=(16, 4.2))
    x = range(len(sizes))
    b1 = left.bar([i - 0.2 for i in x], full, 0.4, label="full audit (check --full)", color="#2a7ab9")
    b2 = left.bar([i + 0.2 for i in x], inc, 0.4, label=f"incremental check after {NEW_RECORDS:,} records",
                  color="#e08e2b")
    left.bar_label(b1, labels=[f"{v:.1f} s" for v in full])
    left.bar_label(b2, labels=[f"{v:.2f} s" for v in inc])
    left.set_yscale("log")
    left.set_ylim(top=max(full) * 8)
    left.set_xticks(list(x), [f"{s} rows" for s in sizes])
    left.set_ylabel("seconds (log scale)")
    left.set_title("check time")
    left.legend(fontsize=8, loc="upper left")
    peak_full = [s["full"]["peak_rss_mb"] for s in result["sizes"]]
    peak_inc = [s["incremental_peak_rss_mb"] for s in result["sizes"]]
    base = [s["full"]["baseline_rss_mb"] for s in result["sizes"]]
    r1 = right.bar([i - 0.2 for i in x], peak_full, 0.4, label="full audit", color="#2a7ab9")
    r2 = right.bar([i + 0.2 for i in x], peak_inc, 0.4, label="incremental check", color="#e08e2b")
    right.bar_label(r1, labels=[f"{v:.0f}" for v in peak_full])
    right.bar_label(r2, labels=[f"{v:.0f}" for v in peak_inc])
    right.axhline(statistics.mean(base), color="#888888", linestyle="--", linewidth=1,
                  label="process after imports, before the check")
    right.set_xticks(list(x), [f"{s} rows" for s in sizes])
    right.set_ylim(top=max(peak_full + peak_inc) * 1.45)
    right.set_ylabel("peak RSS (MB)")
    right.set_title("peak memory of the check's process")
    right.legend(fontsize=8, loc="upper left")
    for s, color in zip(result["sizes"], ("#8fbde0", "#2a7ab9", "#174a72")):
        points = s["full"]["rss_mb"]
        timeline.plot([t * 100 for t, _ in points], [m for _, m in points], color=color,
                      label=f"full audit of {s['label']} rows ({s['full']['seconds']:.0f} s)")
    timeline.set_ylim(bottom=0)
    timeline.set_xlabel("progress of the full audit (% of its time)")
    timeline.set_ylabel("RSS (MB)")
    timeline.set_title("memory while the full audit runs")
    timeline.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result: dict) -> str:
    out = [
        "# Consistency check benchmark",
        "",
        f"Bronze tables built without Spark (bronze Parquet + Delta commits with `txn` offsets, "
        f"{COMMIT_RECORDS:,} records per commit, {PARTITIONS} partitions, values of ~30 B), the same records "
        f"in the local Kafka broker; each check runs in a fresh process (time of the check itself; peak RSS of "
        f"the process). {result['machine']}; {result['date']}.",
        "",
        "| table | full audit (s) | peak RSS full (MB; runs) | incremental after 10,000 records (s) | runs (s) | "
        "peak RSS incremental (MB) | rows read by the incremental check | Kafka records read |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for s in result["sizes"]:
        last = s["incremental"][-1]
        runs = ", ".join("%.3f" % r["seconds"] for r in s["incremental"])
        peaks = ", ".join("%.0f" % p for p in s["full"]["runs_peak_rss_mb"])
        out.append(f"| {s['label']} rows | {s['full']['seconds']:.1f} | {s['full']['peak_rss_mb']:.0f} ({peaks}) | "
                   f"{s['incremental_seconds']:.3f} | {runs} | "
                   f"{s['incremental_peak_rss_mb']:.0f} | {last['table_rows_read']:,} | "
                   f"{last['kafka_records_read']:,} |")
    out += ["", "RSS of the full audit's process by quarter of its run (median, MB): "
            + "; ".join(f"{s['label']}: " + ", ".join(f"{v:.0f}" for v in rss_quarters(s["full"]))
                        for s in result["sizes"]) + ".", "", "Targets:", ""]
    for t in result["targets"]:
        out.append(f"- {t['name']}: {t['value']} (target {t['target']}): **{'met' if t['met'] else 'NOT MET'}**")
    baselines = ", ".join("%.0f MB" % s["full"]["baseline_rss_mb"] for s in result["sizes"])
    building = ", ".join("%s: produce %.0f s, table %.0f s" % (s["label"], s["build"]["produce_seconds"],
                                                                s["build"]["table_seconds"]) for s in result["sizes"])
    out += [
        "",
        f"The incremental time is the median of {ROUNDS} rounds of {NEW_RECORDS:,} new records each. "
        f"Process memory after imports (pyarrow, deltalake, confluent-kafka) and before the check: {baselines}. "
        f"Full audits: the faster of {FULL_RUNS} runs, the higher peak (the peak varies by some 50 MB from run "
        "to run, with allocators and the broker's answers). "
        "The full audit compares partition by partition in chunks of "
        f"{result['chunk_offsets']:,} offsets (sorted offset arrays, 12-byte digests) and reads Kafka with a "
        f"prefetch of at most {result['prefetch_kb'] // 1024} MB per partition (librdkafka's default, 64 MB, "
        "was the part of the peak that followed the partitions' size up to that cap), so its peak does not "
        f"follow the table's size: {result['memory_growth']}.",
        "",
        f"Building: {building}.",
        "",
        "![checks](checks.png)",
        "",
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,4000000", help="table sizes (records), comma-separated")
    parser.add_argument("--measure", choices=["full", "incremental"], help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where checks.md, .json and .png go (default bench/results)")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_here(args.measure, args.job, args.topic, args.root)))
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    results = args.results
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    results.mkdir(parents=True, exist_ok=True)
    os.environ["STREAMLAKE_HOME"] = str(WORK / "home")
    os.environ.pop("STREAMLAKE_KAFKA_BOOTSTRAP", None)
    from streamlake.operations.audit import CHUNK_OFFSETS, PREFETCH_KB
    from streamlake.platform import broker

    state = broker.start(broker.find_free_port())
    os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"] = state["bootstrap"]
    entries = []
    try:
        for n in sizes:
            label = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"
            topic, root = f"checks-{label.lower()}", str(WORK / f"job-{label.lower()}")
            table = table_of(root)
            print(f"building {label}: producing {n:,} records and the matching table", file=sys.stderr, flush=True)
            built = build(topic, table, n)
            entries.append({"label": label, "records": n, "topic": topic, "root": root, "table": table,
                            "build": built, "job": f"bench_{label.lower()}"})
        for e in entries:
            runs = []
            for i in range(FULL_RUNS):
                print(f"full audit of {e['label']} ({i + 1}/{FULL_RUNS})", file=sys.stderr, flush=True)
                runs.append(measure("full", e["job"], e["topic"], e["root"]))
                print(f"  {runs[-1]['seconds']:.1f} s, peak {runs[-1]['peak_rss_mb']:.0f} MB", file=sys.stderr)
                if not runs[-1]["passed"]:
                    raise SystemExit(f"the generated table is not exactly once:\n{runs[-1]['summary']}")
            # The faster run's time and memory timeline; the highest peak of the runs (the
            # peak varies by some 50 MB from run to run: allocators, the broker's answers).
            e["full"] = min(runs, key=lambda m: m["seconds"])
            e["full"]["runs_seconds"] = [m["seconds"] for m in runs]
            e["full"]["runs_peak_rss_mb"] = [m["peak_rss_mb"] for m in runs]
            e["full"]["peak_rss_mb"] = max(m["peak_rss_mb"] for m in runs)
            e["incremental"] = []
        for r in range(ROUNDS):
            for e in entries:
                add_records(e["topic"], e["table"], e["build"], NEW_RECORDS)
                m = measure("incremental", e["job"], e["topic"], e["root"])
                if not m["passed"] or m["mode"] != "incremental":
                    raise SystemExit(f"incremental check failed or was not incremental:\n{m['summary']}")
                print(f"incremental check of {e['label']} (round {r + 1}): {m['seconds']:.3f} s, "
                      f"peak {m['peak_rss_mb']:.0f} MB, read {m['table_rows_read']:,} rows", file=sys.stderr)
                e["incremental"].append(m)
    finally:
        broker.stop()

    for e in entries:
        e["incremental_seconds"] = statistics.median(m["seconds"] for m in e["incremental"])
        e["incremental_peak_rss_mb"] = max(m["peak_rss_mb"] for m in e["incremental"])
        e["full"].pop("summary", None)
        for m in e["incremental"]:
            m.pop("summary", None)
    targets = []
    if len(entries) >= 2:
        small, big = entries[0], entries[-1]
        share = big["incremental_seconds"] / big["full"]["seconds"]
        ratio = big["incremental_seconds"] / small["incremental_seconds"]
        targets = [
            {"name": f"incremental {big['label']} / full audit {big['label']}", "value": f"{share:.2%}",
             "target": "< 5 %", "met": share < 0.05},
            {"name": f"incremental {big['label']} / incremental {small['label']}", "value": f"{ratio:.2f}x",
             "target": "<= 1.5x", "met": ratio <= 1.5},
        ]
    growth = "n/a"
    if len(entries) >= 2:
        small, big = entries[0], entries[-1]
        growth = (f"peak {big['full']['peak_rss_mb']:.0f} MB at {big['label']} vs {small['full']['peak_rss_mb']:.0f} MB "
                  f"at {small['label']} ({big['full']['peak_rss_mb'] - small['full']['peak_rss_mb']:+.0f} MB for "
                  f"{big['records'] / small['records']:g}x the rows)")
    result = {"machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "chunk_offsets": CHUNK_OFFSETS, "prefetch_kb": PREFETCH_KB,
              "new_records": NEW_RECORDS, "memory_growth": growth, "sizes": entries, "targets": targets}
    (results / "checks.json").write_text(json.dumps(result, indent=2))
    (results / "checks.md").write_text(markdown(result))
    plot(result, results / "checks.png")
    print(markdown(result))
    for e in entries:
        print(f"{e['label']}: full audit {e['full']['seconds']:.1f} s (peak {e['full']['peak_rss_mb']:.0f} MB), "
              f"incremental {e['incremental_seconds']:.3f} s (peak {e['incremental_peak_rss_mb']:.0f} MB)")
    print(f"full audit memory: {growth}")
    for e in entries:
        print(f"  RSS of the {e['label']} full audit by quarter of its run (MB): "
              + ", ".join(f"{v:.0f}" for v in rss_quarters(e["full"])))
    for t in targets:
        print(f"target {t['name']} {t['target']}: {t['value']} -> {'met' if t['met'] else 'NOT MET'}")
    print(f"results in {results}/checks.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
