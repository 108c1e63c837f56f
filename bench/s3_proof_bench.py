"""`make bench`: the proof of a job on S3 on a Spark Connect server that holds the store's
credentials, against the same proof as a spark-submit of its own, same run (issue 24, item 3).

1. Produce N records of the orders example into a private local Kafka broker (a tenth of them
   malformed, some late and duplicated) and run the whole pipeline once, available-now, into
   ``s3://bench/orders`` on the local S3 server (moto, started here).
2. Start a Spark Connect server with the store's credentials in its environment
   (``spark_connect.start(store_environment=..., storage_conn_id=...)``, as ``make run LAKE=s3``).
3. ``streamlake check --root s3://bench/orders --full`` R times each way, alternating: as a client
   of that server (``--remote``), and as a spark-submit (a copy of the home where no server
   runs: the CLI's fallback); before each later pair, M more records go through the pipeline.
   Every check must pass. The first pair (the server's first job) and the medians of the later
   ones (a running server, as the platform's) are compared.

Writes bench/results/s3_proof.{md,json,png}. One machine: the S3 server, the broker, the
Connect server and the checks share its cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS, free_port, load, machine, private_broker, progress, rewrite_results,  # noqa: E402
                    write_results)

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "s3_proof"
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
ROOT = "s3://bench/orders"


def run_cli(args: list[str], env: dict, log: Path) -> float:
    """Seconds one CLI command took; SystemExit naming its log when it fails."""
    started = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.run([STREAMLAKE, *args], stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise SystemExit(f"streamlake {' '.join(args[:2])} failed (exit {code}); see {log}")
    return round(time.perf_counter() - started, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--more", type=int, default=2_000, help="records added before each later check")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true",
                        help="rewrite s3_proof.md/.png from s3_proof.json, measure nothing")
    args = parser.parse_args()
    if args.render:
        return rewrite_results(args.results, "s3_proof", finish, markdown, plot)

    import yaml

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with private_broker(WORK):
        from streamlake.kafka.producer import produce_records
        from streamlake.pipeline.definition import load_definition
        from streamlake.platform import object_store, spark_connect
        from streamlake.storage.location import is_secret

        topic = "bench-s3-proof"
        data = yaml.safe_load((HERE.parent / "pipelines" / "orders.yaml").read_text())
        data.update(name="orders", topics=[topic])
        definition_file = WORK / "orders.yaml"
        definition_file.write_text(yaml.safe_dump(data, sort_keys=False))
        progress(f"producing {args.records:,} records of the orders example")
        produce_records(load_definition(definition_file), topic, args.records, partitions=3, progress=False, seed=7,
                        late_fraction=0.05, malformed_fraction=0.1, duplicate_fraction=0.05)
        port = free_port()
        object_store.start(port)
        try:
            storage = object_store.local_options(port)
            object_store.create_bucket(ROOT, storage)
            credentials = {k: v for k, v in storage.items() if is_secret(k) or k.startswith("AWS_")}
            flags = [a for k, v in storage.items() if not is_secret(k) for a in ("--storage-option", f"{k}={v}")]
            env = {**os.environ, **credentials}
            progress("the pipeline, available-now, into " + ROOT)
            pipeline_s = run_cli(["pipeline", "run", "--definition", str(definition_file), "--root", ROOT,
                                  "--available-now", *flags], env, WORK / "pipeline.log")
            progress("a Spark Connect server with the store's credentials")
            server = spark_connect.start(free_port(), store_environment=credentials, storage_conn_id="bench")
            # the spark-submit side: a copy of the home (the job the run recorded) where no server runs
            # (the CLI's fallback); the server's state is in the home's run/ folder
            home = Path(os.environ["STREAMLAKE_HOME"])
            shutil.copytree(home, WORK / "home-submit", ignore=shutil.ignore_patterns("run", "logs"))
            submit_env = {**env, "STREAMLAKE_HOME": str(WORK / "home-submit")}
            check = ["check", "--root", ROOT, "--full"]  # the options: the root's recorded job, the environment
            runs = []
            try:
                for i in range(1, args.runs + 1):
                    if i > 1:  # new records through the pipeline: each later check proves them
                        produce_records(load_definition(definition_file), topic, args.more, partitions=3,
                                        progress=False, seed=7 + i, late_fraction=0.05, malformed_fraction=0.1,
                                        duplicate_fraction=0.05)
                        run_cli(["pipeline", "run", "--definition", str(definition_file), "--root", ROOT,
                                 "--available-now", *flags], env, WORK / f"pipeline-{i}.log")
                    for way in ("connect", "submit"):
                        progress(f"check {i} as {way}")
                        before = load()
                        seconds = run_cli([*check, "--remote", server["url"]] if way == "connect" else check,
                                          env if way == "connect" else submit_env, WORK / f"check-{way}-{i}.log")
                        text = (WORK / f"check-{way}-{i}.log").read_text()
                        expected = "on the Spark Connect server" if way == "connect" else "spark-submit"
                        proofs = ("EXACTLY ONCE", "EVERY BRONZE ROW ONCE", "GOLD EQUALS RECOMPUTE")
                        if any(p not in text for p in proofs) or "FAIL" in text:
                            raise SystemExit(f"check {way}-{i} did not prove the tables; see its log")
                        if way == "connect" and expected not in text:
                            raise SystemExit(f"check {way}-{i} did not run on the server; see its log")
                        runs.append({"way": way, "run": i, "seconds": seconds, "load": [before, load()]})
            finally:
                spark_connect.stop()
        finally:
            object_store.stop()

    result = {"machine": machine(), "records": args.records, "more": args.more, "pipeline_seconds": pipeline_s,
              "runs": runs}
    finish(result)
    write_results(args.results, "s3_proof", result, markdown, plot)
    return 0


def finish(result: dict) -> None:
    """The first check each way (the server's first job: as cold as a spark-submit's JVM) and the
    later ones (each after more records went through the pipeline), as ratios."""
    seconds = {(r["way"], r["run"]): r["seconds"] for r in result["runs"]}
    runs = sorted({r["run"] for r in result["runs"]})
    first = (seconds["connect", 1], seconds["submit", 1])
    later = [(seconds["connect", i], seconds["submit", i]) for i in runs[1:]]
    result["first"] = {"connect": first[0], "submit": first[1], "ratio": round(first[0] / first[1], 3)}
    lines = [f"S3 job's first check on a Spark Connect server holding the store's credentials (its first job) / as "
             f"a spark-submit: {first[0]:.1f} / {first[1]:.1f} s = {result['first']['ratio']:.2f}× (same run)"]
    result["ratio"] = result["first"]["ratio"]
    if later:
        connect, submit = statistics.median(c for c, _ in later), statistics.median(s for _, s in later)
        result["later"] = {"connect": connect, "submit": submit, "ratio": round(connect / submit, 3)}
        result["ratio"] = result["later"]["ratio"]
        lines.append(f"S3 job's checks after more records on the running server / as a spark-submit: "
                     f"{connect:.1f} / {submit:.1f} s = {result['later']['ratio']:.2f}× "
                     f"(medians of {len(later)} runs each, same run)")
    result["summary"] = lines


def markdown(result: dict) -> str:
    out = [f"# The proof of a job on S3: Spark Connect server against spark-submit ({result['machine']})", "",
           f"{result['records']:,} records of the orders example through the whole pipeline into `{ROOT}` on the "
           f"local S3 server ({result['pipeline_seconds']:.0f} s, one available-now run), then `streamlake check "
           "--root ... --full` (bronze against Kafka in full, every bronze row once downstream, gold against a "
           f"recompute; before each later pair {result['more']:,} more records went through the pipeline, which "
           "those checks prove incrementally) alternating: as a client of a Spark Connect server started with the store's credentials, and as a "
           "spark-submit of its own. Seconds from the command to its exit.", "",
           "| run | on | seconds | load |", "|---:|---|---:|---|"]
    for r in result["runs"]:
        out.append(f"| {r['run']} | {'Spark Connect' if r['way'] == 'connect' else 'spark-submit'} | "
                   f"{r['seconds']:.1f} | {r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    out += ["", *[f"- {line}" for line in result["summary"]], ""]
    return "\n".join(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    runs = result["runs"]
    ax.bar([f"{'Connect' if r['way'] == 'connect' else 'submit'} {r['run']}" for r in runs], [r["seconds"] for r in runs],
           color=["#4c72b0" if r["way"] == "connect" else "#dd8452" for r in runs])
    ax.set_ylabel("seconds, command to exit")
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    ax.set_title(f"S3 check after more records: Spark Connect / spark-submit = {result['ratio']:.2f}×")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
