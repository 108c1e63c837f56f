"""Parsing bronze records into typed events, in Spark SQL, with a reason for every reject.

:func:`parse_events` turns a DataFrame of bronze rows (Kafka's ``key``,
``value``, ``timestamp`` and lineage) into one row per record with the typed
event columns and, for records that are not valid events, a ``reason`` code
from :data:`streamlake.pipeline.schemas.QUARANTINE_REASONS` (the first that
applies, in that order) and a readable ``message``. Nothing is dropped here:
every input row comes out once, valid or with its reason.

The value is parsed with Spark's VARIANT type (``try_parse_json``), which keeps
JSON's own types, so ``"temperature": "21.5"`` (a string) and ``true`` are told
apart from the number ``21.5``; no Python runs per row. Works with ANSI mode
on (Spark 4's default): every conversion is a ``try_`` function.
"""

from __future__ import annotations

from streamlake.pipeline.schemas import MAX_FUTURE_SECONDS, QUARANTINE_REASONS, TEMPERATURE_RANGE

# ISO-8601 date-time with a UTC offset (Z or +hh:mm / +hhmm / +hh); seconds and fraction optional.
ISO_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|z|[+-]\d{2}(:?\d{2})?)$"
_NUMBER_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL)"
FIELDS = ("event_id", "sensor_id", "event_time", "temperature")


def _type_of(field: str) -> str:
    return f"schema_of_variant(variant_get(_v, '$.{field}'))"


def parse_events(bronze):
    """Typed events and reject reasons for a DataFrame with bronze's columns.

    Output columns: ``event_id``, ``sensor_id``, ``event_time`` (timestamp),
    ``temperature`` (double), lineage (``topic``, ``partition``, ``offset``),
    ``kafka_timestamp``, ``key``, ``value``, ``reason`` (null for a valid
    event) and ``message``, plus every other input column unchanged.
    """
    from pyspark.sql import functions as F

    lo, hi = TEMPERATURE_RANGE
    df = bronze.withColumn("_v", F.expr("try_parse_json(CAST(value AS STRING))"))
    types = {f: F.expr(_type_of(f)) for f in FIELDS}
    df = df.withColumns({f"_t_{f}": t for f, t in types.items()})
    df = df.withColumns({
        "_schema": F.expr("schema_of_variant(_v)"),
        "_event_id": F.expr("try_variant_get(_v, '$.event_id', 'string')"),
        "_sensor_id": F.expr("try_variant_get(_v, '$.sensor_id', 'string')"),
        "_event_time_text": F.expr("try_variant_get(_v, '$.event_time', 'string')"),
        "_temperature": F.expr("try_variant_get(_v, '$.temperature', 'double')"),
    })
    df = df.withColumns({
        "_event_time": F.expr("try_cast(_event_time_text AS timestamp)"),
        # Python-side regex: SQL string literals would eat the backslashes.
        "_iso_ok": F.coalesce(F.col("_event_time_text").rlike(ISO_WITH_OFFSET), F.lit(False)),
    })
    is_missing = " OR ".join(f"_t_{f} IS NULL OR _t_{f} = 'VOID'" for f in FIELDS)
    wrong_type = (" OR ".join(f"_t_{f} != 'STRING'" for f in ("event_id", "sensor_id", "event_time"))
                  + f" OR NOT (_t_temperature RLIKE '{_NUMBER_TYPES}')")
    far_future = f"_event_time > kafka_timestamp + INTERVAL {MAX_FUTURE_SECONDS} SECONDS"
    reason = F.expr(f"""CASE
        WHEN _v IS NULL THEN 'not_json'
        WHEN NOT startswith(_schema, 'OBJECT') THEN 'not_object'
        WHEN {is_missing} THEN 'missing_field'
        WHEN {wrong_type} THEN 'wrong_type'
        WHEN trim(_event_id) = '' OR trim(_sensor_id) = '' THEN 'empty_field'
        WHEN NOT _iso_ok OR _event_time IS NULL THEN 'invalid_timestamp'
        WHEN NOT (_temperature BETWEEN {lo} AND {hi}) THEN 'out_of_range'
        WHEN {far_future} THEN 'far_future'
    END""")
    df = df.withColumn("reason", reason)
    message = F.expr(f"""CASE reason
        WHEN 'not_json' THEN CASE WHEN value IS NULL OR length(value) = 0 THEN 'the value is empty'
                                  ELSE 'the value is not valid JSON' END
        WHEN 'not_object' THEN concat('the value is JSON ', lower(_schema), ', not an object')
        WHEN 'missing_field' THEN concat('missing or null: ', concat_ws(', ',
            {", ".join(f"IF(_t_{f} IS NULL OR _t_{f} = 'VOID', '{f}', NULL)" for f in FIELDS)}))
        WHEN 'wrong_type' THEN concat('wrong JSON type: ', concat_ws(', ',
            {", ".join(f"IF(_t_{f} != 'STRING', concat('{f} is ', lower(_t_{f})), NULL)"
                       for f in ("event_id", "sensor_id", "event_time"))},
            IF(NOT (_t_temperature RLIKE '{_NUMBER_TYPES}'),
               concat('temperature is ', lower(_t_temperature), ', not a number'), NULL)))
        WHEN 'empty_field' THEN concat('empty: ', concat_ws(', ', IF(trim(_event_id) = '', 'event_id', NULL),
                                                           IF(trim(_sensor_id) = '', 'sensor_id', NULL)))
        WHEN 'invalid_timestamp' THEN concat('event_time "', _event_time_text, '" is not ISO-8601 with a UTC offset')
        WHEN 'out_of_range' THEN concat('temperature ', CAST(_temperature AS STRING), ' is outside {lo:g}..{hi:g}')
        WHEN 'far_future' THEN concat('event_time ', _event_time_text, ' is more than {MAX_FUTURE_SECONDS // 3600} h '
                                      'after the Kafka timestamp ', CAST(kafka_timestamp AS STRING))
    END""")
    df = df.withColumn("message", message)
    valid = F.col("reason").isNull()
    df = df.withColumns({
        "event_id": F.when(valid, F.col("_event_id")),
        "sensor_id": F.when(valid, F.col("_sensor_id")),
        "event_time": F.when(valid, F.col("_event_time")),
        "temperature": F.when(valid, F.col("_temperature")),
    })
    return df.drop(*[c for c in df.columns if c.startswith("_") and c not in bronze.columns])


def reason_codes() -> list[str]:
    return list(QUARANTINE_REASONS)
