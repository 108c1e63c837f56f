"""`make bench` (2/3): how long a record takes from the producer to a Delta snapshot.

A steady stream, as a producer application writes it: ``--rate`` records/s
(2,000) for ``--seconds`` (60), librdkafka's own batching (``linger.ms`` 5 ms;
at this rate a record batch holds a few records), valid sensor readings keyed
by sensor (a sensor's readings stay in one partition, in order).

1. **Bronze**: ``streamlake ingest --processing-time 1`` (spark-submit). A
   reader polls the table with delta-rs every ``--poll-ms`` (new version ->
   the files it added) and notes when it first sees each record; latency =
   that moment - the record's Kafka timestamp (librdkafka's CreateTime, set
   when ``produce()`` is called). Target (issue 11): p99 <= 3 s.
2. **Bronze, one record per record batch** (``linger.ms=0``,
   ``batch.num.messages=1``): the same, from a producer that writes the
   smallest batches. Reported, split at the broker's acknowledgement: with
   one-record batches and at most 5 requests in flight (an idempotent
   librdkafka producer), records queue in the producer while a busy broker
   answers, before they are in Kafka at all.
3. **Whole pipeline**: ``streamlake pipeline run --processing-time 1``
   (bronze -> silver -> gold, tumbling 1-minute windows), the producer's own
   batching. The reader polls
   bronze, silver (Kafka timestamp kept as ``kafka_timestamp``) and gold; a
   record is visible in gold once its window's ``count`` covers it (a sensor's
   readings reach gold in the order they were produced, so count ``c`` of
   (sensor, window) means its first ``c`` readings). No target: reported, with
   what dominates.

Every run starts the job and waits until a first trickle of records is visible
(JVM and workers started) before the measured stream begins; nothing of the
job's own log is used for the latencies. Writes bench/results/latency.md,
latency.json and latency.png and prints the percentiles against the target.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS,
    SteadyProducer,
    load,
    machine,
    percentile,
    private_broker,
    progress,
    target_line,
    write_results,
)

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "latency"
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
TARGET_P99_S = 3.0
SENSORS = 64
PRIMING = 200  # records produced (and awaited) before the measured stream


# -- records ---------------------------------------------------------------------------------------

class Readings:
    """Valid sensor readings keyed by sensor, event time = produce time; remembers, per
    (sensor, window start ms), the produce times in order (for gold visibility)."""

    def __init__(self, partitions: int, value_bytes: int, window_ms: int = 60_000):
        self.partitions, self.window_ms = partitions, window_ms
        self.pad = "x" * max(0, value_bytes - 140)
        self.by_window: dict[tuple[str, int], list[float]] = {}
        self.lock = threading.Lock()

    def make(self, seq: int, now: float) -> tuple[bytes, bytes, int]:
        sensor = f"sensor-{seq % SENSORS:03d}"
        ms = int(now * 1000)
        event_time = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
        value = json.dumps({"event_id": uuid.uuid4().hex, "sensor_id": sensor, "event_time": event_time,
                            "temperature": round(15 + (seq % 200) / 10, 1), "pad": self.pad}, separators=(",", ":"))
        with self.lock:
            self.by_window.setdefault((sensor, ms - ms % self.window_ms), []).append(now)
        partition = zlib.crc32(sensor.encode()) % self.partitions
        return sensor.encode(), value.encode(), partition


# -- the poller ------------------------------------------------------------------------------------

class Poller:
    """Polls Delta tables with delta-rs; notes when each record is first seen.

    ``tables`` maps a name to (path, kind): kind ``records`` reads the new files'
    (partition, offset, timestamp column) rows; ``gold`` reads the snapshot's
    (sensor, window, count) rows when the table changed."""

    def __init__(self, tables: dict[str, tuple[str, str, str | None]], poll_s: float):
        self.tables, self.poll_s = tables, poll_s
        self.seen: dict[str, dict[tuple[int, int], tuple[float, float]]] = {n: {} for n in tables}
        self.gold_counts: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self.versions: dict[str, list[tuple[float, int]]] = {n: [] for n in tables}
        self.polls = 0
        self.poll_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delta-poller", daemon=True)

    def start(self) -> "Poller":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from deltalake import DeltaTable

        handles: dict[str, DeltaTable] = {}
        known_files: dict[str, set[str]] = {n: set() for n in self.tables}
        while not self._stop.is_set():
            started = time.time()
            for name, (path, kind, column) in self.tables.items():
                try:
                    if name not in handles:
                        if not DeltaTable.is_deltatable(path):
                            continue
                        handles[name] = DeltaTable(path)
                        before = -1
                    else:
                        before = handles[name].version()
                        handles[name].update_incremental()
                    table = handles[name]
                    if table.version() == before:
                        continue
                    seen_at = time.time()
                    self.versions[name].append((seen_at, table.version()))
                    files = [u[len("file://"):] if u.startswith("file://") else u for u in table.file_uris()]
                    if kind == "records":
                        new = [f for f in files if f not in known_files[name]]
                        known_files[name].update(new)
                        self._records(name, new, column, seen_at)
                    else:
                        self._gold(files, seen_at)
                except Exception as exc:  # noqa: BLE001 - a table mid-commit; try again next poll
                    print(f"poller: {name}: {exc}", file=sys.stderr)
            self.polls += 1
            self.poll_seconds += time.time() - started
            self._stop.wait(max(0.0, self.poll_s - (time.time() - started)))

    def _records(self, name: str, files: list[str], column: str, seen_at: float) -> None:
        import pyarrow.parquet as pq

        seen = self.seen[name]
        for f in files:
            data = pq.read_table(f, columns=["partition", "offset", column])
            stamps = data.column(column).cast("int64").to_pylist()  # µs since the epoch
            for p, o, ts in zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(), stamps):
                seen.setdefault((p, o), (ts / 1e6, seen_at))

    def _gold(self, files: list[str], seen_at: float) -> None:
        import pyarrow.parquet as pq

        for f in files:
            data = pq.read_table(f, columns=["sensor_id", "window_start", "count"])
            starts = data.column("window_start").cast("int64").to_pylist()
            for sensor, start, count in zip(data.column("sensor_id").to_pylist(), starts,
                                            data.column("count").to_pylist()):
                history = self.gold_counts.setdefault((str(sensor), start // 1000), [])
                if not history or history[-1][1] < count:
                    history.append((seen_at, count))


def record_latencies(poller: Poller, name: str, since: float) -> list[float]:
    """Seconds from Kafka timestamp to first seen, for records produced at or after ``since``."""
    return sorted(seen - ts for ts, seen in poller.seen[name].values() if ts >= since - 0.001)


def gold_latencies(poller: Poller, readings: Readings, since: float) -> tuple[list[float], int]:
    """Seconds from produce to visible in gold; and the number of records never seen there."""
    out, unseen = [], 0
    for key, produced in readings.by_window.items():
        history = poller.gold_counts.get(key, [])
        for rank, at in enumerate(produced, start=1):
            if at < since:
                continue
            seen = next((t for t, count in history if count >= rank), None)
            if seen is None:
                unseen += 1
            else:
                out.append(seen - at)
    return sorted(out), unseen


def stats(latencies: list[float]) -> dict:
    return {"records": len(latencies), "p50_s": round(percentile(latencies, 50), 3),
            "p95_s": round(percentile(latencies, 95), 3), "p99_s": round(percentile(latencies, 99), 3),
            "max_s": round(latencies[-1], 3) if latencies else None,
            "min_s": round(latencies[0], 3) if latencies else None}


# -- one run -----------------------------------------------------------------------------------------

def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> float:
    started = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            raise SystemExit(f"the job exited ({proc.returncode}) while waiting for {what}; see {log}")
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"{what} not within {timeout_s:.0f} s; see {log}")
        time.sleep(0.1)
    return time.monotonic() - started


def run(kind: str, bootstrap: str, args, batching: str) -> dict:
    """One measured run: ``kind`` is "bronze" (streamlake ingest) or "pipeline"; the measured
    stream's producer batches as ``batching`` says (``common.PRODUCER_BATCHING``)."""
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic
    from streamlake.operations.control import JobControl

    topic = f"latency-{kind}-{batching}"
    root = WORK / f"{kind}-{batching}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ensure_topic(client_config(), topic, args.partitions)
    if kind == "bronze":
        table, checkpoint = root / "bronze", root / "checkpoint"
        cmd = [STREAMLAKE, "ingest", "--topic", topic, "--table", str(table), "--checkpoint", str(checkpoint),
               "--processing-time", str(args.trigger_s), "--master", args.master]
        control = JobControl.for_checkpoint(checkpoint)
        tables = {"bronze": (str(table), "records", "timestamp")}
    else:
        cmd = [STREAMLAKE, "pipeline", "run", "--topic", topic, "--root", str(root), "--processing-time",
               str(args.trigger_s), "--master", args.master]
        control = JobControl(root / "_control")
        tables = {"bronze": (str(root / "bronze"), "records", "timestamp"),
                  "silver": (str(root / "silver"), "records", "kafka_timestamp"),
                  "gold": (str(root / "gold"), "gold", None)}
    readings = Readings(args.partitions, args.value_bytes)
    poller = Poller(tables, args.poll_ms / 1000).start()
    log = WORK / f"{kind}-{batching}.log"
    launched = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            # A trickle first: the job is up and has written it to every table.
            priming = SteadyProducer(bootstrap, topic, PRIMING, 1.0, readings.make).start()
            last = "gold" if kind == "pipeline" else "bronze"
            if last == "gold":
                ready = lambda: sum(h[-1][1] for h in poller.gold_counts.values()) >= PRIMING  # noqa: E731
            else:
                ready = lambda: len(poller.seen["bronze"]) >= PRIMING  # noqa: E731
            wait_for(ready, 300, f"the first {PRIMING} records in {last}", proc, log)
            startup_s = time.monotonic() - launched
            progress(f"{kind}: job up and priming records visible after {startup_s:.0f} s; "
                     f"producing {args.rate:,.0f} records/s for {args.seconds:.0f} s")
            since = time.time()
            load_before = load()
            producer = SteadyProducer(bootstrap, topic, args.rate, args.seconds, readings.make, keep=True,
                                      batching=batching).start()
            producer.join()
            load_after = load()
            if producer.errors:
                raise SystemExit(f"producer failed: {producer.errors[:2]}")
            total = PRIMING + producer.sent

            def all_visible() -> bool:
                if kind == "pipeline":
                    return sum(h[-1][1] for h in poller.gold_counts.values()) >= total
                return len(poller.seen["bronze"]) >= total

            drain_s = wait_for(all_visible, 120, f"all {total:,} records in {last}", proc, log)
        finally:
            control.request_stop()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
            poller.stop()
    batches = [json.loads(line) for line in control.progress_file.read_text().splitlines()] \
        if control.progress_file.exists() else []
    out = {"kind": kind, "batching": batching, "topic": topic, "command": " ".join(cmd[1:]),
           "startup_seconds": round(startup_s, 1),
           "drain_seconds_after_producer": round(drain_s, 2), "produced": producer.sent,
           "producer_behind_s": round(producer.behind_s, 3), "load": [load_before, load_after],
           "poll_ms": args.poll_ms, "polls": poller.polls,
           "poll_cost_ms": round(1000 * poller.poll_seconds / max(1, poller.polls), 1)}
    out["bronze"] = stats(record_latencies(poller, "bronze", since))
    out["broker_ack"] = stats(sorted(acked - ts for key, (ts, _seen) in poller.seen["bronze"].items()
                                     if ts >= since - 0.001 for acked in [producer.acked.get(key)] if acked))
    out["bronze_after_ack"] = stats(sorted(seen - acked for key, (ts, seen) in poller.seen["bronze"].items()
                                           if ts >= since - 0.001 for acked in [producer.acked.get(key)] if acked))
    if kind == "pipeline":
        out["silver"] = stats(record_latencies(poller, "silver", since))
        gold, unseen = gold_latencies(poller, readings, since)
        out["gold"] = {**stats(gold), "unseen": unseen}
    out["series"] = series(poller, readings, since, kind)
    out["batches"] = summarize_batches(batches, since)
    return out


