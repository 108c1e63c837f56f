"""Delta Lake's Spark connector beside delta-rs, on the platform's Spark session.

The platform commits through delta-rs; a Spark user reads and writes the same tables with
delta-spark (its jars are on every Spark JVM's class path, its SQL extension and catalog in
every session). Each engine reads and appends to a table the other created, and every row
is compared with values the test wrote itself. The jars are those of the pinned Python
package, so its Python API (delta.tables) and the JVM connector are one version.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from importlib.metadata import version

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from streamlake import jars

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                    ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32())])


def _rows(start: int, n: int) -> list[dict]:
    base = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc)
    return [{"id": i, "name": f"n{i}", "amount": Decimal(i) / 4, "at": base + dt.timedelta(seconds=i),
             "day": (base + dt.timedelta(hours=i)).date()} for i in range(start, start + n)]


def _as_tuples(rows) -> set[tuple]:
    return {(r["id"], r["name"], r["amount"], r["at"], r["day"]) for r in rows}


def test_the_connector_jar_is_the_pinned_python_packages_version():
    pinned = version("delta-spark")
    installed = sorted(p.name for p in jars.jar_dir(jars.SPARK).glob("delta-spark_*.jar"))
    assert installed == [f"delta-spark_4.2_2.13-{pinned}.jar"], (installed, pinned)


def test_delta_spark_reads_and_appends_to_a_table_delta_rs_created(spark, tmp_path):
    path = str(tmp_path / "by-delta-rs")
    write_deltalake(path, pa.Table.from_pylist(_rows(0, 20), schema=SCHEMA), partition_by=["day"])
    read = spark.read.format("delta").load(path)
    assert _as_tuples(read.toArrow().to_pylist()) == _as_tuples(_rows(0, 20))

    spark.createDataFrame(pa.Table.from_pylist(_rows(20, 10), schema=SCHEMA)) \
        .write.format("delta").mode("append").save(path)
    table = DeltaTable(path)
    assert table.version() == 1
    assert _as_tuples(table.to_pyarrow_table().to_pylist()) == _as_tuples(_rows(0, 30))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [h.version for h in history] == [0, 1] and history[1].operation == "WRITE", history


def test_delta_rs_reads_and_appends_to_a_table_delta_spark_created(spark, tmp_path):
    path = str(tmp_path / "by-delta-spark")
    spark.createDataFrame(pa.Table.from_pylist(_rows(0, 15), schema=SCHEMA)) \
        .write.format("delta").partitionBy("day").save(path)
    table = DeltaTable(path)
    assert _as_tuples(table.to_pyarrow_table().to_pylist()) == _as_tuples(_rows(0, 15))

    write_deltalake(path, pa.Table.from_pylist(_rows(15, 5), schema=SCHEMA), mode="append")
    read = spark.sql(f"SELECT * FROM delta.`{path}`")
    assert _as_tuples(read.toArrow().to_pylist()) == _as_tuples(_rows(0, 20))
    assert spark.sql(f"SELECT count(*) FROM delta.`{path}` VERSION AS OF 0").first()[0] == 15


def test_streamlake_sql_prints_an_aligned_table_with_nulls_named():
    from streamlake.cli.sql import format_table

    text = format_table([{"pipeline": "sensors", "rows": 12345}, {"pipeline": "orders", "rows": None}],
                        ["pipeline", "rows"])
    assert text.splitlines() == ["+----------+-------+", "| pipeline | rows  |", "+----------+-------+",
                                 "| sensors  | 12345 |", "| orders   | NULL  |", "+----------+-------+", "(2 rows)"]


def test_the_feature_list_is_the_pinned_connectors_own(spark):
    """The features the platform allows are exactly those the connector on the class path knows."""
    from streamlake.delta.features import SPARK_TABLE_FEATURES

    features = getattr(spark._jvm.org.apache.spark.sql.delta, "TableFeature$").__getattr__("MODULE$") \
        .allSupportedFeaturesMap().values().iterator()  # its keys are lower-cased
    known = set()
    while features.hasNext():
        known.add(features.next().name())
    assert SPARK_TABLE_FEATURES == known, (SPARK_TABLE_FEATURES ^ known)


def test_a_table_feature_delta_spark_cannot_read_is_refused_before_the_table_exists(spark, tmp_path, monkeypatch):
    """A table whose protocol the pinned connector lacks is refused at creation, with the feature
    named and nothing written; a table with deletion vectors (delta-rs also adds variantType)
    is created and delta-spark reads it."""
    from streamlake.delta import features
    from streamlake.delta.table import TableSpec, ensure_table
    from streamlake.errors import UnreadableTableError

    with_dvs = TableSpec("with_dvs", SCHEMA, configuration={"delta.enableDeletionVectors": "true"})
    ensure_table(tmp_path / "with-dvs", with_dvs)
    assert spark.read.format("delta").load(str(tmp_path / "with-dvs")).count() == 0
    assert {"deletionVectors", "variantType"} <= set(DeltaTable(str(tmp_path / "with-dvs")).protocol().reader_features)

    # A connector without timestampNtz (delta-spark 2.x had none): a local timestamp column is refused.
    monkeypatch.setattr(features, "SPARK_TABLE_FEATURES", features.SPARK_TABLE_FEATURES - {"timestampNtz"})
    local_time = TableSpec("local_time", pa.schema([("id", pa.int64()), ("at", pa.timestamp("us"))]))
    with pytest.raises(UnreadableTableError, match="timestampNtz.*nothing was created"):
        ensure_table(tmp_path / "local-time", local_time)
    assert not (tmp_path / "local-time").exists()
    assert features.features_spark_lacks(4, 8, ["deletionVectors"]) == ["reader version 4", "writer version 8"]
