"""``streamlake``: the platform's command line, one module per command group.

    streamlake kafka start|stop|status     embedded Apache Kafka (KRaft)        (cli/kafka.py)
    streamlake produce --definition F --count N   labelled records of a pipeline  (cli/kafka.py)
    streamlake ingest --topic T --table D --checkpoint C [--available-now | --processing-time S]
    streamlake audit --topic T --table D   exactly-once proof (exit 0 only if clean)
    streamlake vacuum --table D            delete files of aborted commit attempts (cli/ingest.py)
    streamlake pipeline validate F         what a definition makes, or exit 2      (cli/pipeline.py)
    streamlake pipeline run --definition F --root DIR [--available-now | --processing-time S]
                                           bronze -> silver -> gold per aggregate  (cli/pipeline.py)
    streamlake backfill --job NAME | --root DIR [--aggregate A] [--from T1 --to T2] [--dry-run]
                                           apply late events to gold, prove it     (cli/backfill.py)
    streamlake job list|show|define|status|run|stop NAME                         (cli/jobs.py)
    streamlake savepoint create|list|show|dispose|restore                       (cli/savepoints.py)
    streamlake check --job NAME | --root DIR   consistency checks (recorded); --list (cli/checks.py)
    streamlake quality run --table T [--job NAME | --root DIR | --path P] [--from-version V] [--to-version W] | show
                                           Great Expectations validation, recorded (cli/quality.py)
    streamlake sql "QUERY" [--json] [--remote sc://...]   SQL over every table by name    (cli/sql.py)
    streamlake metrics serve [--port 9464] | show | start | stop
                                                   metrics for Prometheus, computed per scrape; start/stop
                                                   the exporter and Prometheus as services (cli/metrics.py)
    streamlake spark start|stop|status     Spark standalone cluster on 127.0.0.1
    streamlake airflow start|stop|status   Airflow standalone with the DAGs
    streamlake platform                    broker + producer + Spark + Airflow (`make run`)
    streamlake demo                        broker + producer + continuous ingest, no Airflow
    streamlake stop                        stop every service the platform started (cli/services.py)

Exit status: 0 success, 1 failure, 2 bad input or a platform error (the message
says which), 3 a check found a violation, 128+N job killed by signal N.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from streamlake import logs
from streamlake.errors import StreamLakeError

GROUPS = ("kafka", "object_store", "ingest", "pipeline", "backfill", "jobs", "savepoints", "checks", "quality", "sql",
          "metrics", "services")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="streamlake", description="Exactly-once Kafka -> Delta on Spark.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        importlib.import_module(f"streamlake.cli.{group}").add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(logging.INFO if args.verbose else logging.WARNING, "%(levelname)s %(name)s: %(message)s")
    try:
        code = args.func(args)
    except BrokenPipeError:  # output piped into `head` etc.
        code = 0
    except StreamLakeError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 2
    except (FileNotFoundError, RuntimeError, TimeoutError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # deltalake/pyarrow native threads can abort the interpreter during shutdown
    # (delta-rs#2184); everything is flushed, so leave without running it.
    os._exit(code)
