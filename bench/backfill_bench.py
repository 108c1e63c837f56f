"""`make bench` (3/3): the cost of a backfill follows the hour it restates, not the table.

Builds two pipelines' tables of the same stream, one of N silver rows and one
of 4N (the same rate of events, so 4x the hours), directly with delta-rs in the
pipeline's schemas (:mod:`streamlake.pipeline.schemas`), as the stages would
have left them:

* **silver**: one commit per 10 minutes of *arrival* time (a micro-batch's
  worth), partitioned by ``event_date``; on-time events arrive when they
  happen, late events 2-15 minutes after (so a late event sits in a file of a
  later time, as it does in a real table);
* **gold**: per sensor and tumbling 1-minute window, count / exact sum / min /
  max of the on-time events, created the way the gold stage creates it, with
  its position in silver (everything consumed) and its watermark;
* **late_events**: the late events, pending (``applied = false``), one commit
  per 10 minutes of arrival.

Then times :func:`streamlake.pipeline.backfill.run_backfill` over the same one
hour of event time in both (restoring gold and late_events between runs;
several runs each, alternating sizes, after an untimed warm-up; the fastest
counts, the median is reported too). Target (issue 11): the 4N backfill costs
<= 1.5x the N one. It also reports how many silver files the backfill's
event-time pruning keeps (``files_overlapping`` on the ``event_time``
statistics of the ``add`` actions), which is what makes the cost follow the
hour. Writes bench/results/backfill.md, backfill.json and backfill.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, load, machine, progress, target_line, write_results  # noqa: E402

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "backfill"
TARGET_RATIO = 1.5
SENSORS = 64
PARTITIONS = 6
T0 = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
CHUNK_S = 600  # one silver/late_events commit per 10 minutes of arrival time
LATE_DELAY_S = (120, 900)
WINDOW = "tumbling:1m"


def build(root: Path, rows: int, rows_per_hour: int, late_per_hour: int, seed: int) -> dict:
    """silver, gold and late_events of ``rows`` silver rows at ``rows_per_hour``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    from streamlake.delta.table import ensure_table
    from streamlake.pipeline.gold import WATERMARK_APP_ID, ensure_gold
    from streamlake.pipeline.schemas import GOLD, LATE_EVENTS, SILVER, SUM_TYPE
    from streamlake.pipeline.stage import SourcePosition, position_app_id
    from streamlake.pipeline.windows import WindowSpec

    started = time.perf_counter()
    hours = rows // rows_per_hour
    on_time_per_hour = rows_per_hour - late_per_hour
    t0_us = int(T0.timestamp() * 1e6)
    hour_us = 3_600_000_000
    # Hour by hour, each from its own seed, so an hour holds the same events in both tables: on-time
    # events evenly spread (arriving when they happen), late ones at random times of the hour,
    # arriving 2-15 minutes later.
    parts = {k: [] for k in ("event", "arrival", "late", "sensor", "temp")}
    for h in range(hours):
        rng = np.random.default_rng([seed, h])
        on_t = t0_us + h * hour_us + (np.arange(on_time_per_hour, dtype=np.int64) * hour_us) // on_time_per_hour
        late_t = t0_us + h * hour_us + np.sort(rng.integers(0, hour_us, late_per_hour, dtype=np.int64))
        delay = rng.integers(LATE_DELAY_S[0] * 10**6, LATE_DELAY_S[1] * 10**6, late_per_hour, dtype=np.int64)
        parts["event"] += [on_t, late_t]
        parts["arrival"] += [on_t, late_t + delay]
        parts["late"] += [np.zeros(on_time_per_hour, bool), np.ones(late_per_hour, bool)]
        parts["sensor"] += [np.arange(on_time_per_hour) % SENSORS, rng.integers(0, SENSORS, late_per_hour)]
        parts["temp"] += [np.round(15 + rng.random(rows_per_hour) * 20, 1)]
    event_t, arrival, is_late, sensor_n, temps = (np.concatenate(parts[k]) for k in
                                                   ("event", "arrival", "late", "sensor", "temp"))
    order = np.argsort(arrival, kind="stable")
    event_t, arrival, is_late, sensor_n, temps = (a[order] for a in (event_t, arrival, is_late, sensor_n, temps))
    n = len(event_t)
    seq = np.arange(n, dtype=np.int64)
    partition = (sensor_n % PARTITIONS).astype(np.int32)
    offset = np.empty(n, dtype=np.int64)  # Kafka offsets: a running count per partition, in arrival order
    for p in range(PARTITIONS):
        where = np.nonzero(partition == p)[0]
        offset[where] = np.arange(len(where), dtype=np.int64)
    ts_type = pa.timestamp("us", tz="UTC")
    sensors = pc.binary_join_element_wise(pa.scalar("sensor-"), pc.utf8_lpad(pc.cast(pa.array(sensor_n), pa.string()),
                                                                            width=3, padding="0"), "")
    event_ids = pc.binary_join_element_wise(pa.scalar(f"ev{seed}-"), pc.cast(pa.array(event_t), pa.string()),
                                            pa.scalar("-"), pc.cast(pa.array(sensor_n), pa.string()), "")
    event_time = pa.array(event_t).cast(ts_type)
    table = pa.table({
        "event_id": event_ids, "sensor_id": sensors, "event_time": event_time, "temperature": pa.array(temps),
        "topic": pa.array(["bench"] * n, pa.string()), "partition": pa.array(partition),
        "offset": pa.array(offset), "kafka_timestamp": pa.array(arrival).cast(ts_type),
        "bronze_version": pa.array(arrival // (CHUNK_S * 10**6) - t0_us // (CHUNK_S * 10**6)),
        "event_date": pc.cast(event_time, pa.date32()),
    }, schema=SILVER.schema)
    silver, gold_path, late_path = root / "silver", root / "gold", root / "late_events"
    ensure_table(silver, SILVER)
    ensure_table(late_path, LATE_EVENTS)
    chunk = (arrival - t0_us) // (CHUNK_S * 10**6)
    bounds = np.searchsorted(chunk, np.arange(chunk[-1] + 2))
    wm_us = None
    late_rows = 0
    for k in range(len(bounds) - 1):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        if lo == hi:
            continue
        part = table.slice(lo, hi - lo)
        write_deltalake(str(silver), part, mode="append", partition_by=["event_date"])
        version = k + 1
        late_mask = pa.array(is_late[lo:hi])
        late = part.filter(late_mask)
        if late.num_rows:
            start_us = np.asarray(pc.cast(late.column("event_time"), pa.int64()))
            start_us = start_us - start_us % 60_000_000
            windows = pa.array([[{"start": int(s), "end": int(s) + 60_000_000}] for s in start_us],
                               pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64())])))
            windows = windows.cast(pa.list_(pa.struct([("start", ts_type), ("end", ts_type)])))
            arrived = int(arrival[hi - 1])
            wm = pa.scalar(arrived - 30_000_000 - 600_000_000, pa.int64()).cast(ts_type)
            late_table = pa.table({
                "event_id": late.column("event_id"), "sensor_id": late.column("sensor_id"),
                "event_time": late.column("event_time"), "temperature": late.column("temperature"),
                "topic": late.column("topic"), "partition": late.column("partition"), "offset": late.column("offset"),
                "watermark": pa.repeat(wm, late.num_rows), "windows": windows,
                "silver_version": pa.repeat(pa.scalar(version, pa.int64()), late.num_rows),
                "batch_id": pa.repeat(pa.scalar(k, pa.int64()), late.num_rows),
                "arrived_at": pa.repeat(pa.scalar(arrived, pa.int64()).cast(ts_type), late.num_rows),
                "applied": pa.repeat(pa.scalar(False), late.num_rows),
                "applied_at": pa.nulls(late.num_rows, ts_type), "applied_by": pa.nulls(late.num_rows, pa.string()),
                "event_date": late.column("event_date"),
            }, schema=LATE_EVENTS.schema)
            write_deltalake(str(late_path), late_table, mode="append", partition_by=["event_date"])
            late_rows += late.num_rows
        wm_us = int(arrival[hi - 1]) // 1000 - 30_000
    silver_version = ensure_table(silver, SILVER).version()
    # Gold: on-time events only (the stream kept the late ones apart), per sensor and 1-minute window.
    on = table.filter(pa.array(~is_late))
    wstart = pc.subtract(pc.cast(on.column("event_time"), pa.int64()),
                         pc.cast(pa.array(np.asarray(pc.cast(on.column("event_time"), pa.int64())) % 60_000_000),
                                 pa.int64()))
    keyed = pa.table({"sensor_id": on.column("sensor_id"), "w": wstart,
                      "t": pc.cast(on.column("temperature"), SUM_TYPE), "temperature": on.column("temperature")})
    agg = keyed.group_by(["sensor_id", "w"]).aggregate([("t", "sum"), ("temperature", "count"),
                                                        ("temperature", "min"), ("temperature", "max")])
    count = agg.column("temperature_count")
    total = pc.cast(agg.column("t_sum"), SUM_TYPE)
    now = pa.repeat(pa.scalar(int(time.time() * 1e6), pa.int64()).cast(ts_type), agg.num_rows)
    ws = agg.column("w").cast(ts_type)
    gold = pa.table({
        "sensor_id": agg.column("sensor_id"), "window_start": ws,
        "window_end": pc.add(agg.column("w"), 60_000_000).cast(ts_type), "count": count,
        "sum_temperature": total, "min_temperature": agg.column("temperature_min"),
        "max_temperature": agg.column("temperature_max"),
        "avg_temperature": pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64())),
        "updated_at": now, "window_date": pc.cast(ws, pa.date32()),
    }, schema=GOLD.schema).sort_by([("window_start", "ascending"), ("sensor_id", "ascending")])
    ensure_gold(str(gold_path), WindowSpec.parse(WINDOW))
    position = SourcePosition(silver_version + 1, False, -1).encode()  # gold holds silver versions <= silver_version
    per_hour = gold.num_rows // max(1, hours)
    for h in range(hours):
        part = gold.slice(h * per_hour, per_hour if h < hours - 1 else gold.num_rows - h * per_hour)
        props = None
        if h == hours - 1:
            props = CommitProperties(app_transactions=[Transaction(position_app_id("silver"), position),
                                                       Transaction(WATERMARK_APP_ID, wm_us)])
        write_deltalake(str(gold_path), part, mode="append", partition_by=["window_date"], commit_properties=props)
    return {"rows": n, "hours": hours, "late_events": late_rows, "silver_version": silver_version,
            "gold_rows": gold.num_rows, "seconds": round(time.perf_counter() - started, 1)}


