"""Parsing bronze records into typed events of a definition, in Spark SQL, with a reason for every reject.

:func:`parse_events` turns a DataFrame of bronze rows into one row per record:
the definition's fields with their declared types and, for a record that is
not a valid event, the first reason that applies, in this order:

``not_json``          the value is not JSON (or is empty);
``not_object``        it is JSON but not an object;
``missing_field``     a required field is absent or null;
``wrong_type``        a field's JSON value does not convert to its declared type
                      without loss: a string for a number, a fraction for an
                      int, a number for a string, a boolean for a timestamp...;
``invalid_timestamp`` a timestamp field is neither ISO-8601 with a UTC offset nor
                      epoch milliseconds (an integer), a date field not
                      ``YYYY-MM-DD``;
``far_future``        the event time is more than ``max_future`` after the
                      record's Kafka timestamp;
then the definition's rules in order: a rule that is FALSE or NULL for the
typed event sends it to quarantine with the rule's name as the reason.

Every input row comes out once, valid or with its reason and a readable
message naming the fields. The value is parsed with Spark's VARIANT type
(``try_parse_json``), which keeps JSON's own types, so ``"12.5"`` (a string) is
told from ``12.5``; no Python runs per row, and with ANSI mode on (Spark 4's
default) no conversion raises (every one is a ``try_`` function). The format is
the definition's ``format`` (JSON; another decoder would produce the same
VARIANT column).
"""

from __future__ import annotations

from streamlake.pipeline.definition import Field, PipelineDefinition
from streamlake.pipeline.windows import format_duration_ms

# ISO-8601 date-time with a UTC offset (Z or +hh:mm / +hhmm / +hh); seconds and fraction optional.
ISO_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|z|[+-]\d{2}(:?\d{2})?)$"
ISO_DATE = r"^\d{4}-\d{2}-\d{2}$"
NUMBER = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL)"
INTEGER = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,0\))$"
# Epoch milliseconds Spark can hold as a timestamp: years 1 to 9999.
EPOCH_MS_RANGE = (-62135596800000, 253402300799999)
BRONZE = "_bronze"  # the input row, as a struct (field names may equal bronze's column names)
REASON, MESSAGE = "_reason", "_message"


def _path(name: str) -> str:
    return f"'$.{name}'"


def _typed(f: Field, i: int) -> dict:
    """Spark SQL for one field: its typed value, whether its JSON type fits, whether a
    time parses. Column names are internal (``_t{i}`` the JSON type, ``_x{i}`` text)."""
    from pyspark.sql import functions as F

    t, get = f"_t{i}", lambda sql_type: f"try_variant_get(_v, {_path(f.name)}, '{sql_type}')"
    kind = f.type.kind
    is_number = F.col(t).rlike(NUMBER)
    if kind in ("string", "boolean"):
        value = F.expr(get(kind))
        fits = F.col(t) == kind.upper()
        time_ok = None
    elif kind in ("int", "bigint"):
        value = F.expr(get(kind))
        exact = F.expr(get("decimal(38,18)"))
        fits = is_number & value.isNotNull() & exact.isNotNull() & (value.cast("decimal(38,18)") == exact)
        time_ok = None
    elif kind == "double":
        value = F.expr(get("double"))
        fits = is_number & value.isNotNull()
        time_ok = None
    elif kind == "decimal":
        scale = max(f.type.scale, 18)
        value = F.expr(get(f.type.sql))
        exact = F.expr(get(f"decimal(38,{scale})"))
        fits = is_number & value.isNotNull() & exact.isNotNull() & (value.cast(f"decimal(38,{scale})") == exact)
        time_ok = None
    elif kind == "date":
        text = F.col(f"_x{i}")
        value = F.when(text.rlike(ISO_DATE), F.expr(f"try_cast(_x{i} AS date)"))
        fits = F.col(t) == "STRING"
        time_ok = value.isNotNull()
    else:  # timestamp: ISO-8601 with an offset, or epoch milliseconds
        text = F.col(f"_x{i}")
        millis = F.expr(get("bigint"))
        lo, hi = EPOCH_MS_RANGE
        value = (F.when(F.col(t) == "STRING",
                        F.when(text.rlike(ISO_WITH_OFFSET), F.expr(f"try_cast(_x{i} AS timestamp)")))
                 .when(F.col(t).rlike(INTEGER) & millis.between(lo, hi), F.timestamp_millis(millis)))
        fits = (F.col(t) == "STRING") | F.col(t).rlike(INTEGER)
        time_ok = value.isNotNull()
    return {"value": value, "fits": fits, "time_ok": time_ok}


