"""A class-data-sharing archive of Spark's JVM classes: every Spark JVM here starts faster.

Every Spark application of the platform (each Airflow task's spark-submit, the CLI's
jobs, the Spark Connect server, a test session) is a JVM that loads the same several
thousand classes from pyspark's jars, parsing and verifying each one again. JDK 17's
dynamic AppCDS archives them once: one run with ``-XX:ArchiveClassesAtExit`` writes
the classes it loaded, already parsed and verified, and later JVMs map that archive
read-only (``-XX:SharedArchiveFile``), sharing its pages between them. Measured on 2
cores, the warm-up job (a local session and a few small jobs) took 21 s and 33
CPU-seconds without the archive, 15 s and 22 CPU-seconds with it.

The warm-up (``jobs/class_archive_warm_up.py``) does the kinds of work the platform's jobs
do, silver's and gold's included: with an archive of a warm-up without Python data sources,
Parquet, the columnar cache and joins, a cold silver and gold run (``local[2]``, 86,489 rows)
loaded 3,205 classes from the jars, with this one 887 (438 of them Janino's, whose signed jar
the JVM does not archive), and took 1.0-1.6 s less (24.2 against 25.1 s, 25.2 against 26.8 s
in alternated runs, 2026-12-05). The archive's name carries a digest of the warm-up and of
the installed "spark" jar set, so ``make setup`` builds a new one when either changes and removes the one before.

Safe to be missing or stale: the JVM validates the archive against its own build and
class path and, when either differs or the file is absent, runs without it, silently
(``-Xshare:auto``, the default). So the option is always passed; ``make setup`` builds
the archive (:func:`build_archive`), and a JDK or pyspark change only costs the speed
until it is rebuilt (``python -m streamlake.spark.class_archive --rebuild``).

Where the archive is and the option that maps it (:func:`streamlake.spark.session.class_archive_path`,
:func:`~streamlake.spark.session.class_archive_option`) are Spark settings: they live with the
others in :mod:`streamlake.spark.session`; this module builds the archive.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from streamlake.spark.session import CLASS_ARCHIVE_WARM_UP_JOB, class_archive_path, job_environment, spark_submit_command


def build_archive(rebuild: bool = False, timeout_s: float = 600) -> Path | None:
    """Write the archive by running the warm-up job once with ``-XX:ArchiveClassesAtExit``
    (about 40 s), unless it exists and ``rebuild`` is False. The file appears atomically
    (written beside, then renamed), so JVMs starting meanwhile never map half an archive.
    Returns its path, or None when the JVM wrote none (printed why; Spark still works,
    only slower to start)."""
    target = class_archive_path()
    if target.exists() and not rebuild:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    started = time.monotonic()
    cmd = spark_submit_command(CLASS_ARCHIVE_WARM_UP_JOB, [], master="local[2]", class_archive=False,
                               conf={"spark.driver.defaultJavaOptions": f"-XX:ArchiveClassesAtExit={partial}"})
    done = subprocess.run(cmd, env=job_environment(), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        print(f"class archive: not written (exit {done.returncode}); Spark JVMs start without it:\n"
              f"{done.stderr[-2000:]}", file=sys.stderr)
        return None
    partial.replace(target)
    for stale in target.parent.glob("spark-*-classes.jsa"):  # of an earlier warm-up or pyspark
        if stale != target:
            stale.unlink(missing_ok=True)
    print(f"class archive: {target} ({target.stat().st_size // 2**20} MiB) in {time.monotonic() - started:.0f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlake.spark.class_archive",
                                     description="Build the Spark JVMs' class-data-sharing archive.")
    parser.add_argument("--rebuild", action="store_true", help="write it again even if it exists")
    args = parser.parse_args(argv)
    build_archive(rebuild=args.rebuild)
    return 0  # a missing archive is a slower start, never a failed set-up


if __name__ == "__main__":
    sys.exit(main())
