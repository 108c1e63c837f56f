"""The shell walk-through of docs/definitions.md ("From the shell"), run as typed.

Its five commands (produce, pipeline run, backfill --dry-run, check, quality run) run one after
the other in a shell, in a working folder that holds the repository's ``.venv`` and
``pipelines`` (so ``data/orders`` is the test's own), on the test session's broker
(``STREAMLAKE_KAFKA_BOOTSTRAP``, as docs/kafka.md says) and a home of the test's own. Each must
exit 0; bronze must then hold every record a plain consumer reads from the topic, each once.
A scenario (``make test-scenarios``): about a minute and a half of Spark.
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.scenario


def test_the_definitions_walk_through_runs_as_typed(broker, tmp_path):
    from confluent_kafka.admin import AdminClient
    from deltalake import DeltaTable

    from test_docs_commands import ROOT, WALK_THROUGH, key, shell_commands
    from test_events import read_topic

    walk = [c for c in shell_commands(ROOT / "docs" / "definitions.md") if c.key in {key(w) for w in WALK_THROUGH}]
    assert [c.key for c in walk] == [key(w) for w in WALK_THROUGH], "the walk-through's order changed"
    work = tmp_path / "work"
    work.mkdir()
    for name in (".venv", "pipelines"):
        (work / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_", "STREAMLAKE_CRASH"))}
    env["STREAMLAKE_HOME"] = str(tmp_path / "home")
    for command in walk:
        done = subprocess.run(command.text, shell=True, cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (str(command), done.stdout[-2000:], done.stderr[-4000:])

    partitions = len(AdminClient({"bootstrap.servers": broker}).list_topics("orders", timeout=30)
                     .topics["orders"].partitions)
    in_kafka = set(read_topic(broker, "orders", partitions))
    bronze = DeltaTable(str(work / "data" / "orders" / "bronze")).to_pyarrow_table(columns=["partition", "offset"])
    in_bronze = list(zip(bronze.column("partition").to_pylist(), bronze.column("offset").to_pylist()))
    assert len(in_bronze) == len(set(in_bronze)), "a record twice in bronze"
    assert set(in_bronze) == in_kafka, (len(in_bronze), len(in_kafka))
