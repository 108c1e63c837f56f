"""spark-submit entrypoint run once by ``make setup``: the work whose JVM classes go into the
class-data-sharing archive (see streamlake.spark.class_archive).

It touches what the platform's jobs use: a session, SQL with a shuffle and windows,
Arrow both ways, Python in tasks (mapInArrow), a streaming query with foreachBatch.
Its results are checked, so a broken Spark installation fails here, not in a job.
"""

from __future__ import annotations

import sys
import tempfile


def main() -> int:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.appName("class-archive-warm-up").getOrCreate()
    try:
        events = spark.range(10_000).select(
            (F.col("id") % 7).alias("key"), F.timestamp_seconds(F.col("id")).alias("t"), F.col("id").alias("v"))
        windows = events.groupBy("key", F.window("t", "1 minute")).agg(F.count("*").alias("n"), F.sum("v"))
        assert windows.agg(F.sum("n")).first()[0] == 10_000

        def double(batches):
            for batch in batches:
                yield pa.RecordBatch.from_arrays([pa.compute.multiply(batch.column(0), 2)], names=["v"])

        doubled = spark.range(100).withColumnRenamed("id", "v")
        assert doubled.mapInArrow(double, "v long").toArrow().column("v").to_pylist()[-1] == 198

        seen: list[int] = []
        with tempfile.TemporaryDirectory() as checkpoint:
            query = (spark.readStream.format("rate").option("rowsPerSecond", 100).load()
                     .writeStream.option("checkpointLocation", checkpoint)
                     .foreachBatch(lambda df, _batch_id: seen.append(df.count()))
                     .trigger(availableNow=True).start())
            query.awaitTermination(120)
        print(f"warm-up done: {len(seen)} streaming batches")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
