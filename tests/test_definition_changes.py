"""A definition change against a pipeline's existing tables: an added aggregate is built from
silver and proven, an added optional field applies from then on, and a change that would make
existing rows wrong (a field's type) is refused with a message, changing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

import oracle
from streamlake.delta.table import open_table, read_table
from streamlake.pipeline.control import JobControl
from streamlake.pipeline.config import PipelineConfig
from streamlake.pipeline.definition import load_definition
from streamlake.pipeline.driver import run_stages
from streamlake.pipeline.evolution import IncompatibleDefinitionError, applied_definition
from streamlake.pipeline.schemas import gold_spec, silver_spec

ROOT = Path(__file__).resolve().parents[1]
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(spark, root: Path, definition_file: Path) -> dict:
    cfg = PipelineConfig(root=str(root), definition=load_definition(definition_file))
    return run_stages(spark, cfg.build_stages(), JobControl(cfg.control_dir), available_now=True,
                      report=lambda _line: None, poll_s=0.2)


def versions(root: Path, names) -> dict[str, int]:
    return {n: open_table(root / n).version() for n in names}


@pytest.fixture
def orders_v1(tmp_path):
    """The orders example on a topic of its own, with only its first aggregate."""
    data = yaml.safe_load((ROOT / "pipelines" / "orders.yaml").read_text())
    data["topics"] = [f"orders-{uuid.uuid4().hex[:8]}"]
    data["aggregates"] = data["aggregates"][:1]
    return data


def test_an_added_aggregate_is_built_from_silver_and_proven(spark, live_producer, orders_v1, tmp_path):
    from streamlake.operations.pipeline_checks import check_gold

    root = tmp_path / "lake"
    v1 = write(tmp_path / "v1.yaml", orders_v1)
    producer = live_producer(orders_v1["topics"][0], 2, count=400, seed=3, definition=load_definition(v1),
                             malformed_fraction=0.05, duplicate_fraction=0.05)
    producer.wait_delivered(400, timeout_s=60)
    run(spark, root, v1)
    producer.stop()
    # v2: a sliding-window aggregate per currency, and an optional field
    v2_data = json.loads(json.dumps(orders_v1))
    v2_data["aggregates"].append({"name": "per_currency", "keys": ["currency"], "window": "sliding:4m,2m",
                                  "allowed_lateness": "30s",
                                  "measures": {"orders": "count(*)", "revenue": "sum(amount)", "top": "max(amount)"}})
    v2_data["schema"]["channel"] = "string"
    v2_data["optional"] = [*v2_data["optional"], "channel"]
    v2 = write(tmp_path / "v2.yaml", v2_data)
    summary = run(spark, root, v2)
    assert summary["stages"]["gold/per_currency"]["rows"] > 0, "the new aggregate read all of silver"
    definition = load_definition(v2)
    applied = applied_definition(root)
    assert [a.name for a in applied.aggregates] == ["revenue_5m", "per_currency"]
    silver = read_table(spark, root / "silver", silver_spec(definition)).toArrow().to_pylist()
    assert silver and all(r["channel"] is None for r in silver), "earlier rows read the new optional field as null"
    agg = definition.aggregate("per_currency")
    tables = {n: str(root / n) for n in definition.table_names()}
    proof = check_gold(spark, tables, definition, agg)
    assert proof.passed and proof.windows_checked > 0, proof.summary()
    events = [r.fields for r in producer.records if r.kind in ("valid", "late")]
    expected = oracle.expected_gold(oracle.load(v2), "per_currency", events)
    gold = read_table(spark, root / agg.gold_table, gold_spec(definition, agg)).toArrow().to_pylist()
    problems = oracle.compare_gold(expected, gold, ["currency"])
    assert not problems, "\n".join(problems[:20])


def test_a_changed_field_type_is_refused_and_changes_nothing(spark, produce, orders_v1, tmp_path):
    root = tmp_path / "lake"
    v1 = write(tmp_path / "v1.yaml", orders_v1)
    produce(orders_v1["topics"][0], 120, partitions=2, seed=4, definition=load_definition(v1))
    run(spark, root, v1)
    tables = load_definition(v1).table_names()
    before, record = versions(root, tables), (root / "_control" / "definition.json").read_text()
    changed = json.loads(json.dumps(orders_v1))
    changed["schema"]["amount"] = "double"
    v2 = write(tmp_path / "v2.yaml", changed)
    with pytest.raises(IncompatibleDefinitionError) as refused:
        run(spark, root, v2)
    message = str(refused.value)
    assert "field amount changes type from decimal(12,2) to double" in message
    assert "new --root" in message and "Nothing was changed" in message
    assert versions(root, tables) == before, "no table moved"
    assert (root / "_control" / "definition.json").read_text() == record, "the applied definition is the old one"
    # the command line refuses it the same way, before starting anything
    done = subprocess.run([STREAMLAKE, "pipeline", "run", "--definition", str(v2), "--root", str(root)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "STREAMLAKE_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and "IncompatibleDefinitionError" in done.stderr and "amount" in done.stderr
    assert versions(root, tables) == before