def pruning(root: Path, start: dt.datetime, end: dt.datetime) -> dict:
    """What the backfill's event-time pruning keeps, from the add actions' statistics."""
    import pyarrow as pa

    from streamlake.delta.table import files_overlapping, open_table

    out = {}
    margin = dt.timedelta(minutes=1)  # a window of the hour's edge reaches one window size out
    for name in ("silver", "late_events"):
        table = open_table(root / name)
        actions = pa.table(table.get_add_actions(flatten=True))
        has = [c for c in ("min.event_time", "max.event_time") if c in actions.column_names]
        with_stats = sum(1 for v in actions.column("min.event_time").to_pylist() if v is not None) if has else 0
        kept = files_overlapping(table, "event_time", start - margin, end + margin)
        out[name] = {"files": actions.num_rows, "files_with_event_time_stats": with_stats, "files_kept": len(kept)}
    return out


def restore(root: Path, pristine: Path) -> None:
    for name in ("gold", "late_events"):
        shutil.rmtree(root / name, ignore_errors=True)
        shutil.copytree(pristine / name, root / name)


def timed_backfill(spark, root: Path, start: dt.datetime, end: dt.datetime) -> dict:
    from streamlake.pipeline.backfill import PipelinePaths, run_backfill
    from streamlake.pipeline.windows import WindowSpec

    before = load()
    started = time.perf_counter()
    result = run_backfill(spark, PipelinePaths.of(str(root)), WindowSpec.parse(WINDOW), start, end)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "late_events": result.late_events, "windows": result.windows,
            "changed": result.changed_windows, "load": [before, load()]}


