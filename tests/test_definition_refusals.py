"""A definition refused for its rules is refused by every entry point before anything is written.

Each command a user gives a definition file to (``pipeline run``, ``job define``,
``backfill``, ``check`` and ``quality run`` with ``--definition``) is run as the
user runs it, in a subprocess, against a home that already holds a job and a
root that already holds that job's identity. A rule over an undeclared field and
a rule that is not boolean each exit 2 with one line naming the file and the key,
and a listing of the home and the root (paths, sizes and modification times)
taken before and after is identical. A rule only Spark's analyzer refuses is
refused the same way, with no JVM or Python-worker output. Airflow's parse of the
pipelines directory shows a broken file as an import error naming the file and
the key, and the other pipelines' DAGs stay.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ORDERS = ROOT / "pipelines" / "orders.yaml"
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
NOISE = ("Traceback", "py4j", "Py4J", "Exception in thread", "Python worker", "WARN", "Connection reset", "at org.")


def listing(*dirs: Path) -> dict[str, tuple]:
    """Every path under ``dirs`` with its size and modification time: what a write would change."""
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")) if d.exists() else ():
            st = p.lstat()
            out[str(p)] = (p.is_dir(), st.st_size if p.is_file() else None, st.st_mtime_ns)
    return out


def bad_definition(tmp_path: Path, check: str, name: str) -> Path:
    data = yaml.safe_load(ORDERS.read_text())
    data["rules"][0]["check"] = check
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def platform_home(tmp_path_factory):
    """A home with a job already defined (shop, of the orders definition, rooted at ``root``), as a
    user's would be."""
    base = tmp_path_factory.mktemp("refusals")
    home, root = base / "home", base / "root"
    env = {**os.environ, "STREAMLAKE_HOME": str(home)}
    env.pop("STREAMLAKE_PIPELINES", None)
    done = subprocess.run([STREAMLAKE, "job", "define", "shop", "--definition", str(ORDERS), "--root", str(root)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {"home": home, "root": root, "env": env, "base": base}


def commands(bad: Path, root: Path, fresh_root: Path) -> dict[str, list[str]]:
    return {
        "pipeline run": ["pipeline", "run", "--definition", str(bad), "--root", str(fresh_root), "--available-now"],
        "pipeline run (the job's root)": ["pipeline", "run", "--definition", str(bad), "--root", str(root),
                                          "--available-now"],
        "job define": ["job", "define", "payments", "--definition", str(bad), "--root", str(fresh_root)],
        "backfill --definition": ["backfill", "--root", str(root), "--definition", str(bad)],
        "check --definition": ["check", "--root", str(root), "--definition", str(bad)],
        "quality run --definition": ["quality", "run", "--table", "silver", "--root", str(root), "--definition",
                                     str(bad)],
    }


def assert_refused(done: subprocess.CompletedProcess, bad: Path, words: str, what: str) -> None:
    assert done.returncode == 2, (what, done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, (what, "one line, nothing else:", done.stderr[-3000:])
    assert lines[0].startswith(f"error: DefinitionError: {bad}: rules[0].check: rule positive_amount"), (what, lines)
    assert words in lines[0], (what, lines)
    assert not any(n in done.stdout + done.stderr for n in NOISE), (what, done.stdout[-2000:], done.stderr[-2000:])


@pytest.mark.parametrize("check, words", [("price > 0", "price is not a declared field"),
                                          ("amount + 1", "computes a number, not a boolean")],
                         ids=["undeclared field", "not boolean"])
def test_every_entry_point_refuses_before_writing_anything(platform_home, check, words):
    home, root, env, base = platform_home["home"], platform_home["root"], platform_home["env"], platform_home["base"]
    bad = bad_definition(base, check, "payments.yaml")
    fresh_root = base / "payments"
    before = listing(home, root, fresh_root)
    for what, argv in commands(bad, root, fresh_root).items():
        done = subprocess.run([STREAMLAKE, *argv], env=env, capture_output=True, text=True, timeout=300)
        assert_refused(done, bad, words, what)
        assert listing(home, root, fresh_root) == before, f"{what} changed the home or a root"
    assert not fresh_root.exists() and not (home / "jobs" / "payments.json").exists()


@pytest.mark.parametrize("command", ["pipeline run", "job define"])
def test_a_rule_only_spark_refuses_is_refused_before_writing_anything_in_one_line(platform_home, command):
    """What only Spark's analyzer finds (a function Spark does not have) costs a small local
    session before the command writes anything; its JVM says nothing on the terminal."""
    home, root, env, base = platform_home["home"], platform_home["root"], platform_home["env"], platform_home["base"]
    bad = bad_definition(base, "no_such_function(amount) > 0", "spark_only.yaml")
    fresh_root = base / "spark_only"
    before = listing(home, root, fresh_root)
    done = subprocess.run([STREAMLAKE, *commands(bad, root, fresh_root)[command]], env=env, capture_output=True,
                          text=True, timeout=300)
    assert_refused(done, bad, "UNRESOLVED_ROUTINE", command)
    assert listing(home, root, fresh_root) == before


def test_airflow_shows_a_broken_file_as_an_import_error_and_keeps_the_other_dags(platform_home, tmp_path,
                                                                                   monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    shutil.copy(ROOT / "pipelines" / "sensors.yaml", pipelines / "sensors.yaml")
    bad = bad_definition(pipelines, "amount + 1", "payments.yaml")
    home = tmp_path / "home"
    monkeypatch.setenv("STREAMLAKE_HOME", str(home))
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(pipelines))
    DagBag(dag_folder=str(ROOT / "dags"))  # the first parse records the good pipeline's job
    before = listing(home)
    dags = DagBag(dag_folder=str(ROOT / "dags"))
    assert {"ingest_sensors", "backfill_sensors", "savepoint", "restore", "rescale"} <= set(dags.dag_ids)
    assert not any("payments" in d for d in dags.dag_ids)
    assert [Path(f).name for f in dags.import_errors] == ["pipeline_definitions.py"], dags.import_errors
    error = next(iter(dags.import_errors.values()))
    assert f"{bad}: rules[0].check: rule positive_amount: 'amount + 1'" in error, error
    assert listing(home) == before, "a parse of a broken file writes nothing"


def test_airflow_asks_the_spark_connect_server_about_rules_only_spark_refuses(spark, tmp_path, monkeypatch):
    """At parse, the DAG processor starts no JVM: rules whose verdict is not remembered are
    analysed on the Spark Connect server of ``spark_connect_default`` (the test session's),
    in a process of their own. A rule only Spark refuses is then an import error too; the
    rules Spark accepts are remembered, so the next parse asks nothing."""
    from airflow.dag_processing.dagbag import DagBag

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    shutil.copy(ROOT / "pipelines" / "sensors.yaml", pipelines / "sensors.yaml")
    bad = bad_definition(pipelines, "no_such_function(amount) > 0", "payments.yaml")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no verdict remembered yet
    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(pipelines))
    dags = DagBag(dag_folder=str(ROOT / "dags"))
    assert {"ingest_sensors", "savepoint"} <= set(dags.dag_ids)
    error = next(iter(dags.import_errors.values()), "")
    assert [Path(f).name for f in dags.import_errors] == ["pipeline_definitions.py"], dags.import_errors
    assert f"{bad}: rules[0].check: rule positive_amount: 'no_such_function(amount) > 0'" in error, error
    assert "UNRESOLVED_ROUTINE" in error
    remembered = list((tmp_path / "cache" / "streamlake" / "rule-checks").iterdir())
    assert len(remembered) == 1, "the sensors rules Spark accepted, not the refused ones"
