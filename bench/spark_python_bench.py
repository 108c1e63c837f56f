"""Spark's Python processes forked by the fork server against new interpreters (same run, alternated).

A probe process starts a local[2] Spark session and times what starts Spark's
Python processes: the first read of a Python data source (the Kafka source's
warm-up: the data source's planner, the worker daemon and a worker per core),
an available-now streaming query on a Python data source (its runner, a
planner, the workers), and a Python UDF and an RDD map. It runs ROUNDS times
with ``PYSPARK_PYTHON`` the fork server's launcher
(:mod:`streamlake.platform.spark_python`) and ROUNDS times with the
interpreter, alternated, each probe a JVM of its own; the medians and their
ratios go to ``bench/results/spark_python.{md,json,png}``, each with the
machine's load. Target: the forked total at most 0.8× the interpreter's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, RESULTS, load, machine  # noqa: E402

ROUNDS = 3
TARGET = 0.8
PARTS = ("first_python_read", "streaming_query", "udfs")

PROBE = textwrap.dedent('''
    import json, sys, tempfile, time
    from pyspark.sql import SparkSession, functions as F
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from streamlake.kafka.source import warm_up

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    took = {}
    started = time.monotonic()
    warm_up(spark)
    took["first_python_read"] = time.monotonic() - started


    class Reader(DataSourceStreamReader):
        def initialOffset(self):
            return {"at": 0}

        def latestOffset(self):
            return {"at": 4}

        def partitions(self, start, end):
            return [InputPartition(i) for i in range(start["at"], end["at"])]

        def read(self, partition):
            yield (partition.value, partition.value * partition.value)

        def commit(self, end):
            pass


    class Squares(DataSource):
        @classmethod
        def name(cls):
            return "bench_squares"

        def schema(self):
            return "n int, square int"

        def streamReader(self, schema):
            return Reader()


    spark.dataSource.register(Squares)
    started = time.monotonic()
    query = (spark.readStream.format("bench_squares").load().writeStream.format("memory").queryName("squares")
             .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start())
    query.awaitTermination()
    assert spark.sql("SELECT sum(square) FROM squares").first()[0] == 0 + 1 + 4 + 9
    took["streaming_query"] = time.monotonic() - started
    started = time.monotonic()
    doubled = F.udf(lambda value: value * 2, "long")
    assert spark.range(1000).select(doubled("id").alias("x")).agg(F.sum("x")).first()[0] == 999 * 1000
    assert spark.sparkContext.parallelize(range(100), 2).map(lambda v: v + 1).sum() == 5050
    took["udfs"] = time.monotonic() - started
    spark.stop()
    print("RESULT " + json.dumps(took))
''')


def probe(python: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], env={**env, "PYSPARK_PYTHON": python},
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"probe with {python} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-3000:]}")
    took = json.loads(line[len("RESULT "):])
    took["total"] = sum(took[p] for p in PARTS)
    took["load"] = load()
    return took


def main() -> int:
    work = HERE / "work" / "spark_python"
    work.mkdir(parents=True, exist_ok=True)
    os.environ["STREAMLAKE_HOME"] = str(work / "home")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from streamlake.platform import fork_server

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "include"), env.get("PYTHONPATH", "")])
    server = fork_server.start()
    launcher = server["spark_python"]
    runs = {"forked": [], "interpreter": []}
    try:
        for round_ in range(1, ROUNDS + 1):
            for kind, python in (("forked", launcher), ("interpreter", sys.executable)):
                took = probe(python, env)
                runs[kind].append(took)
                print(f"round {round_} {kind}: " + ", ".join(f"{p} {took[p]:.2f} s" for p in (*PARTS, "total"))
                      + f" (load {took['load']})", flush=True)
    finally:
        fork_server.stop()
    medians = {kind: {p: round(statistics.median(r[p] for r in rs), 2) for p in (*PARTS, "total")}
               for kind, rs in runs.items()}
    ratios = {p: round(medians["forked"][p] / medians["interpreter"][p], 2) for p in (*PARTS, "total")}
    met = ratios["total"] <= TARGET
    summary = [f"Spark's Python processes forked / new interpreters (local[2], medians of {ROUNDS} alternated "
               f"probes): total {medians['forked']['total']} / {medians['interpreter']['total']} s = "
               f"{ratios['total']}x (target <= {TARGET}x): {'met' if met else 'NOT MET'}"]
    result = {"machine": machine(), "measured_at": time.strftime("%Y-%m-%d %H:%M"), "rounds": ROUNDS,
              "runs": runs, "medians": medians, "ratios": ratios, "target": TARGET, "met": met, "summary": summary}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark_python.json").write_text(json.dumps(result, indent=2))
    rows = "\n".join(f"| {p} | {medians['forked'][p]} | {medians['interpreter'][p]} | {ratios[p]}x |"
                     for p in (*PARTS, "total"))
    loads = ", ".join(str(r["load"]) for rs in runs.values() for r in rs)
    (RESULTS / "spark_python.md").write_text(
        f"# Spark's Python processes: forked by the fork server / new interpreters\n\n{machine()}; "
        f"{result['measured_at']}; medians of {ROUNDS} probes each, alternated, each a local[2] session of its "
        f"own (bench/spark_python_bench.py); loads {loads}.\n\n"
        f"| part | forked (s) | new interpreter (s) | ratio |\n|---|---:|---:|---:|\n{rows}\n\n"
        + "\n".join(f"- {line}" for line in summary) + "\n\n![spark_python](spark_python.png)\n")
    _plot(medians)
    print("\n".join(summary))
    return 0


def _plot(medians: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    xs = range(len(PARTS) + 1)
    for i, kind in enumerate(("interpreter", "forked")):
        ax.bar([x + (i - 0.5) * width for x in xs], [medians[kind][p] for p in (*PARTS, "total")], width,
               label={"forked": "forked by the fork server", "interpreter": "new interpreter"}[kind])
    ax.set_xticks(list(xs), [p.replace("_", " ") for p in (*PARTS, "total")])
    ax.set_ylabel("seconds (median)")
    ax.set_title("Spark's Python processes on a local[2] session")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "spark_python.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