def markdown(result: dict) -> str:
    p = result["params"]
    out = [
        "# Backfill cost: restating one hour on silver of N and 4N rows",
        "",
        f"Silver of N = {p['rows']:,} and 4N = {4 * p['rows']:,} rows ({p['rows_per_hour']:,} events per hour, "
        f"{p['late_per_hour']:,} of them late, 2-15 min; so {result['sizes']['N']['hours']} and "
        f"{result['sizes']['4N']['hours']} hours), built with delta-rs in the pipeline's schemas: one silver and "
        "late_events commit per 10 minutes of arrival, gold per sensor and tumbling 1-minute window of the on-time "
        f"events. The backfill restates event time [{result['range'][0]}, {result['range'][1]}) in both; "
        f"`run_backfill` (Spark `{p['master']}`), {p['runs']} runs per size alternating, after a warm-up run; "
        f"gold and late_events restored between runs. {result['machine']}; {result['date']}.",
        "",
        "| silver | rows | hours | silver files | kept by event-time pruning | late_events files (kept) | "
        "late events restated | windows | fastest | median | runs | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name in ("N", "4N"):
        s = result["sizes"][name]
        pr, runs = s["pruning"], s["runs"]
        out.append(f"| {name} | {s['rows']:,} | {s['hours']} | {pr['silver']['files']} | {pr['silver']['files_kept']} "
                   f"| {pr['late_events']['files']} ({pr['late_events']['files_kept']}) | {runs[0]['late_events']:,} | "
                   f"{runs[0]['windows']:,} | {s['fastest_s']:.2f} s | {s['median_s']:.2f} s | "
                   + ", ".join(f"{r['seconds']:.2f}" for r in runs)
                   + f" | {min(r['load'][0] for r in runs):.1f}–{max(r['load'][1] for r in runs):.1f} |")
    out += [
        "",
        "Target (issue 11): " + target_line("4N / N backfill cost (fastest runs)", result["ratio"], TARGET_RATIO, "×",
                                            higher_is_better=False)
        + f"; medians: {result['median_ratio']:.2f}×.",
        "",
        "**Pruning**: every silver `add` action carries min/max `event_time` statistics "
        f"({result['sizes']['4N']['pruning']['silver']['files_with_event_time_stats']} of "
        f"{result['sizes']['4N']['pruning']['silver']['files']} files in 4N); the backfill reads silver (Spark, "
        "`streamlake.delta.table.files_overlapping`) and the pending late events (pyarrow) only from files whose "
        "range overlaps the restated windows, so both sizes read the same files: the hour, plus the later "
        "files its late events arrived in. Without the statistics it would read every file, 4× as many in 4N.",
        "",
        "![backfill](backfill.png)",
        "",
    ]
    return "\n".join(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["N", "4N"]
    for i, name in enumerate(names):
        runs = [r["seconds"] for r in result["sizes"][name]["runs"]]
        left.scatter([i] * len(runs), runs, color="#2a7ab9", alpha=0.6)
        left.bar(i, result["sizes"][name]["fastest_s"], color="#8fbde0", width=0.5)
    left.axhline(TARGET_RATIO * result["sizes"]["N"]["fastest_s"], color="#c0392b", linestyle="--", linewidth=1,
                 label="1.5 × N")
    left.set_xticks(range(2), [f"{n}\n{result['sizes'][n]['rows']:,} rows" for n in names])
    left.set_ylabel("backfill seconds (bars: fastest, dots: runs)")
    left.legend(fontsize=8)
    files = [result["sizes"][n]["pruning"]["silver"]["files"] for n in names]
    kept = [result["sizes"][n]["pruning"]["silver"]["files_kept"] for n in names]
    right.bar([0, 1], files, color="#cccccc", label="silver files")
    right.bar([0, 1], kept, color="#2a7ab9", label="kept by event-time pruning")
    right.set_xticks(range(2), names)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary_lines(result: dict) -> list[str]:
    return [target_line("backfill cost 4N / N", result["ratio"], TARGET_RATIO, "×", higher_is_better=False)
            + f" (N {result['sizes']['N']['fastest_s']:.2f} s, 4N {result['sizes']['4N']['fastest_s']:.2f} s)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="N: silver rows of the smaller table")
    parser.add_argument("--rows-per-hour", type=int, default=200_000)
    parser.add_argument("--late-per-hour", type=int, default=1_000)
    parser.add_argument("--hour", type=int, default=2, help="which hour (from the start) to restate")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    args.results.mkdir(parents=True, exist_ok=True)
    start = T0 + dt.timedelta(hours=args.hour)
    end = start + dt.timedelta(hours=1)
    sizes = {"N": args.rows, "4N": 4 * args.rows}
    built = {}
    for name, rows in sizes.items():
        progress(f"building silver/gold/late_events of {rows:,} rows ({name})")
        built[name] = build(WORK / name / "lake", rows, args.rows_per_hour, args.late_per_hour, seed=7)
        shutil.copytree(WORK / name / "lake", WORK / name / "pristine", ignore=shutil.ignore_patterns("silver"))
        built[name]["pruning"] = pruning(WORK / name / "lake", start, end)
        progress(f"  {built[name]}")
    from streamlake.spark.session import get_spark

    spark = get_spark("backfill-bench", master=args.master, conf={"spark.ui.enabled": "false"})
    progress("warm-up backfill (not timed)")
    timed_backfill(spark, WORK / "N" / "lake", start, end)
    runs = {name: [] for name in sizes}
    for i in range(args.runs):
        for name in (sizes if i % 2 == 0 else list(sizes)[::-1]):
            restore(WORK / name / "lake", WORK / name / "pristine")
            r = timed_backfill(spark, WORK / name / "lake", start, end)
            runs[name].append(r)
            progress(f"  backfill {name}: {r}")
    spark.stop()
    result = {"params": {"rows": args.rows, "rows_per_hour": args.rows_per_hour, "late_per_hour": args.late_per_hour,
                         "hour": args.hour, "runs": args.runs, "master": args.master},
              "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "range": [start.isoformat(), end.isoformat()], "sizes": {}}
    for name in sizes:
        secs = [r["seconds"] for r in runs[name]]
        result["sizes"][name] = {**built[name], "runs": runs[name], "fastest_s": min(secs),
                                 "median_s": statistics.median(secs)}
    result["ratio"] = round(result["sizes"]["4N"]["fastest_s"] / result["sizes"]["N"]["fastest_s"], 3)
    result["median_ratio"] = round(result["sizes"]["4N"]["median_s"] / result["sizes"]["N"]["median_s"], 3)
    result["targets"] = {"ratio": TARGET_RATIO}
    result["summary"] = summary_lines(result)
    write_results(args.results, "backfill", result, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
