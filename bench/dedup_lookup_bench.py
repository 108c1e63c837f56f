"""Silver's de-duplication lookup as silver grows: the stage's, and reading every id of the horizon.

Every micro-batch of a pipeline with an ``event_id`` asks whether silver already holds
one of its ids with an event time within ``dedup_horizon`` of its own
(``SilverStage._known_in_silver``). Silver grows by ``--files`` appends of ``--rows``
events (one event date, compacted as the stage compacts after its batches); after each
append the stage looks up a micro-batch of ``--lookup`` ids (half of them in silver),
the way it does in a pipeline: with its per-file id hashes
(:mod:`streamlake.pipeline.event_ids`), which read each new file's ids once. At each
checkpoint the same lookup also runs the way it ran before those hashes, reading the id
and event-time columns of every file in the horizon, ``--repeat`` times (the median is
reported), and once by a new stage (a process's first lookup, which reads every file's
ids). Both answers are checked against the ids the bench wrote. No Spark: the lookup and
the compaction are delta-rs and pyarrow on the driver.

    .venv/bin/python bench/dedup_lookup_bench.py [--files 1000] [--rows 2000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "include"))
sys.path.insert(0, str(HERE))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from common import RESULTS, load, machine, progress, rewrite_results, write_results  # noqa: E402
from streamlake.delta.table import (  # noqa: E402
    COMPACT_AFTER_SMALL_FILES, compact_small_files, files_overlapping, open_table, parquet_dataset)
from streamlake.pipeline.definition import load_definition  # noqa: E402
from streamlake.pipeline.silver import SilverStage, ensure_silver, from_micros  # noqa: E402

NAME = "dedup_lookup"
DAY = dt.datetime(2026, 12, 7, tzinfo=dt.timezone.utc)


def batch_rows(spec, first: int, rows: int) -> pa.Table:
    """``rows`` silver events with ids ``e<first>``..., event times spread over one day."""
    ids = range(first, first + rows)
    times = [DAY + dt.timedelta(seconds=(i * 7) % 86_000) for i in ids]
    return pa.table({
        "event_id": [f"e{i}" for i in ids], "sensor_id": [f"s{i % 50}" for i in ids], "event_time": times,
        "temperature": [20.0 + i % 10 for i in ids], "topic": ["sensors"] * rows,
        "partition": pa.array([i % 6 for i in ids], pa.int32()), "offset": list(ids),
        "kafka_timestamp": times, "bronze_version": [first // rows + 1] * rows,
        "event_date": pa.array([DAY.date()] * rows, pa.date32()),
    }, schema=spec.schema)


def lookup_ids(known: int, recent: int, count: int, salt: int) -> pa.Table:
    """``count`` candidates (columns event_id, t): every other one a resend of one of the
    ``recent`` events silver received last (of ``known``), the others new ids."""
    recent = min(recent, known)
    picks = [(f"e{known - 1 - (i * 7919 + salt) % recent}" if i % 2 else f"new{salt}-{i}", (i * 7) % 86_000)
             for i in range(count)]
    micros = int(DAY.timestamp() * 1_000_000)
    return pa.table({"event_id": [p[0] for p in picks],
                     "t": pa.array([micros + p[1] * 1_000_000 for p in picks], pa.int64())})


def read_every_id(stage: SilverStage, table, spec, events: pa.Table) -> set[str]:
    """The lookup as it ran before the per-file id hashes: the id and event-time columns of
    every file in the horizon, filtered to the batch's ids."""
    d, horizon = stage.definition, stage.dedup_horizon_us
    low, high = pc.min(events.column("t")).as_py(), pc.max(events.column("t")).as_py()
    files = files_overlapping(table, d.event_time, from_micros(low - horizon), from_micros(high + horizon))
    found = parquet_dataset(files, spec.file_schema).to_table(columns=[d.event_id, d.event_time])
    found = found.filter(pc.is_in(found.column(d.event_id), events.column("event_id")))
    return set(found.column(d.event_id).to_pylist())


def expected_known(candidates: pa.Table) -> set[str]:
    return {i for i in candidates.column("event_id").to_pylist() if i.startswith("e")}


