"""`make bench`: bronze ingest to an S3 root against the same ingest to local disk, same run.

1. Produce N records of ~B bytes into P partitions of a private local Kafka broker.
2. ``streamlake ingest --available-now`` (spark-submit, local[*]) into a local Delta
   table, and into an ``s3://`` table on the local S3 server (moto, started here,
   ``conditional_put=etag`` commits over HTTP); alternating, R runs each (default 3),
   each into a table of its own. Each side's median run counts (single runs vary up
   to 2x here, with the broker, Spark and the S3 server on 2 cores); every run is listed.
3. Audit every table against Kafka (each must be exactly once).

Target (issue 25, item 5): S3 ingest ≥ 0.7× the local-disk ingest (records per
second of processing time). Writes bench/results/object_store.{md,json,png}.
The local S3 server runs on the same 2 cores as Spark: a real bucket moves the
upload work off the machine.
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
from common import (RESULTS, free_port, load, machine, private_broker, progress, rewrite_results,  # noqa: E402
                    target_line, write_results)

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "object_store"
TARGET = 0.7
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


def ingest(table: str, tag: str, topic: str, master: str, max_offsets: int, storage: dict) -> dict:
    """One ``streamlake ingest --available-now`` run; its micro-batches' timings."""
    from streamlake.pipeline.ingest import progress_file

    checkpoint = WORK / f"checkpoint-{tag}"
    from streamlake.storage.location import is_secret

    cmd = [STREAMLAKE, "ingest", "--topic", topic, "--table", table, "--checkpoint", str(checkpoint),
           "--available-now", "--master", master, "--max-offsets-per-trigger", str(max_offsets)]
    cmd += [a for k, v in storage.items() if not is_secret(k) for a in ("--storage-option", f"{k}={v}")]
    env = {**os.environ, **{k: v for k, v in storage.items() if is_secret(k)}}  # credentials: the environment
    started = time.perf_counter()
    before = load()
    log = WORK / f"ingest-{tag}.log"
    with log.open("w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"ingest {tag} failed (exit {code}); see {log}")
    batches = [json.loads(line) for line in progress_file(checkpoint).read_text().splitlines()]
    processing = sum(b["durationMs"] for b in batches) / 1000
    records = sum(b["numInputRows"] for b in batches)
    commit_ms = sum((b.get("sinkMs") or {}).get("commit", 0) for b in batches)
    write_ms = sum((b.get("sinkMs") or {}).get("write", 0) for b in batches)
    return {"tag": tag, "table": table, "records": records, "batches": len(batches),
            "processing_seconds": round(processing, 2), "wall_seconds": round(wall, 2),
            "records_per_second": round(records / processing, 1), "write_ms": write_ms, "commit_ms": commit_ms,
            "load": [before, load()]}


def audit(table: str, topic: str, storage: dict) -> dict:
    from streamlake.operations.audit import audit_offsets
    from streamlake.storage.location import storage_options

    report = audit_offsets(table, [topic], storage=storage_options(table, storage if "://" in table else {}))
    if not report.exactly_once:
        raise SystemExit(f"{table} is not exactly once: {report.summary()}")
    return report.totals()


def finish(result: dict) -> None:
    """Each side's median run, their ratio and the summary line, from ``result["runs"]``."""
    import statistics

    median = {side: statistics.median(r["records_per_second"] for r in result["runs"] if r["tag"].startswith(side))
              for side in ("local", "s3")}
    result["median"] = median
    result["ratio"] = round(median["s3"] / median["local"], 3)
    result.pop("best", None)
    result["summary"] = [
        f"object store: bronze ingest to S3 {median['s3']:,.0f} records/s vs local disk {median['local']:,.0f} "
        f"(medians of {len(result['runs']) // 2} runs each): " + target_line("S3 / local", result["ratio"], TARGET, "×")]


def markdown(result: dict) -> str:
    out = [f"# Bronze ingest to S3 against local disk ({result['machine']})", "",
           f"{result['records']:,} records of ~{result['value_bytes']} bytes in {result['partitions']} partitions, "
           f"`streamlake ingest --available-now --master {result['master']} --max-offsets-per-trigger "
           f"{result['max_offsets_per_trigger']:,}`; the S3 side is an `s3://` table on "
           "the local S3 server (moto, same machine), commits with `conditional_put=etag`. Runs alternate; the "
           "median run of each side counts.", "",
           "| run | records | batches | processing s | records/s | write ms | commit ms | load |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["runs"]:
        out.append(f"| {r['tag']} | {r['records']:,} | {r['batches']} | {r['processing_seconds']:.1f} | "
                   f"{r['records_per_second']:,.0f} | {r['write_ms']:,} | {r['commit_ms']:,} | "
                   f"{r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    out += ["", *[f"- {line}" for line in result["summary"]], ""]
    return "\n".join(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    runs = result["runs"]
    colors = ["#4c72b0" if r["tag"].startswith("local") else "#dd8452" for r in runs]
    ax.bar([r["tag"] for r in runs], [r["records_per_second"] for r in runs], color=colors)
    ax.set_ylabel("records / s (processing)")
    ax.set_title(f"bronze ingest: S3 / local = {result['ratio']:.2f}× (target ≥ {TARGET})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--render", action="store_true",
                        help="rewrite object_store.md/.png and the summary from object_store.json, measure nothing")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.render:
        return rewrite_results(args.results, "object_store", finish, markdown, plot)

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with private_broker(WORK):
        from streamlake.kafka.producer import produce_records
        from streamlake.pipeline.definition import load_definition
        from streamlake.platform import object_store

        topic = "bench-s3"
        progress(f"producing {args.records:,} records")
        produce_records(load_definition(HERE.parent / "pipelines" / "sensors.yaml"), topic, args.records,
                        partitions=args.partitions, value_bytes=args.value_bytes, progress=False, seed=5)
        port = free_port()
        object_store.start(port)
        try:
            storage = object_store.local_options(port)
            object_store.create_bucket("s3://bench", storage)
            runs = []
            for i in range(1, args.runs + 1):
                for side in ("local", "s3"):
                    table = str(WORK / f"bronze-local-{i}") if side == "local" else f"s3://bench/bronze-{i}"
                    progress(f"ingest run {i} to {side}")
                    run = ingest(table, f"{side}-{i}", topic, args.master, args.max_offsets_per_trigger,
                                 storage if side == "s3" else {})
                    run["audit"] = audit(table, topic, storage)
                    runs.append(run)
        finally:
            object_store.stop()

    result = {"machine": machine(), "records": args.records, "value_bytes": args.value_bytes,
              "partitions": args.partitions, "master": args.master, "runs": runs,
              "max_offsets_per_trigger": args.max_offsets_per_trigger}
    finish(result)
    write_results(args.results, "object_store", result, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
