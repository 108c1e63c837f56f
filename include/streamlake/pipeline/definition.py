"""Pipeline definitions: one YAML file describes a pipeline, every stage derives from it.

A definition names the topics, the record format, the fields with their Spark
SQL types, which field holds the event time (and the event id used for
de-duplication), the rules a valid record must meet and the aggregates (one
gold table each) the pipeline keeps. Silver, quarantine, gold, late events,
backfills, the checks, the quality suites, the DAGs and the views are all
derived from it (README, *Pipeline definitions*)::

    name: clicks
    topics: [clicks]
    format: json
    event_time: clicked_at
    event_id: click_id
    schema: {click_id: string, page: string, dwell_ms: bigint, clicked_at: timestamp, ...}
    optional: [referrer]
    rules:
      - {name: dwell_not_negative, check: "dwell_ms >= 0"}
    aggregates:
      - name: per_page_1m
        keys: [page]
        window: tumbling:1m
        allowed_lateness: 30s
        measures: {clicks: count(*), dwell: sum(dwell_ms)}

:func:`load_definition` reads and checks a file without Spark (its rules
statically: :mod:`streamlake.pipeline.rules`) and raises
:class:`DefinitionError` naming the key that is wrong;
:func:`streamlake.pipeline.definition_check.check_definition` adds what only
Spark's analyzer finds, before a command writes anything. :meth:`PipelineDefinition.to_dict` is the
normal form that is stored with a pipeline's tables and compared when the
definition changes (:mod:`streamlake.pipeline.evolution`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streamlake.errors import InvalidOptionError, StreamLakeError
from streamlake.pipeline.rules import static_rule_problem
from streamlake.pipeline.types import FieldType, parse_type
from streamlake.pipeline.windows import WindowSpec, format_duration_ms, parse_duration_ms

FORMATS = ("json",)  # the record value's encoding; a decoder per format (avro can follow)
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
AGGREGATE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
MEASURE = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(\*|[A-Za-z][A-Za-z0-9_]*)\s*\)\s*$", re.IGNORECASE)
MEASURE_FUNCTIONS = ("count", "sum", "min", "max", "avg")
DEFAULT_DEDUP_HORIZON = "24h"
DEFAULT_MAX_FUTURE = "1h"
TOP_LEVEL_KEYS = ("name", "description", "topics", "topic_pattern", "format", "event_time", "event_id",
                  "dedup_horizon", "max_future", "schema", "optional", "rules", "aggregates", "datagen")
AGGREGATE_KEYS = ("name", "keys", "window", "allowed_lateness", "measures")
# Columns the platform adds to silver, late_events and gold: a field may not take their names.
RESERVED_COLUMNS = frozenset({
    "topic", "partition", "offset", "kafka_timestamp", "bronze_version", "event_date",  # silver lineage
    "watermark", "windows", "silver_version", "batch_id", "arrived_at", "applied", "applied_at",  # late_events
    "applied_by", "window_start", "window_end", "updated_at", "window_date",  # gold
})
# Quarantine reasons the platform checks, in order, before the definition's rules.
BASE_REASONS: dict[str, str] = {
    "not_json": "the value is not valid JSON (or is empty)",
    "not_object": "the value is JSON but not an object",
    "missing_field": "a required field is missing or null",
    "wrong_type": "a field's JSON value does not convert to its declared type without loss",
    "invalid_timestamp": "a timestamp or date field is not ISO-8601 (timestamps: with a UTC offset, "
                         "or epoch milliseconds)",
    "far_future": "the event time is further ahead of the record's Kafka timestamp than max_future",
}


class DefinitionError(StreamLakeError, ValueError):
    """A definition is not valid. ``key`` names where (``schema.page``,
    ``aggregates[1].measures.dwell``); the message says what is wrong."""

    def __init__(self, key: str, message: str, source: str | None = None):
        self.key, self.message, self.source = key, message, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}")


class DefinitionFilesError(StreamLakeError):
    """Definition files that do not load: ``errors`` maps each file to why (a
    DefinitionError's text, which names the file and the key). The message has a line each."""

    def __init__(self, errors: Mapping[Path, str]):
        self.errors = dict(errors)
        lines = [why if why.startswith(str(path)) else f"{path}: {why}" for path, why in self.errors.items()]
        super().__init__(f"{len(lines)} pipeline definition file(s) do not load:\n" + "\n".join(lines))


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    required: bool


@dataclass(frozen=True)
class Rule:
    """A row passes when ``check`` (Spark SQL over the typed fields) is TRUE; FALSE or
    NULL sends it to quarantine with ``name`` as the reason."""

    name: str
    check: str


@dataclass(frozen=True)
class Measure:
    """One output column of a gold table: ``function(field)`` (``field`` None for count(*))."""

    column: str
    function: str
    field: str | None

    @property
    def expression(self) -> str:
        return f"{self.function}({self.field or '*'})"


@dataclass(frozen=True)
class Aggregate:
    """One gold table: per ``keys`` and event-time window, the ``measures``."""

    name: str
    keys: tuple[str, ...]
    window: WindowSpec
    allowed_lateness_ms: int
    measures: tuple[Measure, ...]

    @property
    def gold_table(self) -> str:
        return f"gold/{self.name}"

    @property
    def late_table(self) -> str:
        return f"late_events/{self.name}"

    @property
    def stage(self) -> str:
        """The name of the streaming stage that maintains it (also its checkpoint's)."""
        return f"gold/{self.name}"

    def to_dict(self) -> dict:
        return {"name": self.name, "keys": list(self.keys), "window": str(self.window),
                "allowed_lateness": format_lateness(self.allowed_lateness_ms),
                "measures": {m.column: m.expression for m in self.measures}}


@dataclass(frozen=True)
class PipelineDefinition:
    name: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    format: str
    event_time: str
    event_id: str | None
    dedup_horizon_ms: int
    max_future_ms: int
    fields: tuple[Field, ...]
    rules: tuple[Rule, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    description: str = ""
    datagen: Mapping = field(default_factory=dict, compare=False)
    source: str | None = field(default=None, compare=False)

    # -- derived -----------------------------------------------------------------------

    def field(self, name: str) -> Field:
        try:
            return next(f for f in self.fields if f.name == name)
        except StopIteration:
            raise KeyError(f"pipeline {self.name} has no field {name!r}") from None

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def required(self) -> list[str]:
        return [f.name for f in self.fields if f.required]

    def aggregate(self, name: str) -> Aggregate:
        try:
            return next(a for a in self.aggregates if a.name == name)
        except StopIteration:
            known = ", ".join(a.name for a in self.aggregates) or "none"
            raise InvalidOptionError(f"pipeline {self.name} has no aggregate {name!r} (its aggregates: {known})") \
                from None

    def quarantine_reasons(self) -> dict[str, str]:
        """Every reason code a quarantined record of this pipeline can carry, in the order checked."""
        return {**BASE_REASONS, **{r.name: f"rule {r.name}: {r.check}" for r in self.rules}}

    def table_names(self) -> list[str]:
        """Every table of the pipeline, in pipeline order."""
        names = ["bronze", "silver", "quarantine"]
        for agg in self.aggregates:
            names += [agg.gold_table, agg.late_table]
        return names

    def to_dict(self) -> dict:
        """The normal form: what is stored with the tables and compared on a change."""
        return {
            "name": self.name, "description": self.description, "topics": list(self.topics),
            "topic_pattern": self.topic_pattern, "format": self.format, "event_time": self.event_time,
            "event_id": self.event_id, "dedup_horizon": format_duration_ms(self.dedup_horizon_ms),
            "max_future": format_duration_ms(self.max_future_ms),
            "schema": {f.name: f.type.sql for f in self.fields},
            "optional": [f.name for f in self.fields if not f.required],
            "rules": [{"name": r.name, "check": r.check} for r in self.rules],
            "aggregates": [a.to_dict() for a in self.aggregates],
            "datagen": dict(self.datagen),
        }

    def summary(self) -> str:
        """A one-screen description: tables, reasons, aggregates (``pipeline validate``)."""
        source = ", ".join(self.topics) if self.topics else f"topics matching {self.topic_pattern!r}"
        lines = [f"pipeline {self.name}: {self.format} records from {source}",
                 f"  event time {self.event_time}; "
                 + (f"de-duplicated by {self.event_id} within {format_duration_ms(self.dedup_horizon_ms)}"
                    if self.event_id else "no de-duplication (no event_id)")
                 + f"; at most {format_duration_ms(self.max_future_ms)} ahead of the Kafka timestamp",
                 "  fields: " + ", ".join(f"{f.name} {f.type}{'' if f.required else ' (optional)'}"
                                          for f in self.fields),
                 "  quarantine reasons, in order: " + ", ".join(self.quarantine_reasons())]
        for rule in self.rules:
            lines.append(f"    rule {rule.name}: {rule.check}")
        lines.append("  tables: " + ", ".join(self.table_names()))
        for agg in self.aggregates:
            per = f"per {', '.join(agg.keys)} and" if agg.keys else "all events, per"
            measures = ", ".join(f"{m.column} = {m.expression}" for m in agg.measures)
            lines.append(f"    gold/{agg.name}: {per} {agg.window} window (allowed lateness "
                         f"{format_lateness(agg.allowed_lateness_ms)}): {measures}")
        return "\n".join(lines)


# -- parsing --------------------------------------------------------------------------------------

def parse_lateness_ms(text, what: str = "allowed lateness") -> int:
    """Like :func:`parse_duration_ms`, but zero (``0s``) is allowed."""
    if str(text).strip() in ("0", "0s", "0ms", "0m"):
        return 0
    return parse_duration_ms(text, what)


def format_lateness(ms: int) -> str:
    return "0s" if ms == 0 else format_duration_ms(ms)


def _names(value, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DefinitionError(key, f"must be a list of names, got {value!r}")
    return list(value)


def _duration(data: Mapping, key: str, default: str, parse=parse_duration_ms) -> int:
    value = data.get(key, default)
    try:
        return parse(value, key)
    except InvalidOptionError as exc:
        raise DefinitionError(key, str(exc)) from None


def _fields(data: Mapping) -> tuple[Field, ...]:
    schema = data.get("schema")
    if not isinstance(schema, Mapping) or not schema:
        raise DefinitionError("schema", "must map each field to its type, e.g. {click_id: string, "
                                        "price: decimal(12,2), clicked_at: timestamp}")
    optional = _names(data.get("optional"), "optional")
    lowered: dict[str, str] = {}
    out = []
    for name, type_text in schema.items():
        key = f"schema.{name}"
        name = str(name)
        if not FIELD_NAME.match(name):
            raise DefinitionError(key, "a field name starts with a letter and has only letters, digits and _")
        if name.lower() in RESERVED_COLUMNS:
            raise DefinitionError(key, f"{name!r} is a column the platform adds (reserved: "
                                       f"{', '.join(sorted(RESERVED_COLUMNS))}); rename the field")
        if name.lower() in lowered:
            raise DefinitionError(key, f"duplicate field name: {lowered[name.lower()]!r} and {name!r} differ only "
                                       "in case (Spark SQL compares names without case)")
        lowered[name.lower()] = name
        try:
            ftype = parse_type(type_text)
        except InvalidOptionError as exc:
            raise DefinitionError(key, str(exc)) from None
        out.append(Field(name, ftype, name not in optional))
    for name in optional:
        if name not in schema:
            raise DefinitionError("optional", f"{name!r} is not a field of schema")
    return tuple(out)


def _rules(data: Mapping, fields: tuple[Field, ...]) -> tuple[Rule, ...]:
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise DefinitionError("rules", "must be a list of {name, check}")
    out: list[Rule] = []
    for i, rule in enumerate(rules):
        key = f"rules[{i}]"
        if not isinstance(rule, Mapping) or set(rule) - {"name", "check"}:
            raise DefinitionError(key, f"a rule is {{name: ..., check: \"<Spark SQL boolean expression>\"}}, "
                                       f"got {rule!r}")
        name, check = rule.get("name"), rule.get("check")
        if not isinstance(name, str) or not AGGREGATE_NAME.match(name):
            raise DefinitionError(f"{key}.name", f"a rule needs a name of lowercase letters, digits and _ "
                                                 f"(it is the quarantine reason), got {name!r}")
        if name in BASE_REASONS:
            raise DefinitionError(f"{key}.name", f"{name!r} is a reason the platform checks itself; choose "
                                                 "another name")
        if any(r.name == name for r in out):
            raise DefinitionError(f"{key}.name", f"duplicate rule name {name!r}")
        if not isinstance(check, str) or not check.strip():
            raise DefinitionError(f"{key}.check", "must be a Spark SQL boolean expression over the fields, "
                                                  "e.g. \"dwell_ms >= 0\"")
        problem = static_rule_problem(check.strip(), {f.name: f.type for f in fields})
        if problem:
            raise DefinitionError(f"{key}.check", f"rule {name}: {check.strip()!r}: {problem}")
        out.append(Rule(name, check.strip()))
    return tuple(out)


def _measures(value, key: str, fields: dict[str, Field], keys: tuple[str, ...]) -> tuple[Measure, ...]:
    if not isinstance(value, Mapping) or not value:
        raise DefinitionError(key, "must map output columns to count(*), count(f), sum(f), min(f), max(f) or "
                                   "avg(f)")
    out = []
    for column, expression in value.items():
        mkey = f"{key}.{column}"
        column = str(column)
        if not FIELD_NAME.match(column):
            raise DefinitionError(mkey, "an output column starts with a letter and has only letters, digits and _")
        if column.lower() in RESERVED_COLUMNS or column.lower() in {k.lower() for k in keys}:
            raise DefinitionError(mkey, f"{column!r} is taken by a key or a column gold adds "
                                        "(window_start, window_end, updated_at, window_date)")
        if any(m.column.lower() == column.lower() for m in out):
            raise DefinitionError(mkey, f"duplicate output column {column!r}")
        match = MEASURE.match(str(expression))
        if not match:
            raise DefinitionError(mkey, f"{expression!r} is not one of count(*), count(f), sum(f), min(f), "
                                        "max(f), avg(f)")
        function, arg = match.group(1).lower(), match.group(2)
        if arg == "*":
            if function != "count":
                raise DefinitionError(mkey, f"{function}(*) is not a measure; only count(*) takes *")
            out.append(Measure(column, "count", None))
            continue
        if arg not in fields:
            raise DefinitionError(mkey, f"{expression!r}: {arg!r} is not a declared field")
        ftype = fields[arg].type
        if function in ("sum", "avg") and not ftype.numeric:
            raise DefinitionError(mkey, f"{expression!r}: {arg} is {ftype}, not a numeric field "
                                        "(int, bigint, double, decimal)")
        if function in ("min", "max") and not ftype.orderable:
            raise DefinitionError(mkey, f"{expression!r}: {arg} is {ftype}; min and max need numbers, strings, "
                                        "dates or timestamps")
        out.append(Measure(column, function, arg))
    return tuple(out)


def _aggregates(data: Mapping, fields: tuple[Field, ...]) -> tuple[Aggregate, ...]:
    aggregates = data.get("aggregates") or []
    if not isinstance(aggregates, list):
        raise DefinitionError("aggregates", "must be a list of aggregates (name, keys, window, allowed_lateness, "
                                            "measures)")
    by_name = {f.name: f for f in fields}
    out: list[Aggregate] = []
    for i, agg in enumerate(aggregates):
        key = f"aggregates[{i}]"
        if not isinstance(agg, Mapping):
            raise DefinitionError(key, f"must be a mapping, got {agg!r}")
        unknown = sorted(set(map(str, agg)) - set(AGGREGATE_KEYS))
        if unknown:
            raise DefinitionError(f"{key}.{unknown[0]}", f"unknown key (known: {', '.join(AGGREGATE_KEYS)})")
        name = agg.get("name")
        if not isinstance(name, str) or not AGGREGATE_NAME.match(name):
            raise DefinitionError(f"{key}.name", f"an aggregate needs a name of lowercase letters, digits and _ "
                                                 f"(its table is gold/<name>), got {name!r}")
        if any(a.name == name for a in out):
            raise DefinitionError(f"{key}.name", f"duplicate aggregate name {name!r}")
        keys = tuple(_names(agg.get("keys"), f"{key}.keys"))
        for k in keys:
            if k not in by_name:
                raise DefinitionError(f"{key}.keys", f"{k!r} is not a declared field")
            if not by_name[k].required:
                raise DefinitionError(f"{key}.keys", f"{k!r} is optional; a key must be a required field "
                                                     "(a window's key is never null)")
        if len(set(keys)) != len(keys):
            raise DefinitionError(f"{key}.keys", f"a key is listed twice: {list(keys)}")
        if "window" not in agg:
            raise DefinitionError(f"{key}.window", "missing: tumbling:D | sliding:D,SLIDE | session:GAP")
        try:
            window = WindowSpec.parse(agg["window"])
        except InvalidOptionError as exc:
            raise DefinitionError(f"{key}.window", str(exc)) from None
        try:
            lateness = parse_lateness_ms(agg.get("allowed_lateness", "0s"), "allowed lateness")
        except InvalidOptionError as exc:
            raise DefinitionError(f"{key}.allowed_lateness", str(exc)) from None
        measures = _measures(agg.get("measures"), f"{key}.measures", by_name, keys)
        out.append(Aggregate(name, keys, window, lateness, measures))
    return tuple(out)


def parse_definition(data, source: str | None = None) -> PipelineDefinition:
    """A definition from its parsed YAML (a mapping). Raises DefinitionError naming the key."""
    try:
        return _parse(data)
    except DefinitionError as exc:
        if source and not exc.source:
            raise DefinitionError(exc.key, exc.message, source) from None
        raise


def _parse(data) -> PipelineDefinition:
    if not isinstance(data, Mapping):
        raise DefinitionError("(top level)", "a definition is a YAML mapping (name, topics, schema, ...)")
    unknown = sorted(set(map(str, data)) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise DefinitionError(unknown[0], f"unknown key (known: {', '.join(TOP_LEVEL_KEYS)})")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise DefinitionError("name", f"must match [a-z][a-z0-9_-]* (it names the job, its DAGs and tables), "
                                      f"got {name!r}")
    topics = _names(data.get("topics"), "topics")
    pattern = data.get("topic_pattern")
    if bool(topics) == bool(pattern):
        raise DefinitionError("topics", "give exactly one of topics (a list) or topic_pattern (a regex)")
    if pattern is not None:
        try:
            re.compile(str(pattern))
        except re.error as exc:
            raise DefinitionError("topic_pattern", f"not a regular expression: {exc}") from None
    fmt = str(data.get("format", "json")).lower()
    if fmt not in FORMATS:
        raise DefinitionError("format", f"unknown format {data.get('format')!r} (supported: {', '.join(FORMATS)})")
    fields = _fields(data)
    by_name = {f.name: f for f in fields}
    event_time = data.get("event_time")
    if event_time not in by_name:
        raise DefinitionError("event_time", f"must name a declared field of type timestamp, got {event_time!r}")
    if by_name[event_time].type.kind != "timestamp":
        raise DefinitionError("event_time", f"{event_time} is {by_name[event_time].type}; the event time must be "
                                            "a timestamp field (ISO-8601 with offset, or epoch milliseconds)")
    if not by_name[event_time].required:
        raise DefinitionError("event_time", f"{event_time} is optional; the event time must be required")
    event_id = data.get("event_id")
    if event_id is not None:
        if event_id not in by_name:
            raise DefinitionError("event_id", f"must name a declared field, got {event_id!r}")
        if not by_name[event_id].required:
            raise DefinitionError("event_id", f"{event_id} is optional; the de-duplication key must be required")
        if by_name[event_id].type.kind not in ("string", "int", "bigint"):
            raise DefinitionError("event_id", f"{event_id} is {by_name[event_id].type}; an event id is a string, "
                                              "int or bigint")
    dedup = _duration(data, "dedup_horizon", DEFAULT_DEDUP_HORIZON)
    max_future = _duration(data, "max_future", DEFAULT_MAX_FUTURE)
    rules = _rules(data, fields)
    aggregates = _aggregates(data, fields)
    datagen = data.get("datagen") or {}
    if not isinstance(datagen, Mapping):
        raise DefinitionError("datagen", "must be a mapping (see README, Pipeline definitions)")
    description = data.get("description") or ""
    return PipelineDefinition(name, tuple(topics), str(pattern) if pattern else None, fmt, event_time, event_id,
                              dedup, max_future, fields, rules, aggregates, str(description), dict(datagen))


def load_definition(path: str | Path) -> PipelineDefinition:
    """Read and check a definition file. Raises DefinitionError (key and message), also for
    a file that is missing or not YAML."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError("(file)", f"cannot read: {exc.strerror or exc}", str(path)) from None
    try:  # libyaml's parser where PyYAML has it: the same documents, about 9x as fast (0.5 against 4.3 ms)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise DefinitionError("(file)", f"not valid YAML: {exc}", str(path)) from None
    definition = parse_definition(data, str(path))
    return _with_source(definition, str(path.absolute()))


def _with_source(definition: PipelineDefinition, source: str) -> PipelineDefinition:
    from dataclasses import replace

    return replace(definition, source=source)
