"""Table features: every table the platform creates is one the pinned delta-spark reads.

The platform writes through delta-rs; Spark users read the same tables with Delta's Spark
connector (the jar set ``spark``, the version of the pinned ``delta-spark`` package). A table
whose protocol names a feature that connector does not know is one it refuses to read, so
such a table is refused before it is created (and a column a definition change adds,
before it is added), never discovered by a Spark user later.

Which features a new table gets is delta-rs's decision (its schema's types, its
``delta.*`` properties: ``delta.enableDeletionVectors=true`` brings ``deletionVectors`` and
``variantType`` in deltalake 1.6, a timestamp without a time zone ``timestampNtz``). So
the check does not guess: it creates the same table, empty, in a local scratch directory,
reads the protocol delta-rs wrote there, and compares it with what the connector supports.
"""

from __future__ import annotations

import tempfile
from typing import Iterable

from deltalake import DeltaTable

from streamlake.errors import UnreadableTableError

#: The table features Delta's Spark connector of the pinned version (delta-spark 4.4.0, jar
#: set ``spark``) reads and writes: the names of ``TableFeature.allSupportedFeaturesMap``.
#: tests/test_delta_spark.py compares this list with the connector's own on every run.
SPARK_TABLE_FEATURES = frozenset({
    "adaptiveMetadata-preview", "allowColumnDefaults", "appendOnly", "catalogManaged", "changeDataFeed",
    "checkConstraints", "checkpointProtection", "clustering", "columnMapping", "coordinatedCommits-preview",
    "deletionVectors", "domainMetadata", "generatedColumns", "geospatial", "geospatial-dev",
    "icebergCompatV1", "icebergCompatV2", "icebergCompatV3", "identityColumns", "inCommitTimestamp",
    "invariants", "materializePartitionColumns", "rowTracking", "timestampNtz", "typeWidening",
    "typeWidening-preview", "v2Checkpoint", "vacuumProtocolCheck", "variantShredding",
    "variantShredding-preview", "variantType", "variantType-preview",
})
#: The highest protocol versions the connector reads and writes.
SPARK_READER_VERSION, SPARK_WRITER_VERSION = 3, 7


def features_spark_lacks(reader_version: int, writer_version: int, features: Iterable[str]) -> list[str]:
    """What of a protocol the pinned connector lacks, as readable phrases (empty: it reads it)."""
    lacking = [f"reader version {reader_version}"] if reader_version > SPARK_READER_VERSION else []
    if writer_version > SPARK_WRITER_VERSION:
        lacking.append(f"writer version {writer_version}")
    return lacking + sorted(set(features) - SPARK_TABLE_FEATURES)


def require_spark_readable(what: str, schema, partition_by, configuration) -> None:
    """Raise UnreadableTableError naming the features if a table of this ``schema``,
    ``partition_by`` and ``configuration``, created by delta-rs, is one the pinned delta-spark
    cannot read. Writes only to a local scratch directory, removed before it returns."""
    with tempfile.TemporaryDirectory(prefix="streamlake-features-") as scratch:
        DeltaTable.create(scratch, schema, partition_by=list(partition_by) or None,
                          configuration=dict(configuration))
        protocol = DeltaTable(scratch).protocol()
    features = {*(protocol.reader_features or ()), *(protocol.writer_features or ())}
    lacking = features_spark_lacks(protocol.min_reader_version, protocol.min_writer_version, features)
    if lacking:
        raise UnreadableTableError(
            f"{what}: delta-rs would create it with {', '.join(lacking)}, which Delta's Spark connector "
            f"(the pinned delta-spark) cannot read; nothing was created. Change the table's properties "
            f"{dict(configuration)} or its column types.")
