"""Shared test fixtures: one local Kafka broker and one SparkSession per test session.

Everything is real: the broker is Apache Kafka (KRaft, one node, from the jars
`make setup` fetched), Spark runs in local mode, Delta tables are written to disk
by delta-rs. The session gets its own STREAMLAKE_HOME and broker ports, so a
developer's running demo is untouched. `make test` runs two pytest-xdist workers,
each a session of its own: its own home, broker, SparkSession and Airflow database
(which files go where: PLATFORM_FILES below).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import time
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
# AIRFLOW_HOME inside this session's STREAMLAKE_HOME, this repo's dags/plugins). An
# AIRFLOW_HOME inherited from the caller (a developer's, or the parent of an xdist worker)
# would make sessions share one Airflow database.
os.environ.pop("AIRFLOW_HOME", None)
from streamlake.platform.airflow import airflow_env  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The session's SparkSession also serves Spark Connect on this port (the `spark` fixture):
# the proofs of the DAGs run by `airflow dags test` run there as thin clients, as they run on
# `make run`'s Spark Connect server, instead of a spark-submit (a JVM start) each. Airflow's
# ``spark_connect_default`` connection names it.
SPARK_CONNECT_PORT = _free_port()
os.environ.update({k: v for k, v in airflow_env(connect_port=SPARK_CONNECT_PORT).items()
                   if k.startswith("AIRFLOW")})
# Credentials of the local S3 server (tests/test_object_storage.py; it accepts any), set before
# the session's Spark starts: executors and Spark's Python planner read them from their
# environment, as on a real cluster. CLI runs in that file get their own (unique) ones.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "streamlake-local")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "streamlake-local-secret")


@pytest.fixture(autouse=True)
def _remembered_storage_options_stay_in_their_test(monkeypatch):
    """The storage options a test makes this process remember for a root (loading a job,
    the lake settings: ``remember_options``) are forgotten after it. They would otherwise
    reach every later test's tables under that root: a test that remembered ``s3://lake``
    with its own, since stopped, S3 server's endpoint sent later tests there."""
    from streamlake.storage import location

    monkeypatch.setattr(location, "_REMEMBERED", dict(location._REMEMBERED))


@pytest.fixture(scope="session")
def broker():
    """The embedded Kafka (one node) on free ports, its data in the session's STREAMLAKE_HOME;
    STREAMLAKE_KAFKA_BOOTSTRAP points at it."""
    from streamlake.platform import broker as embedded

    state = embedded.start(embedded.find_free_port())
    os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"] = state["bootstrap"]
    yield state["bootstrap"]
    embedded.stop()


@pytest.fixture(scope="session")
def spark(broker):
    """One local SparkSession for the whole test session, Kafka source registered. Its JVM
    also serves Spark Connect on 127.0.0.1:SPARK_CONNECT_PORT (Spark's SparkConnectPlugin),
    for the checks that run as Spark Connect clients."""
    from streamlake.kafka.source import register
    from streamlake.platform import fork_server
    from streamlake.platform.spark_connect import SERVER_PLUGIN
    from streamlake.spark.session import SHORT_RUN_JVM, get_spark

    # As on `make run`: the fork server forks the session's Python processes (Spark's workers,
    # its streaming sources' runners) and the proofs' clients warm, every one of them
    # asserted to be so in test_fork_server.py.
    fork_server.start()
    session = get_spark("streamlake-tests", master="local[2]", conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # C1-only JIT with a 240 MB code cache, as for the platform's short-lived jobs: the
        # session runs hundreds of small queries, each planned anew, and C2's compilations cost
        # more CPU than they save before it ends. Measured on test_verify.py + test_backfill.py:
        # 282-292 -> 216-219 CPU-s, 166-174 -> 139-140 s (C1 only; what the code cache size changed: SHORT_RUN_JVM).
        **SHORT_RUN_JVM,
        "spark.plugins": SERVER_PLUGIN,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(SPARK_CONNECT_PORT),
    })
    register(session)
    yield session
    session.stop()
    fork_server.stop()