def measure(args) -> dict:
    definition = load_definition(HERE.parent / "pipelines" / "sensors.yaml")
    work = HERE / "work" / NAME
    shutil.rmtree(work, ignore_errors=True)
    path = str(work / "silver")
    stage = SilverStage(definition, str(work / "bronze"), path, str(work / "quarantine"), str(work / "ck"))
    spec = ensure_silver(path, definition)[1]
    checkpoints = sorted({c for c in (10, 50, 100, 250, 500, 750, 1000, args.files) if c <= args.files})
    points, compaction_s, compactions, stage_s = [], 0.0, 0, []
    for n in range(1, args.files + 1):
        write_deltalake(path, batch_rows(spec, (n - 1) * args.rows, args.rows), mode="append")
        table = open_table(path)  # the stage has it open after its commit
        started = time.perf_counter()
        if compact_small_files(table) is not None:
            compactions += 1
            table = open_table(path)
        compaction_s += time.perf_counter() - started
        candidates = lookup_ids(n * args.rows, args.resent_from * args.rows, args.lookup, salt=n)
        started = time.perf_counter()
        known = stage._known_in_silver(candidates, table, spec)
        stage_s.append(time.perf_counter() - started)
        assert known == expected_known(candidates), (n, len(known))  # every known id, no other
        if n in checkpoints:
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                every = read_every_id(stage, table, spec, candidates)
                times.append(time.perf_counter() - started)
            assert every == known
            fresh = SilverStage(definition, stage.bronze_path, path, stage.quarantine_path, stage.checkpoint)
            started = time.perf_counter()
            assert fresh._known_in_silver(candidates, table, spec) == known
            first_s = time.perf_counter() - started
            recent = stage_s[-min(10, len(stage_s)):]
            point = {"appends": n, "ids": n * args.rows, "files": len(table.file_uris()),
                     "stage_lookup_s": round(statistics.median(recent), 4),
                     "read_every_id_s": round(statistics.median(times), 4), "first_lookup_s": round(first_s, 3),
                     "hashes_kept": stage.id_hashes.ids_held()}
            points.append(point)
            progress(f"{n} appends, {point['ids']:,} ids in {point['files']} files: the stage's lookup "
                     f"{point['stage_lookup_s']:.4f} s, reading every id {point['read_every_id_s']:.3f} s")
    return {"machine": machine(), "load_at_end": round(load(), 2), "at": dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"), "rows_per_append": args.rows, "lookup_ids": args.lookup, "resent_from": args.resent_from,
        "repeat": args.repeat,
        "compact_after_small_files": COMPACT_AFTER_SMALL_FILES, "points": points, "compactions": compactions,
        "compaction_s": round(compaction_s, 2)}


def finish(result: dict) -> None:
    first, last = result["points"][0], result["points"][-1]
    result["summary"] = [
        f"a micro-batch's lookup of {result['lookup_ids']} ids (median of the last 10 appends): "
        f"{first['stage_lookup_s'] * 1000:.1f} ms with {first['ids']:,} ids in silver, "
        f"{last['stage_lookup_s'] * 1000:.1f} ms with {last['ids']:,}; reading every id of the horizon, as "
        f"before the per-file id hashes: {first['read_every_id_s'] * 1000:.1f} ms and "
        f"{last['read_every_id_s'] * 1000:.1f} ms",
        f"the id hashes kept: {last['hashes_kept']:,} ({last['hashes_kept'] * 8 / 2**20:.0f} MiB); a process's "
        f"first lookup, which reads every file's ids: {last['first_lookup_s']:.2f} s",
        f"the stage's compactions: {result['compactions']}; with the check after every append "
        f"{result['compaction_s']:.1f} s in all ({result['compaction_s'] / last['appends'] * 1000:.1f} ms "
        f"per append on average)",
    ]


def markdown(result: dict) -> str:
    lines = [f"# Silver's de-duplication lookup as silver grows ({result['at'][:10]})", "",
             f"`bench/dedup_lookup_bench.py`: {result['machine']}; load {result['load_at_end']} at the end. "
             f"Appends of {result['rows_per_append']} events each (one event date, compacted as the stage does), "
             f"after each a lookup of {result['lookup_ids']} ids (half of them resends of events of the last "
             f"{result['resent_from']} appends). The stage's lookup: the median "
             f"of the last 10 appends' (each reads the new files' ids once); reading every id of the horizon "
             f"(the lookup before the per-file id hashes): the median of {result['repeat']}.", "",
             "| appends | ids in silver | files | the stage's lookup | reading every id | a process's first lookup |",
             "|---:|---:|---:|---:|---:|---:|"]
    for p in result["points"]:
        lines.append(f"| {p['appends']} | {p['ids']:,} | {p['files']} | {p['stage_lookup_s'] * 1000:.1f} ms | "
                     f"{p['read_every_id_s'] * 1000:.1f} ms | {p['first_lookup_s']:.2f} s |")
    return "\n".join(lines + [""] + [f"- {s}" for s in result["summary"]]) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ids = [p["ids"] / 1e6 for p in result["points"]]
    ax.plot(ids, [p["read_every_id_s"] * 1000 for p in result["points"]], marker="o",
            label="reading every id of the horizon (before)")
    ax.plot(ids, [p["stage_lookup_s"] * 1000 for p in result["points"]], marker="o",
            label="the stage's lookup (per-file id hashes)")
    ax.set_xlabel("ids in silver's horizon, millions")
    ax.set_ylabel(f"lookup of {result['lookup_ids']} ids, ms")
    ax.set_title("Silver's de-duplication lookup as silver grows")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="appends (micro-batches) to grow silver by")
    parser.add_argument("--rows", type=int, default=2000, help="events per append")
    parser.add_argument("--lookup", type=int, default=200, help="ids a micro-batch looks up")
    parser.add_argument("--resent-from", type=int, default=5,
                        help="the duplicates looked up resend events of this many last appends")
    parser.add_argument("--repeat", type=int, default=5,
                        help="lookups reading every id per checkpoint (the median is reported)")
    parser.add_argument("--render", action="store_true", help="the .md and .png again from the .json")
    args = parser.parse_args()
    if args.render:
        return rewrite_results(RESULTS, NAME, finish, markdown, plot)
    result = measure(args)
    finish(result)
    write_results(RESULTS, NAME, result, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
