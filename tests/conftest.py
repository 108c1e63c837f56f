"""Shared test fixtures: one embedded broker and one SparkSession per test session.

Everything is real: the Tansu broker speaks the Kafka protocol, Spark runs in
local mode, Delta tables are written to disk by delta-rs. The session gets its
own STREAMLAKE_HOME and broker port, so a developer's running demo is untouched.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="streamlake-tests-"))
os.environ["STREAMLAKE_HOME"] = str(_SESSION_HOME)
os.environ.pop("STREAMLAKE_CRASH_AT", None)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# py4j logs from destructors at interpreter exit, after pytest closed its capture streams.
logging.getLogger("py4j").setLevel(logging.WARNING)
# Airflow reads its settings when first imported: give it the platform's (an
# AIRFLOW_HOME inside this session's STREAMLAKE_HOME, this repo's dags/plugins).
from streamlake.platform.airflow import airflow_env  # noqa: E402

os.environ.update({k: v for k, v in airflow_env().items() if k.startswith("AIRFLOW")})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def broker():
    """The embedded broker on a free port; STREAMLAKE_KAFKA_BOOTSTRAP points at it."""
    from streamlake.platform import broker as embedded

    state = embedded.start(_free_port())
    os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"] = state["bootstrap"]
    yield state["bootstrap"]
    embedded.stop()


@pytest.fixture(scope="session")
def spark(broker):
    """One local SparkSession for the whole test session, Kafka source registered."""
    from streamlake.kafka.source import register
    from streamlake.spark.session import get_spark

    session = get_spark("streamlake-tests", master="local[2]", conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    })
    register(session)
    yield session
    session.stop()


@pytest.fixture
def topic_name():
    """A fresh topic name per test."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def produce(broker):
    """produce(topic, count, partitions=3, **kw): real records through the producer the CLI uses."""
    from streamlake.kafka.producer import produce_sensor_readings

    def _produce(topic: str, count: int, partitions: int = 3, **kwargs):
        kwargs.setdefault("progress", False)
        kwargs.setdefault("value_bytes", 200)
        return produce_sensor_readings(topic, count, partitions=partitions, **kwargs)

    return _produce


@pytest.fixture
def lake(tmp_path):
    """Table and checkpoint paths in a per-test directory."""
    return {"table": str(tmp_path / "bronze"), "checkpoint": str(tmp_path / "checkpoint")}


def pytest_sessionfinish(session, exitstatus):
    import shutil

    from streamlake.platform import procs

    for state in procs.running_services():
        procs.stop(state.name)
    if exitstatus == 0:  # keep logs and tables of a failed run for inspection
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)
    else:
        print(f"\nstreamlake test state kept in {_SESSION_HOME}")