@pytest.fixture
def topic_name():
    """A fresh topic name per test."""
    return f"t-{uuid.uuid4().hex[:10]}"


SENSORS = Path(__file__).resolve().parents[1] / "pipelines" / "sensors.yaml"


def sensors_definition():
    """The demo pipeline's definition (pipelines/sensors.yaml): what tests produce by default."""
    from streamlake.pipeline.definition import load_definition

    return load_definition(SENSORS)


@pytest.fixture
def produce(broker):
    """produce(topic, count, partitions=3, definition=None, **kw): real records of a definition
    (default: the sensors example) through the producer the CLI uses."""
    from streamlake.kafka.producer import produce_records

    def _produce(topic: str, count: int, partitions: int = 3, definition=None, **kwargs):
        kwargs.setdefault("progress", False)
        kwargs.setdefault("value_bytes", 200)
        return produce_records(definition or sensors_definition(), topic, count, partitions=partitions, **kwargs)

    return _produce


class LiveProducer:
    """A steady real-time producer in a background thread: one record per record batch.

    What a live source looks like to Kafka: librdkafka with ``linger.ms=0`` and
    ``batch.num.messages=1`` sends every record as its own record batch, while
    the test (and the job it tests) runs. Records are a definition's labelled
    records (:class:`streamlake.kafka.events.DefinitionEvents`, default: the sensors
    example), made at the moment of production (event time = now, or late, out of
    order, duplicated, malformed by the ``mix`` fractions), spread round-robin over
    the partitions so each partition receives the same count. ``records`` keeps what
    was sent, in order, and ``lineage`` each delivered record's (partition, offset)
    by ``seq``, so a test computes its expectations from what it produced.

    ``rate`` is records per second (None: as fast as the producer can), ``count``
    the number of records to write (None: until :meth:`stop`). At most
    ``max_pending`` records wait for delivery at a time, so "as fast as it can"
    is as fast as the broker takes them (no deep local backlog) and
    ``sent_per_partition`` stays close to what the broker holds. Delivery is
    confirmed (idempotent producer, acks=all).
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, rate: float | None = None,
                 count: int | None = None, value_bytes: int = 200, seed: int | None = None,
                 max_pending: int = 1000, definition=None, **mix):
        from streamlake.kafka.events import DefinitionEvents

        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.rate, self.count, self.value_bytes, self.seed = rate, count, value_bytes, seed
        self.max_pending = max_pending
        self.events = DefinitionEvents(definition or sensors_definition(), seed, value_bytes=value_bytes, **mix)
        self.records: list = []  # GeneratedRecord, in the order sent
        self.lineage: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset) of delivered records
        self.sent_per_partition = [0] * partitions  # handed to librdkafka
        self.delivered_per_partition = [0] * partitions  # confirmed by the broker
        self.errors: list[str] = []
        self.undelivered = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the test reads -------------------------------------------------------------------

    @property
    def sent(self) -> int:
        return sum(self.sent_per_partition)

    @property
    def delivered(self) -> int:
        return sum(self.delivered_per_partition)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.finished_at or time.monotonic()) - self.started_at

    def wait_delivered(self, n: int, timeout_s: float = 120.0) -> int:
        """Wait until at least ``n`` records are delivered; the delivered count."""
        deadline = time.monotonic() + timeout_s
        while self.delivered < n:
            if self.errors:
                raise AssertionError(f"live producer failed: {self.errors[0]}")
            if not self.running:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.delivered} of {n} records delivered to {self.topic} in {timeout_s:g}s")
            time.sleep(0.05)
        if self.delivered < n:
            raise AssertionError(f"the producer stopped after delivering {self.delivered} of {n} records")
        return self.delivered

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> LiveProducer:
        from streamlake.kafka.client import client_config
        from streamlake.kafka.producer import ensure_topic

        ensure_topic(client_config({"kafka.bootstrap.servers": self.bootstrap}), self.topic, self.partitions)
        self._thread = threading.Thread(target=self._run, name=f"live-producer-{self.topic}", daemon=True)
        self.started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0, check: bool = True) -> LiveProducer:
        """Stop producing, deliver what was sent (flush) and wait for the thread.
        With ``check``, raise if a record was not delivered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and check:
                raise TimeoutError(f"the live producer of {self.topic} did not stop within {timeout_s:g}s")
        if check and (self.errors or self.undelivered):
            raise AssertionError(f"live producer of {self.topic}: {self.undelivered} records not delivered "
                                 f"({'; '.join(self.errors[:3]) or 'flush timed out'})")
        return self

    def _on_delivery(self, seq, err, msg) -> None:
        if err is None:
            self.delivered_per_partition[msg.partition()] += 1
            self.lineage[seq] = (msg.partition(), msg.offset())
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        import functools

        from confluent_kafka import Producer

        producer = Producer({
            "bootstrap.servers": self.bootstrap,
            "linger.ms": 0,  # send at once ...
            "batch.num.messages": 1,  # ... every record in a record batch of its own
            "enable.idempotence": True,
            "acks": "all",
            "client.id": f"live-producer-{self.topic}",
        }, logger=logging.getLogger("streamlake.librdkafka.live-producer"))
        sent = 0
        try:
            while not self._stop.is_set() and (self.count is None or sent < self.count):
                if sent - self.delivered - len(self.errors) >= self.max_pending:
                    producer.poll(0.01)  # as fast as the broker takes them, not into a deep local queue
                    continue
                if self.rate is not None:
                    ahead = sent / self.rate - (time.monotonic() - self.started_at)
                    if ahead > 0:
                        # serve delivery reports while waiting; librdkafka's timeout is whole
                        # milliseconds, a shorter one would spin a core the test's job needs
                        producer.poll(min(max(ahead, 0.001), 0.05))
                        continue
                record = self.events.next()
                self.records.append(record)
                partition = sent % self.partitions
                # Counted before it can reach the broker: sent_per_partition bounds each partition's end.
                self.sent_per_partition[partition] += 1
                sent += 1
                while True:
                    try:
                        producer.produce(self.topic, value=record.value, key=record.key, partition=partition,
                                         timestamp=record.timestamp_ms,
                                         on_delivery=functools.partial(self._on_delivery, record.seq))
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        producer.poll(0.01)
                producer.poll(0)
        except Exception as exc:  # noqa: BLE001 - reported by stop()/wait_delivered()
            self.errors.append(repr(exc))
        finally:
            self.undelivered = producer.flush(30)
            self.finished_at = time.monotonic()