def parse_events(bronze, definition: PipelineDefinition):
    """Typed events and reject reasons for a DataFrame with bronze's columns (``value``,
    ``timestamp``, lineage; extra columns are carried along).

    Output: the input row as the struct column ``_bronze``; one column per declared
    field with its declared type (null unless the record is valid); ``_reason`` (null
    for a valid event) and ``_message``. Nothing is dropped.
    """
    from pyspark.sql import functions as F

    fields = definition.fields
    df = bronze.select(F.struct(*[F.col(f"`{c}`") for c in bronze.columns]).alias(BRONZE))
    df = df.withColumn("_v", F.expr(f"try_parse_json(CAST({BRONZE}.value AS STRING))"))
    df = df.withColumns({"_schema": F.expr("schema_of_variant(_v)"),
                         **{f"_t{i}": F.expr(f"schema_of_variant(variant_get(_v, {_path(f.name)}))")
                            for i, f in enumerate(fields)},
                         **{f"_x{i}": F.expr(f"try_variant_get(_v, {_path(f.name)}, 'string')")
                            for i, f in enumerate(fields) if f.type.kind in ("date", "timestamp")}})
    typed = {f.name: _typed(f, i) for i, f in enumerate(fields)}
    present = {f.name: F.col(f"_t{i}").isNotNull() & (F.col(f"_t{i}") != "VOID") for i, f in enumerate(fields)}
    df = df.withColumns({
        **{f"_p{i}": present[f.name] for i, f in enumerate(fields)},
        **{f"_ok{i}": typed[f.name]["fits"] for i, f in enumerate(fields)},
        **{f"_tok{i}": typed[f.name]["time_ok"] for i, f in enumerate(fields) if typed[f.name]["time_ok"] is not None},
    })
    # Typed values, by the fields' own names (rules refer to them); null where absent.
    df = df.withColumns({f.name: F.when(F.col(f"_p{i}") & F.col(f"_ok{i}"), typed[f.name]["value"])
                         for i, f in enumerate(fields)})
    idx = {f.name: i for i, f in enumerate(fields)}
    required = [idx[n] for n in definition.required]
    times = [i for i, f in enumerate(fields) if f.type.kind in ("date", "timestamp")]
    missing = " OR ".join(f"NOT _p{i}" for i in required) or "false"
    wrong = " OR ".join(f"(_p{i} AND NOT coalesce(_ok{i}, false))" for i in range(len(fields))) or "false"
    bad_time = " OR ".join(f"(_p{i} AND NOT _tok{i})" for i in times) or "false"
    event_time = f"`{definition.event_time}`"
    future = f"{event_time} > {BRONZE}.timestamp + make_dt_interval(0, 0, 0, {definition.max_future_ms / 1000})"
    branches = [("not_json", "_v IS NULL"), ("not_object", "NOT startswith(_schema, 'OBJECT')"),
                ("missing_field", missing), ("wrong_type", wrong), ("invalid_timestamp", bad_time),
                ("far_future", future)]
    branches += [(r.name, f"NOT coalesce(({r.check}), false)") for r in definition.rules]
    reason = "CASE " + " ".join(f"WHEN {cond} THEN '{name}'" for name, cond in branches) + " END"
    df = df.withColumn(REASON, F.expr(reason))
    df = df.withColumn(MESSAGE, F.expr(_message_sql(definition, branches)))
    valid = F.col(REASON).isNull()
    df = df.withColumns({f.name: F.when(valid, F.col(f.name)) for f in fields})
    return df.select(BRONZE, *[f"`{f.name}`" for f in fields], REASON, MESSAGE)


def _names_where(condition_of, indexes, label_of) -> str:
    """SQL: the labels of the fields whose condition holds, comma-separated."""
    parts = [f"IF({condition_of(i)}, {label_of(i)}, NULL)" for i in indexes]
    return f"concat_ws(', ', {', '.join(parts)})" if parts else "''"


def _sql_text(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _type_name(sql: str) -> str:
    """SQL: a variant type name (``schema_of_variant``: ``BIGINT``, ``ARRAY<STRING>``...) in
    lower case, ASCII letters only. Not ``lower()``: Spark 4 maps case with ICU, whose tables
    a JVM builds on its first ``lower()`` call, 1.3 s on an idle core and about 2 s on a busy
    one: every new executor paid it in its first batch holding a record of the wrong JSON type."""
    return f"translate({sql}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"


def _message_sql(definition: PipelineDefinition, branches) -> str:
    fields = definition.fields
    idx = {f.name: i for i, f in enumerate(fields)}
    required = [idx[n] for n in definition.required]
    times = [i for i, f in enumerate(fields) if f.type.kind in ("date", "timestamp")]
    missing = _names_where(lambda i: f"NOT _p{i}", required, lambda i: _sql_text(fields[i].name))
    wrong = _names_where(lambda i: f"_p{i} AND NOT coalesce(_ok{i}, false)", range(len(fields)),
                         lambda i: f"concat({_sql_text(fields[i].name + ' is JSON ')}, {_type_name(f'_t{i}')}, "
                                   f"{_sql_text(', not ' + fields[i].type.sql)})")
    bad_time = _names_where(lambda i: f"_p{i} AND NOT _tok{i}", times,
                            lambda i: f"concat({_sql_text(fields[i].name + ' ')}, '\"', _x{i}, '\"')")
    event_time = f"`{definition.event_time}`"
    future = format_duration_ms(definition.max_future_ms)
    cases = {
        "not_json": f"CASE WHEN {BRONZE}.value IS NULL OR length({BRONZE}.value) = 0 THEN 'the value is empty' "
                    "ELSE 'the value is not valid JSON' END",
        "not_object": f"concat('the value is JSON ', {_type_name('_schema')}, ', not an object')",
        "missing_field": f"concat('missing or null: ', {missing})",
        "wrong_type": f"concat('wrong JSON type: ', {wrong})",
        "invalid_timestamp": f"concat('not a valid time (timestamps: ISO-8601 with a UTC offset or epoch "
                             f"milliseconds; dates: YYYY-MM-DD): ', {bad_time})",
        "far_future": f"concat({_sql_text(definition.event_time + ' ')}, CAST({event_time} AS STRING), "
                      f"{_sql_text(f' is more than {future} after the Kafka timestamp ')}, "
                      f"CAST({BRONZE}.timestamp AS STRING))",
    }
    for rule in definition.rules:
        cases[rule.name] = (f"concat('rule {rule.name} is ', IF(({rule.check}) IS NULL, 'NULL', 'false'), "
                            f"{_sql_text(': ' + rule.check)})")
    return f"CASE {REASON} " + " ".join(f"WHEN '{name}' THEN {cases[name]}" for name, _ in branches) + " END"
