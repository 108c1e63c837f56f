"""spark-submit entrypoint run once by ``make setup``: the work whose JVM classes go into the
class-data-sharing archive (see streamlake.spark.class_archive).

It touches what the platform's jobs use: a session, SQL with a shuffle and windows,
Arrow both ways, Python in tasks (mapInArrow), a streaming query with foreachBatch,
Delta Lake's connector (a table written, read, its
history and time travel), and what silver and gold add (a cold silver batch loaded some 3,200 classes from the jars
without it): Python data sources (batch and streaming, Arrow batches), JSON parsing,
the columnar cache, generated code (Janino), joins, Parquet written and read back.
Its results are checked, so a broken Spark installation fails here, not in a job.
"""

from __future__ import annotations

import sys
import tempfile


def _python_data_source(spark) -> str:
    """A Python data source (batch and streaming, Arrow record batches), as the platform's own."""
    import pyarrow as pa
    from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                        InputPartition)
    from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

    class Reader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(2)]

        def read(self, partition):
            ids = list(range(partition.value * 500, partition.value * 500 + 500))
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids, pa.int64()),
                 pa.array([f'{{"k": {i % 13}, "x": {i}.5, "s": "s{i % 5}"}}' for i in ids])], names=["id", "value"])

    class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow, Reader):
        """With admission control and available-now, as the platform's sources."""

        def initialOffset(self):
            return {"n": 0}

        def getDefaultReadLimit(self) -> ReadLimit:
            return ReadMaxRows(10_000)

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start, limit):
            return {"n": 1}

        def partitions(self, start, end):
            return Reader.partitions(self)

        def read(self, partition):
            return Reader.read(self, partition)

        def commit(self, end):
            pass

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "class-archive-warm-up"

        def schema(self):
            return "id long, value string"

        def reader(self, schema):
            return Reader()

        def streamReader(self, schema):
            return StreamReader()

    spark.dataSource.register(Source)
    return Source.name()


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

        source = _python_data_source(spark)
        seen: list[int] = []
        with tempfile.TemporaryDirectory() as tmp:
            # silver's and gold's kind of work: a Python source's rows parsed from JSON, cached,
            # de-duplicated against earlier rows (a join), aggregated, written as Parquet, read back
            parsed = spark.read.format(source).load().select(
                "id", F.from_json("value", "k int, x double, s string").alias("j"),
                F.parse_json("value").alias("v")).select(
                "id", "j.*", F.variant_get("v", "$.k", "int").alias("vk"),
                F.translate("j.s", "s", "t").alias("t"), F.to_date(F.lit("2026-12-05")).alias("d"),
                F.transform(F.sequence(F.lit(1), F.lit(2)), lambda c: c * F.col("j.x")).alias("xs")).cache()
            earlier = parsed.where("id % 3 = 0").select(F.col("id").alias("seen"))
            fresh = parsed.join(earlier, parsed.id == earlier.seen, "left_anti")
            fresh.write.parquet(f"{tmp}/fresh")
            by_key = spark.read.parquet(f"{tmp}/fresh").where("x > 0 OR vk IS NULL").groupBy("k", "s").agg(
                F.count("*").alias("n"), F.sum("x"), F.min("id"), F.max("id"), F.avg("x"), F.first("t"),
                F.last("d"))
            fresh.sortWithinPartitions("k", "id").write.partitionBy("s").parquet(f"{tmp}/partitioned")
            by_key.join(spark.range(13).withColumnRenamed("id", "k"), "k").write.parquet(f"{tmp}/by_key")
            assert spark.read.parquet(f"{tmp}/by_key").agg(F.sum("n")).first()[0] == 1000 - 334
            parsed.unpersist()

            def batch(df, _batch_id):
                seen.append(df.count())

            for stream in (spark.readStream.format("rate").option("rowsPerSecond", 100).load(),
                           spark.readStream.format(source).load()):
                query = (stream.writeStream.option("checkpointLocation", f"{tmp}/checkpoint-{len(seen)}")
                         .foreachBatch(batch).trigger(availableNow=True).start())
                query.awaitTermination(120)

            # What a user does with Delta's connector on the platform's tables: a table written,
            # appended to, read by path and by delta.`path`, its history and an older version
            # (the connector's classes, its log replay and its SQL extension).
            table = f"{tmp}/delta"
            spark.range(50).withColumn("k", F.col("id") % 3).write.format("delta").save(table)
            spark.range(50, 80).withColumn("k", F.col("id") % 3).write.format("delta").mode("append").save(table)
            assert spark.read.format("delta").load(table).count() == 80
            assert spark.sql(f"SELECT count(*) FROM delta.`{table}` VERSION AS OF 0").first()[0] == 50
            assert [r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()] == [1, 0]
        print(f"warm-up done: {len(seen)} streaming batches")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