@pytest.fixture
def live_producer(broker):
    """live_producer(topic, partitions=3, rate=None, count=None, value_bytes=200, seed=None, definition=None,
    late_fraction=..., out_of_order_seconds=..., malformed_fraction=..., duplicate_fraction=...) -> LiveProducer

    Starts a :class:`LiveProducer` (one record per record batch, in a background
    thread) that writes while the test runs; every producer still running at
    teardown is stopped and flushed.
    """
    started: list[LiveProducer] = []

    def _start(topic: str, partitions: int = 3, **kwargs) -> LiveProducer:
        producer = LiveProducer(broker, topic, partitions, **kwargs).start()
        started.append(producer)
        return producer

    yield _start
    for producer in started:
        producer.stop(check=False)


@pytest.fixture
def lake(tmp_path):
    """Table and checkpoint paths in a per-test directory."""
    return {"table": str(tmp_path / "bronze"), "checkpoint": str(tmp_path / "checkpoint")}


# `make test-fast` (-m fast): the checks that catch the common regressions in about three
# minutes, for before every commit: unit tests, definitions, DAG import and forms, the views'
# HTML, the CLI, the generator, and one small end-to-end run of the demo pipeline (produced
# while it runs, with late, duplicated and malformed records, compared with the tests' own
# oracle). `make test` runs these and everything else.
FAST_FILES = {"test_audit_compare.py", "test_checkpoint.py", "test_cli_args.py", "test_compose.py",
              "test_dags.py", "test_definitions.py", "test_event_ids.py", "test_events.py", "test_fork_server.py",
              "test_lake_archive.py", "test_layers.py", "test_logs.py", "test_metrics_rules.py",
              "test_offsets.py", "test_procs.py", "test_sink_plan.py", "test_supervisor.py", "test_views.py"}
