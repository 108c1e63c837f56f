"""Pipeline definitions: both examples load; every class of mistake is refused with a message
naming the key, and nothing is created (``streamlake pipeline validate`` and ``pipeline run``).
No field name of either example appears in the platform's code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamlake.pipeline.definition import DefinitionError, load_definition

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {p.stem: p for p in sorted((ROOT / "pipelines").glob("*.yaml"))}
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


def orders() -> dict:
    return yaml.safe_load(EXAMPLES["orders"].read_text())


def write(tmp_path: Path, data: dict, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def files_under(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs if d.exists() for p in d.rglob("*")}


def test_both_examples_load_and_describe_their_tables(spark):
    from streamlake.pipeline.definition_check import checked_definition

    assert set(EXAMPLES) == {"orders", "sensors"}
    orders_def = checked_definition(EXAMPLES["orders"], spark)
    assert orders_def.table_names() == ["bronze", "silver", "quarantine", "gold/revenue_5m", "late_events/revenue_5m",
                                        "gold/activity", "late_events/activity"]
    assert list(orders_def.quarantine_reasons()) == ["not_json", "not_object", "missing_field", "wrong_type",
                                                     "invalid_timestamp", "far_future", "positive_amount",
                                                     "known_currency"]
    assert orders_def.field("amount").type.sql == "decimal(12,2)" and not orders_def.field("coupon").required
    activity = orders_def.aggregate("activity")
    assert activity.keys == () and activity.window.is_session
    sensors = checked_definition(EXAMPLES["sensors"], spark)
    assert [a.name for a in sensors.aggregates] == ["per_minute"]
    summary = orders_def.summary()
    for part in ("gold/revenue_5m", "session:2m", "positive_amount", "decimal(12,2)", "coupon string (optional)"):
        assert part in summary


def _mutate(path: str, value):
    """The orders example with the value at ``path`` (dotted, [i] for lists) set (None: removed)."""
    data = orders()
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = data
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    last = parts[-1]
    key = int(last[1:-1]) if last.startswith("[") else last
    if value is None:
        del node[key]
    else:
        node[key] = value
    return data


# (what is wrong, the change, the key the error names, words the message has)
MISTAKES = [
    ("unknown type", ("schema.amount", "money"), "schema.amount", "unknown type 'money'"),
    ("decimal precision", ("schema.amount", "decimal(40,2)"), "schema.amount", "precision must be 1..38"),
    ("field names differing in case", ("schema.Amount", "int"), "schema.Amount", "duplicate field name"),
    ("reserved column name", ("schema.offset", "bigint"), "schema.offset", "reserved"),
    ("unknown top-level key", ("colour", "blue"), "colour", "unknown key"),
    ("event time not a timestamp", ("event_time", "currency"), "event_time", "must be a timestamp field"),
    ("event time undeclared", ("event_time", "when"), "event_time", "must name a declared field"),
    ("optional event id", ("optional", ["coupon", "order_id"]), "event_id", "optional"),
    ("bad duration", ("dedup_horizon", "a day"), "dedup_horizon", "must look like"),
    ("bad window", ("aggregates[0].window", "hopping:5m"), "aggregates[0].window", "tumbling:SIZE"),
    ("bad lateness", ("aggregates[1].allowed_lateness", "-1m"), "aggregates[1].allowed_lateness", "must look like"),
    ("measure over an undeclared field", ("aggregates[0].measures.revenue", "sum(price)"),
     "aggregates[0].measures.revenue", "'price' is not a declared field"),
    ("measure over a non-numeric field", ("aggregates[0].measures.revenue", "sum(currency)"),
     "aggregates[0].measures.revenue", "not a numeric field"),
    ("not a measure", ("aggregates[0].measures.revenue", "median(amount)"), "aggregates[0].measures.revenue",
     "not one of count(*)"),
    ("duplicate aggregate names", ("aggregates[1].name", "revenue_5m"), "aggregates[1].name",
     "duplicate aggregate name"),
    ("duplicate rule names", ("rules[1].name", "positive_amount"), "rules[1].name", "duplicate rule name"),
    ("key not declared", ("aggregates[0].keys", ["shop"]), "aggregates[0].keys", "'shop' is not a declared field"),
    ("optional key", ("aggregates[0].keys", ["coupon"]), "aggregates[0].keys", "a key must be a required field"),
    ("topics and a pattern", ("topic_pattern", "orders-.*"), "topics", "exactly one of topics"),
    ("a bad name", ("name", "Orders!"), "name", "must match"),
]


@pytest.mark.parametrize("what, change, key, words", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_definition_mistake_is_refused_naming_the_key(tmp_path, what, change, key, words):
    path = write(tmp_path, _mutate(*change))
    with pytest.raises(DefinitionError) as err:
        load_definition(path)
    assert err.value.key == key, str(err.value)
    assert words in err.value.message, str(err.value)
    assert str(err.value).startswith(f"{path}: {key}: "), "the message names the file and the key"


# Rule mistakes found when the file is read, without Spark (sqlglot; every reader: the CLI, the
# DAG processor, the views), and those only Spark's analyzer finds (before a command writes anything).
STATIC_RULE_MISTAKES = [
    ("a column that is not a field", "price > 0", "price is not a declared field"),
    ("a qualified column", "t.amount > 0", "t.amount is not a declared field"),
    ("not boolean: a number", "amount * 2", "computes a number, not a boolean"),
    ("not boolean: a string", "upper(currency)", "computes a string, not a boolean"),
    ("an aggregate function", "sum(amount) > 0", "aggregate, window or generator function"),
    ("a window function", "row_number() OVER (ORDER BY amount) = 1", "aggregate, window or generator function"),
]
SPARK_RULE_MISTAKES = [
    ("not SQL", "amount >", "PARSE_SYNTAX_ERROR"),
    ("an unknown function", "no_such_function(amount) > 0", "UNRESOLVED_ROUTINE"),
    ("not boolean, by type only Spark knows", "nvl2(coupon, amount, amount)", "not a boolean"),
]
# Rules Spark accepts must pass the static check too: it refuses only what it is sure of.
VALID_RULES = ["amount > 0", "Amount > 0", "currency RLIKE '^[A-Z]{3}$' AND coupon IS NULL OR length(coupon) > 2",
               "exists(array(1, 2), x -> x < amount)", "try_cast(currency AS int) IS NULL",
               "placed_at > TIMESTAMP'2020-01-01 00:00:00'", "coalesce(coupon, 'none') != ''",
               "CASE WHEN amount > 100 THEN coupon IS NOT NULL ELSE true END", "amount <=> 1 OR amount BETWEEN 2 AND 3"]


@pytest.mark.parametrize("what, check, words", STATIC_RULE_MISTAKES, ids=[m[0] for m in STATIC_RULE_MISTAKES])
def test_a_rule_mistake_is_refused_when_the_file_is_read_without_spark(tmp_path, what, check, words):
    path = write(tmp_path, _mutate("rules[0].check", check))
    with pytest.raises(DefinitionError) as err:
        load_definition(path)
    assert err.value.key == "rules[0].check" and "positive_amount" in err.value.message, str(err.value)
    assert words in err.value.message, str(err.value)
    assert str(err.value).startswith(f"{path}: rules[0].check: "), "the message names the file and the key"


@pytest.mark.parametrize("what, check, words", SPARK_RULE_MISTAKES, ids=[m[0] for m in SPARK_RULE_MISTAKES])
def test_a_rule_mistake_only_spark_finds_is_refused_by_the_whole_check(spark, tmp_path, what, check, words):
    from streamlake.pipeline.definition_check import checked_definition

    path = write(tmp_path, _mutate("rules[0].check", check))
    load_definition(path)  # the static check leaves it to Spark
    with pytest.raises(DefinitionError) as err:
        checked_definition(path, spark)
    assert err.value.key == "rules[0].check" and "positive_amount" in err.value.message, str(err.value)
    assert words in err.value.message, str(err.value)


def test_rules_spark_accepts_pass_both_checks(spark, tmp_path):
    from streamlake.pipeline.definition_check import check_rules

    data = orders()
    data["rules"] = [{"name": f"r{i}", "check": check} for i, check in enumerate(VALID_RULES)]
    data["datagen"].pop("violations")
    definition = load_definition(write(tmp_path, data))
    check_rules(spark, definition)  # Spark agrees: none of these is a mistake


def test_the_cli_exits_2_naming_the_key_and_creates_nothing(tmp_path):
    """`pipeline validate` and `pipeline run` with a wrong definition: exit 2, a message that
    names the file and the key, and no file under the root or the home."""
    home, root = tmp_path / "home", tmp_path / "lake"
    env = {**os.environ, "STREAMLAKE_HOME": str(home)}
    good = subprocess.run([STREAMLAKE, "pipeline", "validate", str(EXAMPLES["orders"])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert "gold/revenue_5m: per customer and tumbling:5m window" in good.stdout
    before = files_under(home)
    bad = write(tmp_path, _mutate("aggregates[0].measures.revenue", "sum(currency)"))
    for command in (["pipeline", "validate", str(bad)],
                    ["pipeline", "run", "--definition", str(bad), "--root", str(root), "--available-now"]):
        done = subprocess.run([STREAMLAKE, *command], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert f"{bad}: aggregates[0].measures.revenue: " in done.stderr and "not a numeric field" in done.stderr
        assert not root.exists(), f"{command[1]} created {files_under(root)}"
        assert files_under(home) == before, f"{command[1]} created {files_under(home) - before}"


def test_a_rule_mistake_is_found_by_the_cli_before_anything_is_created(tmp_path):
    home = tmp_path / "home"
    bad = write(tmp_path, _mutate("rules[1].check", "currency IN ('EUR', 'USD') AND colour = 'red'"))
    done = subprocess.run([STREAMLAKE, "pipeline", "validate", str(bad)], capture_output=True, text=True,
                          env={**os.environ, "STREAMLAKE_HOME": str(home)}, timeout=180)
    assert done.returncode == 2, done.stderr
    assert f"{bad}: rules[1].check: rule known_currency" in done.stderr and "colour" in done.stderr
    assert not any(p.is_file() for p in home.rglob("*") if "logs" not in p.parts), "validate creates nothing"


def test_no_field_name_of_either_example_is_in_the_platform_code():
    """The platform knows only definitions: the examples' field names appear nowhere in
    include/, dags/ or plugins/. The sensors example names two of its fields after the
    definition's own keys (``event_time: event_time``, ``event_id: event_id``); those words
    are the definition format's vocabulary, which the platform must know, so they are the
    only names left out of the search."""
    from streamlake.pipeline.definition import TOP_LEVEL_KEYS

    names = set()
    for path in EXAMPLES.values():
        names |= set(yaml.safe_load(path.read_text())["schema"]) - set(TOP_LEVEL_KEYS)
    assert {"sensor_id", "temperature", "order_id", "customer", "amount", "currency", "placed_at"} <= names
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    hits = []
    for folder in ("include", "dags", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "example field names in platform code:\n" + "\n".join(hits)