def series(poller: Poller, readings: Readings, since: float, kind: str) -> dict:
    """Per second of production: p50 and max latency (for the plot)."""
    out = {}
    names = ["bronze"] + (["silver"] if kind == "pipeline" else [])
    for name in names:
        buckets: dict[int, list[float]] = {}
        for ts, seen in poller.seen[name].values():
            if ts >= since:
                buckets.setdefault(int(ts - since), []).append(seen - ts)
        out[name] = {s: (percentile(sorted(v), 50), max(v)) for s, v in sorted(buckets.items())}
    if kind == "pipeline":
        buckets = {}
        for key, produced in readings.by_window.items():
            history = poller.gold_counts.get(key, [])
            for rank, at in enumerate(produced, start=1):
                seen = next((t for t, c in history if c >= rank), None)
                if at >= since and seen is not None:
                    buckets.setdefault(int(at - since), []).append(seen - at)
        out["gold"] = {s: (percentile(sorted(v), 50), max(v)) for s, v in sorted(buckets.items())}
    return out


def summarize_batches(batches: list[dict], since: float) -> dict:
    """Per stage: micro-batches during the stream and the mean of Spark's phases (ms)."""
    out = {}
    for line in batches:
        stamp = dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp() \
            if line.get("timestamp") else 0
        if stamp < since or not line.get("numInputRows"):
            continue
        stage = out.setdefault(line.get("stage", "bronze"), {"batches": 0, "rows": 0, "ms": {}})
        stage["batches"] += 1
        stage["rows"] += line["numInputRows"]
        durations = dict(line.get("durations") or {})
        durations.setdefault("triggerExecution", line.get("durationMs") or 0)
        for key, value in {**durations, **{f"sink.{k}": v for k, v in (line.get("sinkMs") or {}).items()}}.items():
            stage["ms"].setdefault(key, []).append(value)
    for stage in out.values():
        stage["mean_ms"] = {k: round(sum(v) / len(v)) for k, v in stage.pop("ms").items()}
        stage["rows_per_batch"] = round(stage["rows"] / max(1, stage["batches"]))
    return out