FAST_TESTS = ("test_pipelines.py::test_quarantine_holds_exactly_the_malformed_records_with_their_labelled_reasons"
              "[sensors]",
              "test_pipelines.py::test_silver_holds_each_valid_event_once_with_its_typed_values[sensors]",
              "test_pipelines.py::test_late_events_are_kept_not_dropped[sensors]")


# `make test` runs two pytest-xdist workers. The Airflow platform files, the heaviest (most of
# a core each while they run), run one after the other in one worker, first; every other file
# is a unit of its own (its module fixtures set up once), spread over both.
PLATFORM_FILES = ("test_airflow_e2e.py", "test_live_platform.py")
# `make test-scenarios`: its S3 scenarios would run in one worker as one file; the whole
# pipeline on S3 (about 345 s), the two roots' runs (about 45 s) and bronze on S3 across a
# SIGKILL (about 57 s) run after the Airflow scenarios instead (about 315 s), and every other
# scenario is one unit beside them (BESIDE_THE_PLATFORM: the ingest DAG on S3, the races of two
# ingest jobs, the crashes, the Kafka faults, the docs' walk-through), so that each worker has
# some 780 s. (As a unit per file, the worker of the Airflow files took the Kafka faults' file
# too: 911 s against 674 s in the fresh-clone run of 2026-12-07.)
WITH_THE_PLATFORM_FILES = ("test_object_storage.py::test_the_whole_pipeline_on_s3_and_a_two_worker_cluster_",
                           "test_object_storage.py::test_bronze_ingest_to_s3_lands_every_record_once_across_",
                           "test_jobs.py::test_pipeline_run_and_backfill_of_two_roots_each_touch_only_their_own_tables")
BESIDE_THE_PLATFORM = "the other scenarios"


