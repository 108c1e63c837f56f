"""`make bench` (3/3): the cost of a backfill follows the hour it restates, not the table.

Builds the tables of two runs of the demo pipeline (the sensors definition,
pipelines/sensors.yaml, and its ``per_minute`` aggregate: per sensor and
tumbling 1-minute window, 30 s of allowed lateness), one of N silver rows and
one of 4N (the same rate of events, so 4x the hours), directly with delta-rs in
the schemas the definition gives (:mod:`streamlake.pipeline.schemas`), as the
stages would have left them:

* **silver**: one commit per 10 minutes of *arrival* time (a micro-batch's
  worth), partitioned by ``event_date``, with lineage and its position in
  bronze; most events arrive when they happen, ``--late-per-hour`` of them 2-15
  minutes after (so they sit in a file of a later time, as in a real table);
* **gold/per_minute**: one gold micro-batch per silver commit, each with the
  watermark as of its start (newest on-time event time minus the allowed
  lateness): the on-time events aggregated per sensor and window with the
  bookkeeping columns (``_events``, ``_sum_``/``_count_`` of the average;
  :func:`streamlake.pipeline.gold.gold_row`), created as the gold stage creates
  it, its position in silver (everything consumed) and its watermark as ``txn``s;
* **late_events/per_minute**: the events behind the watermark of their batch,
  pending (``applied = false``) with the watermark they missed and their window,
  one commit per gold batch that had some.

Then times :func:`streamlake.pipeline.backfill.run_backfill` of ``per_minute``
over the same one hour of event time in both (restoring gold and late_events
between runs; several runs each, alternating sizes, after an untimed warm-up;
the fastest counts, the median is reported too). Target (issue 11): the 4N
backfill costs <= 1.5x the N one. It also reports how many silver files the
backfill's event-time pruning keeps (``files_overlapping`` on the
``event_time`` statistics of the ``add`` actions), which is what makes the cost
follow the hour. Writes bench/results/backfill.md, backfill.json and
backfill.png.
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
DEFINITION = HERE.parent / "pipelines" / "sensors.yaml"
AGGREGATE = "per_minute"
TARGET_RATIO = 1.5
SENSORS = 64
PARTITIONS = 6
T0 = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
CHUNK_US = 600 * 10**6  # one silver commit (and gold batch) per 10 minutes of arrival time
LATE_DELAY_S = (120, 900)


def sensors():
    """The sensors definition and its ``per_minute`` aggregate."""
    from streamlake.pipeline.definition import load_definition

    definition = load_definition(DEFINITION)
    return definition, definition.aggregate(AGGREGATE)


def consumed(source: str, version: int, extra: dict[str, int] | None = None):
    """Commit properties of a stage that has consumed ``source`` through ``version`` (its position ``txn``)."""
    from deltalake.transaction import CommitProperties, Transaction

    from streamlake.pipeline.stage import SourcePosition, position_app_id

    txns = [Transaction(position_app_id(source), SourcePosition(version + 1, False, -1).encode())]
    return CommitProperties(app_transactions=txns + [Transaction(k, v) for k, v in (extra or {}).items()])


def gold_batches(agg, event_t, wend, bounds):
    """Gold's micro-batches, one per silver commit (``bounds``): an event whose window ends at
    or before the watermark as of its batch's start is late; the batch's on-time events move the
    watermark (ms). Returns (late or not, the watermark each late event missed in µs, last watermark)."""
    import numpy as np

    is_late, missed = np.zeros(len(event_t), bool), np.zeros(len(event_t), np.int64)
    wm = None
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if wm is not None:
            is_late[lo:hi] = wend[lo:hi] <= wm * 1000
            missed[lo:hi] = wm * 1000
        on = event_t[lo:hi][~is_late[lo:hi]]
        if on.size:
            newest = int(on.max()) // 1000 - agg.allowed_lateness_ms
            wm = newest if wm is None else max(wm, newest)
    return is_late, missed, wm


def gold_rows(d, agg, on) -> list[dict]:
    """Gold rows of the on-time events ``on`` (``sensor_id``, window start ``w`` in µs, ``temperature``):
    their partials per sensor and window, combined as the gold stage combines them."""
    import pyarrow.compute as pc

    from streamlake.pipeline.gold import gold_row
    from streamlake.pipeline.schemas import EVENTS_COLUMN

    assert all(m.field in (None, "temperature") for m in agg.measures)
    size_us = agg.window.size_ms * 1000
    on = on.append_column("s", pc.cast(on.column("temperature"), d.field("temperature").type.sum_type.arrow))
    stats = on.group_by(["sensor_id", "w"]).aggregate([("temperature", "count"), ("s", "sum"),
                                                       ("temperature", "min"), ("temperature", "max")])
    column = {"count": "temperature_count", "sum": "s_sum", "min": "temperature_min", "max": "temperature_max"}
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for r in stats.to_pylist():
        partial = {EVENTS_COLUMN: r["temperature_count"]}
        for m in agg.measures:
            if m.function == "avg":
                partial |= {f"_sum_{m.column}": r["s_sum"], f"_count_{m.column}": r["temperature_count"]}
            else:
                partial[m.column] = r[column[m.function]]
        out.append(gold_row(d, agg, (r["sensor_id"],), r["w"], r["w"] + size_us, [partial], now))
    return out


def build(root: Path, rows: int, rows_per_hour: int, late_per_hour: int, seed: int) -> dict:
    """silver, gold and late_events of ``rows`` silver rows at ``rows_per_hour``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    from streamlake.delta.table import ensure_table
    from streamlake.pipeline.gold import WATERMARK_APP_ID, ensure_gold
    from streamlake.pipeline.schemas import TS, WINDOW_TYPE, gold_spec, late_spec, silver_spec

    d, agg = sensors()
    started = time.perf_counter()
    hours = rows // rows_per_hour
    on_time_per_hour = rows_per_hour - late_per_hour
    t0_us = int(T0.timestamp() * 1e6)
    hour_us = 3_600_000_000
    # Hour by hour, each from its own seed, so an hour holds the same events in both tables: most
    # events evenly spread (arriving when they happen), the others at random times of the hour,
    # arriving 2-15 minutes later.
    parts = {k: [] for k in ("event", "arrival", "sensor", "temp")}
    for h in range(hours):
        rng = np.random.default_rng([seed, h])
        on_t = t0_us + h * hour_us + (np.arange(on_time_per_hour, dtype=np.int64) * hour_us) // on_time_per_hour
        late_t = t0_us + h * hour_us + np.sort(rng.integers(0, hour_us, late_per_hour, dtype=np.int64))
        delay = rng.integers(LATE_DELAY_S[0] * 10**6, LATE_DELAY_S[1] * 10**6, late_per_hour, dtype=np.int64)
        parts["event"] += [on_t, late_t]
        parts["arrival"] += [on_t, late_t + delay]
        parts["sensor"] += [np.arange(on_time_per_hour) % SENSORS, rng.integers(0, SENSORS, late_per_hour)]
        parts["temp"] += [np.round(15 + rng.random(rows_per_hour) * 10, 2)]
    event_t, arrival, sensor_n, temps = (np.concatenate(parts[k]) for k in ("event", "arrival", "sensor", "temp"))
    order = np.argsort(arrival, kind="stable")
    event_t, arrival, sensor_n, temps = (a[order] for a in (event_t, arrival, sensor_n, temps))
    n = len(event_t)
    size_us = agg.window.size_ms * 1000
    wstart = event_t - event_t % size_us
    bounds = np.append(np.unique((arrival - t0_us) // CHUNK_US, return_index=True)[1], n)  # silver commits
    batches = len(bounds) - 1
    batch = np.repeat(np.arange(batches), np.diff(bounds))
    is_late, missed, wm = gold_batches(agg, event_t, wstart + size_us, bounds)
    partition = (sensor_n % PARTITIONS).astype(np.int32)
    offset = np.empty(n, dtype=np.int64)  # Kafka offsets: a running count per partition, in arrival order
    for p in range(PARTITIONS):
        where = np.nonzero(partition == p)[0]
        offset[where] = np.arange(len(where), dtype=np.int64)
    sensor_ids = pc.binary_join_element_wise(
        "sensor-", pc.utf8_lpad(pc.cast(pa.array(sensor_n), pa.string()), width=2, padding="0"), "")
    event_ids = pc.binary_join_element_wise(f"ev{seed}-", pc.cast(pa.array(event_t), pa.string()), "-",
                                            pc.cast(pa.array(sensor_n), pa.string()), "")
    event_time = pa.array(event_t).cast(TS)
    table = pa.table({
        "event_id": event_ids, "sensor_id": sensor_ids, "event_time": event_time, "temperature": pa.array(temps),
        "topic": pa.array([d.topics[0]] * n, pa.string()), "partition": pa.array(partition),
        "offset": pa.array(offset), "kafka_timestamp": pa.array(arrival).cast(TS),
        "bronze_version": pa.array(batch + 1), "event_date": pc.cast(event_time, pa.date32()),
    }, schema=silver_spec(d).schema)
    # late_events: the silver rows behind the watermark, with the watermark, their window and batch.
    lmask = pa.array(is_late)
    late = table.select([*d.field_names, "topic", "partition", "offset", "event_date"]).filter(lmask)
    nl = late.num_rows
    window = pa.StructArray.from_arrays([pa.array(wstart).cast(TS), pa.array(wstart + size_us).cast(TS)],
                                        fields=list(WINDOW_TYPE)).filter(lmask)
    late_batch = batch[is_late]
    late = pa.table({
        **{name: late.column(name) for name in late.column_names},
        "watermark": pa.array(missed[is_late]).cast(TS),
        "windows": pa.ListArray.from_arrays(pa.array(np.arange(nl + 1, dtype=np.int32)), window),
        "silver_version": pa.array(late_batch + 1), "batch_id": pa.array(late_batch),
        "arrived_at": pa.array(arrival[bounds[1:] - 1][late_batch]).cast(TS),  # the batch's time: its last arrival
        "applied": pa.repeat(False, nl), "applied_at": pa.nulls(nl, TS), "applied_by": pa.nulls(nl, pa.string()),
    }, schema=late_spec(d, agg).schema)
    silver, gold_path, late_path = root / "silver", root / agg.gold_table, root / agg.late_table
    ensure_table(silver, silver_spec(d))
    ensure_table(late_path, late_spec(d, agg))
    late_bounds = np.searchsorted(late_batch, np.arange(batches + 1))
    for b in range(batches):
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        write_deltalake(str(silver), table.slice(lo, hi - lo), mode="append", partition_by=["event_date"],
                        commit_properties=consumed("bronze", b + 1))
        lo, hi = int(late_bounds[b]), int(late_bounds[b + 1])
        if hi > lo:
            write_deltalake(str(late_path), late.slice(lo, hi - lo), mode="append", partition_by=["event_date"],
                            commit_properties=consumed("silver", b + 1))
    silver_version = ensure_table(silver, silver_spec(d)).version()
    assert silver_version == batches, (silver_version, batches)
    on = pa.table({"sensor_id": table.column("sensor_id"), "w": pa.array(wstart),
                   "temperature": table.column("temperature")}).filter(pa.array(~is_late))
    gold = pa.Table.from_pylist(gold_rows(d, agg, on), schema=gold_spec(d, agg).schema).sort_by(
        [("window_start", "ascending"), ("sensor_id", "ascending")])
    ensure_gold(str(gold_path), d, agg)
    per_hour = gold.num_rows // max(1, hours)
    for h in range(hours):
        part = gold.slice(h * per_hour, per_hour if h < hours - 1 else gold.num_rows - h * per_hour)
        props = consumed("silver", silver_version, {WATERMARK_APP_ID: wm}) if h == hours - 1 else None
        write_deltalake(str(gold_path), part, mode="append", partition_by=["window_date"], commit_properties=props)
    return {"rows": n, "hours": hours, "late_events": nl, "silver_version": silver_version,
            "gold_rows": gold.num_rows, "seconds": round(time.perf_counter() - started, 1)}


def pruning(root: Path, start: dt.datetime, end: dt.datetime) -> dict:
    """What the backfill's event-time pruning keeps, from the add actions' statistics."""
    import pyarrow as pa

    from streamlake.delta.table import files_overlapping, open_table

    _, agg = sensors()
    out = {}
    margin = dt.timedelta(minutes=1)  # a window of the hour's edge reaches one window size out
    for name, path in (("silver", "silver"), ("late_events", agg.late_table)):
        table = open_table(root / path)
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
    from streamlake.pipeline.backfill import AggregatePaths, run_backfill

    d, agg = sensors()
    before = load()
    started = time.perf_counter()
    result = run_backfill(spark, d, agg, AggregatePaths.of(str(root), agg), start, end)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "late_events": result.late_events, "windows": result.windows,
            "changed": result.changed_windows, "load": [before, load()]}


def markdown(result: dict) -> str:
    p = result["params"]
    out = [
        "# Backfill cost: restating one hour on silver of N and 4N rows",
        "",
        f"Silver of N = {p['rows']:,} and 4N = {4 * p['rows']:,} rows ({p['rows_per_hour']:,} events per hour, "
        f"{p['late_per_hour']:,} of them arriving 2-15 min after their event time; so "
        f"{result['sizes']['N']['hours']} and {result['sizes']['4N']['hours']} hours) of the sensors pipeline "
        "(pipelines/sensors.yaml), built with delta-rs in its schemas: one silver commit and gold batch per 10 "
        f"minutes of arrival, gold `{AGGREGATE}` (per sensor and tumbling 1-minute window, 30 s allowed lateness) "
        "of the on-time events, the events behind the watermark of their batch pending in its late_events "
        f"({result['sizes']['N']['late_events']:,} in N, {result['sizes']['4N']['late_events']:,} in 4N). "
        f"The backfill restates event time [{result['range'][0]}, {result['range'][1]}) in both; "
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
    parser.add_argument("--late-per-hour", type=int, default=1_000,
                        help="events per hour arriving 2-15 min late (those behind the watermark: late events)")
    parser.add_argument("--hour", type=int, help="which hour (from the start) to restate (default: N's middle one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    hours = args.rows // args.rows_per_hour
    if args.hour is None:
        args.hour = (hours - 1) // 2  # an hour N and 4N hold alike (N's last one is not: 4N goes on)
    if not 0 <= args.hour < hours:
        parser.error(f"--hour must be one of N's {hours} hour(s): 0 to {hours - 1}")
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
