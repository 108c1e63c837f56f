"""Silver's de-duplication lookup as silver grows: without compaction, and with the stage's.

Every micro-batch of a pipeline with an ``event_id`` looks its ids up in the silver
files whose event time lies within ``dedup_horizon`` of the batch's
(``SilverStage._known_in_silver``), and every micro-batch adds a file per event date
it touches. Two silver tables of the demo definition grow side by side by the same
appends (``--rows`` events each, one event date): one is never compacted, the other
is compacted as the silver stage does after its batches (``compact_small_files``,
more than ``COMPACT_AFTER_SMALL_FILES`` small files). At each checkpoint the same
lookup of ``--lookup`` ids (half of them in silver) runs on both, ``--repeat`` times;
the median is reported, with the seconds the compactions took. No Spark: the lookup
and the compaction are delta-rs and pyarrow on the driver.

    .venv/bin/python bench/dedup_lookup_bench.py [--files 2000] [--rows 100]
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
from deltalake import write_deltalake  # noqa: E402

from common import RESULTS, load, machine, progress, rewrite_results, write_results  # noqa: E402
from streamlake.delta.table import COMPACT_AFTER_SMALL_FILES, compact_small_files, open_table  # noqa: E402
from streamlake.pipeline.definition import load_definition  # noqa: E402
from streamlake.pipeline.silver import SilverStage, ensure_silver  # noqa: E402

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


def lookup_ids(known: int, count: int) -> pa.Table:
    """``count`` candidates (columns event_id, t): every other one an id silver holds."""
    picks = [(f"e{(i * 7919) % known}" if i % 2 else f"new{i}", (i * 7) % 86_000) for i in range(count)]
    micros = int(DAY.timestamp() * 1_000_000)
    return pa.table({"event_id": [p[0] for p in picks],
                     "t": pa.array([micros + p[1] * 1_000_000 for p in picks], pa.int64())})


def measure(args) -> dict:
    definition = load_definition(HERE.parent / "pipelines" / "sensors.yaml")
    work = HERE / "work" / NAME
    shutil.rmtree(work, ignore_errors=True)
    paths = {"never compacted": str(work / "plain" / "silver"), "compacted as the stage does": str(work / "compacted" / "silver")}
    stages = {kind: SilverStage(definition, str(work / "bronze"), path, str(work / "quarantine"), str(work / "ck"))
              for kind, path in paths.items()}
    spec = ensure_silver(paths["never compacted"], definition)[1]
    ensure_silver(paths["compacted as the stage does"], definition)
    checkpoints = sorted({c for c in (100, 250, 500, 1000, 1500, 2000, args.files) if c <= args.files})
    points, compaction_s, compactions = [], 0.0, 0
    for n in range(1, args.files + 1):
        rows = batch_rows(spec, (n - 1) * args.rows, args.rows)
        for kind, path in paths.items():
            write_deltalake(path, rows, mode="append")
        table = open_table(paths["compacted as the stage does"])  # the stage has it open after its commit
        started = time.perf_counter()
        if compact_small_files(table) is not None:
            compactions += 1
        compaction_s += time.perf_counter() - started
        if n in checkpoints:
            candidates = lookup_ids(n * args.rows, args.lookup)
            point = {"appends": n, "rows": n * args.rows}
            for kind, stage in stages.items():
                times, found = [], None
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    known = stage._known_in_silver(candidates)
                    times.append(time.perf_counter() - started)
                    assert found is None or known == found
                    found = known
                assert len(found) == args.lookup // 2, (kind, len(found))  # every known id, no other
                point[kind] = {"lookup_s": round(statistics.median(times), 4),
                               "files": len(open_table(paths[kind]).file_uris())}
            points.append(point)
            progress(f"{n} appends: " + ", ".join(f"{k} {point[k]['lookup_s']:.3f} s over {point[k]['files']} files"
                                                  for k in paths))
    return {"machine": machine(), "load_at_end": round(load(), 2), "at": dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"), "rows_per_append": args.rows, "lookup_ids": args.lookup, "repeat": args.repeat,
        "compact_after_small_files": COMPACT_AFTER_SMALL_FILES, "points": points, "compactions": compactions,
        "compaction_s": round(compaction_s, 2)}


def finish(result: dict) -> None:
    last = result["points"][-1]
    plain, compacted = last["never compacted"], last["compacted as the stage does"]
    result["summary"] = [
        f"silver's de-dup lookup after {last['appends']} appends of {result['rows_per_append']} events: "
        f"{plain['lookup_s']:.3f} s over {plain['files']} files never compacted, "
        f"{compacted['lookup_s']:.3f} s over {compacted['files']} files compacted as the stage does "
        f"({plain['lookup_s'] / compacted['lookup_s']:.1f}x)",
        f"the stage's compactions: {result['compactions']}; with the check after every append "
        f"{result['compaction_s']:.1f} s in all ({result['compaction_s'] / last['appends'] * 1000:.1f} ms "
        f"per append on average)",
    ]


def markdown(result: dict) -> str:
    lines = [f"# Silver's de-duplication lookup as silver grows ({result['at'][:10]})", "",
             f"`bench/dedup_lookup_bench.py`: {result['machine']}; load {result['load_at_end']} at the end. "
             f"Appends of {result['rows_per_append']} events each (one event date), the lookup of "
             f"{result['lookup_ids']} ids (half in silver), median of {result['repeat']}.", "",
             "| appends | never compacted: files | lookup | compacted as the stage does: files | lookup |",
             "|---:|---:|---:|---:|---:|"]
    for p in result["points"]:
        a, b = p["never compacted"], p["compacted as the stage does"]
        lines.append(f"| {p['appends']} | {a['files']} | {a['lookup_s']:.3f} s | {b['files']} | {b['lookup_s']:.3f} s |")
    return "\n".join(lines + [""] + [f"- {s}" for s in result["summary"]]) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in ("never compacted", "compacted as the stage does"):
        ax.plot([p["appends"] for p in result["points"]], [p[kind]["lookup_s"] for p in result["points"]],
                marker="o", label=kind)
    ax.set_xlabel("silver appends (micro-batches)")
    ax.set_ylabel("de-dup lookup, s")
    ax.set_title("Silver's de-duplication lookup as silver grows")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000, help="appends (micro-batches) to grow silver by")
    parser.add_argument("--rows", type=int, default=100, help="events per append")
    parser.add_argument("--lookup", type=int, default=1000, help="ids looked up at each checkpoint")
    parser.add_argument("--repeat", type=int, default=5, help="lookups per checkpoint (the median is reported)")
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