# -- report ----------------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    p = result["params"]
    b, one, pl = result["bronze"], result.get("bronze_one_record"), result.get("pipeline")
    out = [
        "# Latency: produce → visible in a Delta snapshot",
        "",
        f"{p['rate']:,.0f} records/s for {p['seconds']:.0f} s from a producer application with librdkafka's own "
        "batching (`linger.ms` 5 ms: at this rate, record batches of a few records), and again, bronze only, "
        "from one that writes one record per record batch (`linger.ms=0`, `batch.num.messages=1`: the smallest "
        f"batches a live producer writes); ~{p['value_bytes']} B valid sensor readings keyed by sensor in {p['partitions']} partitions; processing-time "
        f"trigger {p['trigger_s']:g} s, Spark `{p['master']}`; local Kafka broker; {result['machine']}; {result['date']}. "
        f"A reader polls the tables with delta-rs every {p['poll_ms']} ms and notes when it first sees each record; "
        "latency = that moment − the record's Kafka timestamp (produce time). Polling adds up to one poll interval. "
        "The rows in italics split it: when the broker acknowledged each record (it is readable from then on: a "
        "busy broker acknowledges one-record batches late), and the rest, the ingest's own share.",
        "",
        "| run | table | records | p50 | p95 | p99 | max | load |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]

    def row(run: str, table: str, s: dict, l: list) -> str:
        return (f"| {run} | {table} | {s['records']:,} | {s['p50_s']:.2f} s | {s['p95_s']:.2f} s | "
                f"{s['p99_s']:.2f} s | {s['max_s']:.2f} s | {l[0]:.1f}–{l[1]:.1f} |")

    for name, r, table in (("bronze ingest (`streamlake ingest --processing-time 1`)", b, "**bronze**"),
                           ("bronze ingest, one record per record batch", one, "bronze")):
        if r:
            out.append(row(name, table, r["bronze"], r["load"]))
            out.append(row(name, "*in Kafka (produce → broker's ack)*", r["broker_ack"], r["load"]))
            out.append(row(name, "*bronze, counted from the broker's ack*", r["bronze_after_ack"], r["load"]))
    if pl:
        name = "pipeline (`streamlake pipeline run --processing-time 1`)"
        for table in ("bronze", "silver", "gold"):
            out.append(row(name, f"**{table}**" if table == "gold" else table, pl[table], pl["load"]))
        out.append(row(name, "*in Kafka (produce → broker's ack)*", pl["broker_ack"], pl["load"]))
    out += ["", "Target (issue 11): " + target_line("bronze p99", b["bronze"]["p99_s"], TARGET_P99_S, " s",
                                                     higher_is_better=False)
            + " (the producer's own batching)"
            + (f"; with one record per record batch: p99 {one['bronze']['p99_s']:.2f} s, from the broker's ack "
               f"{one['bronze_after_ack']['p99_s']:.2f} s (reported)" if one else ""), ""]
    for name, r in (("Bronze ingest", b), ("Bronze ingest, one record per record batch", one), ("Pipeline", pl)):
        if not r:
            continue
        out += [f"**{name}**: job up (JVM, workers, first records visible) after {r['startup_seconds']:.0f} s, not "
                f"counted; {r['produced']:,} records measured; all visible {r['drain_seconds_after_producer']:.1f} s "
                f"after the producer's last record (the producer fell behind its schedule by at most "
                f"{r['producer_behind_s'] * 1000:.0f} ms; a poll cost {r['poll_cost_ms']:.0f} ms)."
                + (f" Records never seen in gold: {r['gold']['unseen']}." if "gold" in r else ""), ""]
        out += ["| stage | micro-batches | rows/batch | trigger total | latestOffset | walCommit | addBatch "
                "(sink: files / commit) | commitOffsets |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for stage, s in r["batches"].items():
            m = s["mean_ms"]
            sink = f" ({m['sink.write']} / {m['sink.plan'] + m['sink.commit']})" if "sink.write" in m else ""

            def ms(key: str) -> str:
                return f"{m[key]:,} ms" if key in m else "–"

            out.append(f"| {stage} | {s['batches']} | {s['rows_per_batch']:,} | {ms('triggerExecution')} | "
                       f"{ms('latestOffset')} | {ms('walCommit')} | {ms('addBatch')}{sink} | {ms('commitOffsets')} |")
        out.append("")
    out += ["## What the latency is made of", ""] + result["explanation"] + ["", "![latency](latency.png)", ""]
    return "\n".join(out)


def explain(result: dict) -> list[str]:
    b = result["bronze"]
    bm = b["batches"].get("bronze", {}).get("mean_ms", {})
    trig = result["params"]["trigger_s"]
    lines = [
        f"- **Bronze**: a record waits for the next trigger (every {trig:g} s, or at once when a micro-batch took "
        f"longer), then the micro-batch takes ~{bm.get('triggerExecution', 0) / 1000:.2f} s: the end-offset probe "
        f"(latestOffset ~{bm.get('latestOffset', 0)} ms), the offset log (~{bm.get('walCommit', 0)} ms), the Spark job "
        f"in which read tasks write the files (~{bm.get('sink.write', 0)} ms), the Delta commit "
        f"(~{bm.get('sink.plan', 0) + bm.get('sink.commit', 0)} ms), the commit log "
        f"(~{bm.get('commitOffsets', 0)} ms). The commit lands before the commit log, so a record is visible "
        "about one micro-batch minus commitOffsets after its trigger. Median ≈ half a trigger interval + a "
        "micro-batch; the tail is a record produced just after a trigger fired, plus a slow micro-batch.",
    ]
    one = result.get("bronze_one_record")
    if one:
        om = one["batches"].get("bronze", {}).get("mean_ms", {})
        lines.append(
            f"- **One record per record batch**: the same stream in {one['produced']:,} one-record batches. A micro-batch "
            f"takes ~{om.get('triggerExecution', 0) / 1000:.2f} s instead of ~{bm.get('triggerExecution', 0) / 1000:.2f} s "
            f"(end-offset probe ~{om.get('latestOffset', 0)} ms, read tasks ~{om.get('sink.write', 0)} ms): the embedded "
            "broker's fetches cost more the more record batches a partition holds, so the micro-batches lengthen as "
            f"the topic grows. And the records reach Kafka later: produce → broker's ack p99 "
            f"{one['broker_ack']['p99_s']:.2f} s (the producer's own batching: {b['broker_ack']['p99_s']:.2f} s), because "
            "every request the producer sends carries one-record batches, and an idempotent producer keeps at most 5 "
            "requests in flight (librdkafka), so records queue in the producer while the busy broker answers. "
            f"Counted from the ack, bronze's p99 is {one['bronze_after_ack']['p99_s']:.2f} s.")
    pl = result.get("pipeline")
    if pl:
        stages = pl["batches"]
        parts = ", ".join(f"{name} ~{s['mean_ms'].get('triggerExecution', 0) / 1000:.1f} s per micro-batch "
                          f"({s['batches']} batches)" for name, s in stages.items())
        g, s, br = pl["gold"], pl["silver"], pl["bronze"]
        lines.append(
            f"- **Pipeline**: the three stages are streaming queries of one driver, each triggered every "
            f"{trig:g} s and each reading the table the previous one wrote: {parts}. Median bronze "
            f"{br['p50_s']:.1f} s → silver {s['p50_s']:.1f} s → gold {g['p50_s']:.1f} s: each hop adds its own trigger "
            "wait and micro-batch. "
            + dominant(stages))
    return lines


def dominant(stages: dict) -> str:
    if not stages:
        return ""
    name, s = max(stages.items(), key=lambda kv: kv[1]["mean_ms"].get("triggerExecution", 0))
    m = s["mean_ms"]
    phase = max(((k, v) for k, v in m.items() if k not in ("triggerExecution",) and not k.startswith("sink.")),
                key=lambda kv: kv[1], default=("?", 0))
    detail = f", mostly {phase[0]} ~{phase[1] / 1000:.1f} s" if phase[1] else ""  # silver/gold report no phases
    return (f"The longest micro-batches are {name}'s (~{m.get('triggerExecution', 0) / 1000:.1f} s{detail}): "
            "they set the pace of the chain.")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(title, result[key]) for title, key in (("bronze ingest", "bronze"),
                                                    ("bronze ingest, one record per record batch", "bronze_one_record"),
                                                    ("pipeline", "pipeline")) if result.get(key)]
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.2), squeeze=False)
    colors = {"bronze": "#2a7ab9", "silver": "#7f8c8d", "gold": "#d4a017"}
    for ax, (title, r) in zip(axes[0], runs):
        for table, points in r["series"].items():
            xs = [int(k) for k in points]
            ax.plot(xs, [v[0] for v in points.values()], color=colors[table], label=f"{table} p50")
            ax.plot(xs, [v[1] for v in points.values()], color=colors[table], linestyle=":", linewidth=0.8,
                    label=f"{table} max")
        if title.startswith("bronze"):
            ax.axhline(TARGET_P99_S, color="#c0392b", linestyle="--", linewidth=1, label="target p99 ≤ 3 s")
        ax.set_xlabel("second of the stream (produce time)")
        ax.set_ylabel("produce → visible (s)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary_lines(result: dict) -> list[str]:
    b = result["bronze"]["bronze"]
    a = result["bronze"]["bronze_after_ack"]
    lines = [f"latency produce → bronze: p50 {b['p50_s']:.2f} s, p95 {b['p95_s']:.2f} s, "
             + target_line("p99", b["p99_s"], TARGET_P99_S, " s", higher_is_better=False)
             + f" (from the broker's ack: p50 {a['p50_s']:.2f} s, p99 {a['p99_s']:.2f} s)"]
    if result.get("bronze_one_record"):
        o, oa = result["bronze_one_record"]["bronze"], result["bronze_one_record"]["bronze_after_ack"]
        lines.append(f"latency produce → bronze, one record per record batch (reported): p50 {o['p50_s']:.2f} s, "
                     f"p95 {o['p95_s']:.2f} s, p99 {o['p99_s']:.2f} s (from the broker's ack: p99 {oa['p99_s']:.2f} s)")
    if result.get("pipeline"):
        g = result["pipeline"]["gold"]
        lines.append(f"latency produce → gold (whole pipeline, no target): p50 {g['p50_s']:.2f} s, "
                     f"p95 {g['p95_s']:.2f} s, p99 {g['p99_s']:.2f} s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="records per second (default 2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the measured stream (default 60)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--trigger-s", type=float, default=1.0, help="processing-time trigger (default 1 s)")
    parser.add_argument("--poll-ms", type=int, default=50, help="how often the reader polls the tables")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--skip-one-record", action="store_true",
                        help="skip the bronze run whose producer writes one record per record batch")
    parser.add_argument("--skip-pipeline", action="store_true", help="bronze only")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    args.results.mkdir(parents=True, exist_ok=True)
    with private_broker(WORK) as bootstrap:
        progress("1/3 bronze ingest, processing-time trigger, the producer's own batching")
        bronze = run("bronze", bootstrap, args, "client-defaults")
        one_record = None
        if not args.skip_one_record:
            progress("2/3 bronze ingest, processing-time trigger, one record per record batch")
            one_record = run("bronze", bootstrap, args, "one-record")
        pipeline = None
        if not args.skip_pipeline:
            progress("3/3 whole pipeline (bronze -> silver -> gold), processing-time trigger, the producer's own batching")
            pipeline = run("pipeline", bootstrap, args, "client-defaults")
    result = {"params": {"rate": args.rate, "seconds": args.seconds, "partitions": args.partitions,
                         "value_bytes": args.value_bytes, "trigger_s": args.trigger_s, "poll_ms": args.poll_ms,
                         "master": args.master},
              "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "bronze": bronze,
              "bronze_one_record": one_record, "pipeline": pipeline,
              "targets": {"bronze_p99_s": TARGET_P99_S}}
    result["explanation"] = explain(result)
    result["summary"] = summary_lines(result)
    write_results(args.results, "latency", result, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