def _with_the_platform(nodeid: str) -> bool:
    return Path(nodeid.split("::", 1)[0]).name in PLATFORM_FILES or any(
        nodeid.split("/")[-1].startswith(test) for test in WITH_THE_PLATFORM_FILES)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, one scope per file, except the platform files and the tests
    run with them (WITH_THE_PLATFORM_FILES): one scope; in `make test-scenarios` (-m scenario),
    every other test a second scope.
    (xdist 3.8's ``loadgroup`` did not group here under pytest 9.2: one group's tests ran on
    both workers.)"""
    from xdist.scheduler import LoadScopeScheduling

    scenarios = (config.option.markexpr or "").strip() == "scenario"

    class PlatformFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if _with_the_platform(nodeid):
                return "platform"
            return BESIDE_THE_PLATFORM if scenarios else nodeid.split("::", 1)[0]

    return PlatformFilesTogether(config, log)


# The other files' order for the worker beside the platform: longest first, so that the run
# ends on short files on both workers (longest-processing-time-first scheduling), not on one
# long file while the other worker idles. Worker seconds of each file in one `make test` run
# (2026-11-27, beside the other worker); the order only moves time around, never a result.
# Files not listed follow in collection order, the fast files last.
LONGEST_FIRST = ("test_pipelines.py", "test_pipeline_crashes.py", "test_verify.py", "test_object_storage.py",
                 "test_crash_recovery.py", "test_backfill.py", "test_live_stream.py", "test_quality_suites.py",
                 "test_quality_results.py", "test_consistency_incremental.py", "test_delta_source.py",
                 "test_ui_browser.py", "test_ingest.py")


def _run_order(item) -> tuple:
    name = item.path.name
    if name in PLATFORM_FILES:
        return (0, 0)
    if _with_the_platform(item.nodeid):
        return (0, 1)
    if name in LONGEST_FIRST:
        return (1, LONGEST_FIRST.index(name))
    return (2 + (name in FAST_FILES), 0)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FAST_FILES or item.nodeid.endswith(FAST_TESTS):
            item.add_marker(pytest.mark.fast)
    # Stable: the platform files first (the longest unit), then the others longest first.
    items.sort(key=_run_order)


# Where each xdist worker's time went, printed at the end of a run: per worker, the seconds
# its tests took (setup, call and teardown) by file, longest first. `make test` ends when its
# last worker does, so this says which files to move or speed up.
_WORKER_SECONDS: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # the worker that ran it (set on the xdist controller)
    worker = getattr(getattr(node, "gateway", None), "id", None)
    if worker:
        files = _WORKER_SECONDS.setdefault(worker, {})
        name = report.nodeid.split("::", 1)[0]
        files[name] = files.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _WORKER_SECONDS:
        return
    terminalreporter.section("seconds per worker")
    for worker, files in sorted(_WORKER_SECONDS.items()):
        top = sorted(files.items(), key=lambda kv: -kv[1])
        terminalreporter.write_line(f"{worker}: {sum(files.values()):.0f} s in {len(files)} files; "
                                    + ", ".join(f"{Path(f).name} {s:.0f}" for f, s in top[:8]))


def pytest_sessionfinish(session, exitstatus):
    import shutil

    from streamlake import procs

    for state in procs.running_services():
        procs.stop(state.name)
    # Logs, tables and the Airflow database of a failed run are kept for inspection;
    # STREAMLAKE_TESTS_KEEP=1 keeps them after a passing run too.
    if exitstatus == 0 and not os.environ.get("STREAMLAKE_TESTS_KEEP"):
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)
    else:
        print(f"\nstreamlake test state kept in {_SESSION_HOME}")


@pytest.fixture(scope="module")
def live_platform():
    """The platform as `make run` starts it (broker, demo producer, Spark cluster, Airflow
    standalone), in a directory of its own on free ports; stopped after the module that uses
    it (it keeps most of both cores busy; under `make test` the other worker's files run beside
    it). Shared by
    that module's tests, which use the running platform like a user (a browser, REST API).
    Airflow's scheduler creates no scheduled runs here (``use_job_schedule`` off): on 2 cores
    the first scheduled ingests and hourly backfills of both pipelines filled the Spark pool
    for minutes before a test's run got a slot. Every run is one a test triggers (forms with
    their defaults run the scheduled mode; Airflow's Backfill runs data intervals, as the
    schedule would); the DAGs' timetables are checked in test_dags. Its
    producers write 10 (demo) and 5 (orders) records a second, one at a time: every run and
    proof then handles thousands of records, not tens of thousands (the demo's 200 a second
    is `make bench`'s operation rows)."""
    from platform_harness import start_platform

    platform = start_platform(_SESSION_HOME / "platform", rate=10, other_rate=5, schedules=False)
    try:
        yield platform
    finally:
        platform.stop()
        _keep_platform_logs(platform.home)


def _keep_platform_logs(home: Path, target: Path = Path(__file__).parent / "artifacts" / "live-platform-logs") -> None:
    """Copy the live platform's task logs (Airflow's, one file per try) and service logs to
    tests/artifacts/ (a passing session's directory is deleted): where a run took long or
    was retried, its tasks' logs say why."""
    import shutil

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for source, name in ((home / "airflow" / "logs", "airflow"), (home / "logs", "services")):
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("dag_processor"))
