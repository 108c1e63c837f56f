"""spark-submit entrypoint: bronze ingest, Kafka -> Delta exactly once.

    spark-submit --master local[*] jobs/ingest_bronze.py --topic sensors \
        --table /data/bronze --checkpoint /data/_checkpoints/bronze --available-now

Usually started by ``streamlake ingest`` or the Airflow DAGs. Exit status: 0 on
success or a requested stop, 2 for a platform error (bad option, unknown topic,
data loss, offset gap), 1 for anything else.
"""

from __future__ import annotations

import argparse
import sys
import time

from streamlake import logs
from streamlake.pipeline.control import JobControl
from streamlake.errors import StreamLakeError
from streamlake.pipeline.driver import describe_failure, platform_error
from streamlake.pipeline.ingest import add_ingest_arguments, begin_warm_up, config_from_args, run_ingest
from streamlake.spark.session import get_spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ingest_bronze", description=__doc__.split("\n")[0])
    add_ingest_arguments(parser)
    args = parser.parse_args(argv)
    logs.configure()
    try:
        cfg = config_from_args(args)
    except StreamLakeError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    spark = get_spark(f"ingest_bronze:{cfg.query_name}")
    begin_warm_up(spark, cfg)  # the executors' Python starts while the driver sets up
    try:
        summary = run_ingest(spark, cfg, report=lambda line: print(line, flush=True))
    except Exception as exc:  # noqa: BLE001 - turned into a readable message and an exit status
        message = describe_failure(exc)
        print(f"ERROR: {message}", file=sys.stderr, flush=True)
        JobControl.for_checkpoint(cfg.checkpoint).write_state(last_failure={"at": time.time(), "message": message})
        return 2 if platform_error(message) else 1
    finally:
        spark.stop()
    print(f"ingest finished: {summary['rows']} rows in {summary['batches']} micro-batches, "
          f"{summary['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
