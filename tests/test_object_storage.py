"""The lake on S3: bronze ingest to an ``s3://`` table, and a whole pipeline under an ``s3://``
root, on a real S3 API server.

The server is moto's standalone server (``.venv-s3``, started and stopped like the
broker), which honours ``If-None-Match`` conditional writes: the commits below go
through delta-rs's ``conditional_put=etag`` mode against it, over HTTP. The jobs
are real ``streamlake ingest`` -> spark-submit process trees; the records are
produced one at a time while they run. What the tests expect is computed from what
they produced and from the objects they read back themselves with pyarrow.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamlake.errors import StorageOptionError, UnsafeStoreError
from streamlake.storage.location import (
    StorageOptions,
    arrow_filesystem,
    join,
    normalize,
    redact,
    require_safe_commits,
    storage_options,
)

STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
ACCESS_KEY_ID = "AKIASTREAMLAKETEST01"


# -- options, secrets and the commit-safety rule (no server) ---------------------------------------

@pytest.mark.fast
def test_storage_options_come_from_the_environment_then_flags_and_secrets_never_print():
    env = {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "env-secret-value", "AWS_ACCESS_KEY_ID": "AKIA1",
           "GOOGLE_SERVICE_ACCOUNT": "not-for-s3", "HOME": "/root"}
    opts = storage_options("s3://bucket/lake/", ["AWS_REGION=us-east-2", "conditional_put=etag"], env=env)
    assert opts.uri == "s3://bucket/lake"
    assert dict(opts) == {"AWS_REGION": "us-east-2", "AWS_SECRET_ACCESS_KEY": "env-secret-value",
                          "AWS_ACCESS_KEY_ID": "AKIA1", "conditional_put": "etag"}
    for text in (repr(opts), str(opts), json.dumps(opts.redacted()), json.dumps(opts.public())):
        assert "env-secret-value" not in text and "AKIA1" not in text, text
    assert opts.public() == {"AWS_REGION": "us-east-2", "conditional_put": "etag"}
    assert opts.secret_environment() == {"AWS_SECRET_ACCESS_KEY": "env-secret-value", "AWS_ACCESS_KEY_ID": "AKIA1"}
    assert redact("failed with key env-secret-value for AKIA1", opts) == "failed with key *** for ***"
    # GCS reads its own family's variables, not AWS's.
    assert dict(storage_options("gs://b/p", env=env)) == {"GOOGLE_SERVICE_ACCOUNT": "not-for-s3"}
    # The same options as Hadoop's s3a settings (for Delta's Spark connector), for that bucket only.
    minio = storage_options("s3://bucket/lake", ["AWS_ENDPOINT_URL=http://127.0.0.1:9000"], env=env)
    assert minio.for_hadoop() == {
        "fs.s3a.bucket.bucket.endpoint": "http://127.0.0.1:9000", "fs.s3a.bucket.bucket.path.style.access": "true",
        "fs.s3a.bucket.bucket.connection.ssl.enabled": "false", "fs.s3a.bucket.bucket.endpoint.region": "eu-west-1",
        "fs.s3a.bucket.bucket.access.key": "AKIA1", "fs.s3a.bucket.bucket.secret.key": "env-secret-value",
        "fs.s3a.bucket.bucket.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
    assert storage_options("gs://b/p", env=env).for_hadoop() == {}

    with pytest.raises(StorageOptionError, match="KEY=VALUE"):
        storage_options("s3://b/p", ["no-equals-sign"])
    with pytest.raises(StorageOptionError, match="local filesystem"):
        storage_options("/tmp/lake", ["AWS_REGION=x"])
    with pytest.raises(StorageOptionError, match="unsupported lake URI scheme 'hdfs'"):
        normalize("hdfs://nn/lake")
    assert join("s3://b/lake/", "bronze", "_delta_log") == "s3://b/lake/bronze/_delta_log"
    assert join("file:///tmp/lake", "bronze") == "/tmp/lake/bronze"


@pytest.mark.fast
def test_the_lake_root_puts_every_defined_pipeline_and_the_platform_tables_on_the_store(tmp_path, monkeypatch):
    """``STREAMLAKE_LAKE_ROOT=s3://...``: a pipeline of the pipelines directory is a job rooted
    at ``<lake root>/<name>`` with the lake's public options recorded (never a secret), and the
    platform's tables are under ``<lake root>/_platform`` unless ``STREAMLAKE_PLATFORM_ROOT``
    names another place; unset, both stay under the home as before."""
    from helpers import example
    from streamlake.operations.jobs import load_job
    from streamlake.delta.records import platform_table_path

    home = tmp_path / "home"
    monkeypatch.setenv("STREAMLAKE_HOME", str(home))
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(pipelines))
    example("orders", pipelines, "orders-topic")
    for key in ("STREAMLAKE_LAKE_ROOT", "STREAMLAKE_PLATFORM_ROOT", "STREAMLAKE_STORAGE_OPTIONS"):
        monkeypatch.delenv(key, raising=False)
    assert platform_table_path("operations") == str(home / "data" / "_platform" / "operations")

    monkeypatch.setenv("STREAMLAKE_LAKE_ROOT", "s3://lake/prod/")
    monkeypatch.setenv("STREAMLAKE_STORAGE_OPTIONS", "AWS_ENDPOINT_URL=http://minio:9000, conditional_put=etag")
    job = load_job("orders")
    assert job.root == "s3://lake/prod/orders"
    assert job.storage_options == {"AWS_ENDPOINT_URL": "http://minio:9000", "conditional_put": "etag"}
    assert storage_options(job.table_path("silver"), env={}).get_any("conditional_put") == "etag"
    assert platform_table_path("operations") == "s3://lake/prod/_platform/operations"
    monkeypatch.setenv("STREAMLAKE_PLATFORM_ROOT", "s3://ops/streamlake")
    assert platform_table_path("operations") == "s3://ops/streamlake/operations"
    assert storage_options("s3://ops/streamlake/operations", env={}).get_any("AWS_ENDPOINT_URL") == "http://minio:9000"

    monkeypatch.setenv("STREAMLAKE_STORAGE_OPTIONS", "AWS_SECRET_ACCESS_KEY=s3cr3t-value")
    with pytest.raises(StorageOptionError, match="never in a setting") as refused:
        platform_table_path("operations")
    assert "s3cr3t-value" not in str(refused.value)


@pytest.mark.fast
def test_an_airflow_aws_connection_becomes_the_job_processes_aws_environment():
    from streamlake.orchestration.hooks import connection_environment

    env = connection_environment("AKIA1", "s3cr3t-value", {
        "region_name": "eu-west-1", "service_config": {"s3": {"endpoint_url": "http://127.0.0.1:9000"}},
        "aws_session_token": "tok-value", "AWS_S3_LOCKING_PROVIDER": "dynamodb", "role_arn": "not-ours"})
    assert env == {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
                   "AWS_SESSION_TOKEN": "tok-value", "AWS_REGION": "eu-west-1",
                   "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
                   "AWS_S3_LOCKING_PROVIDER": "dynamodb"}
    assert connection_environment(None, None, '{"endpoint_url": "https://s3.example.com"}') == {
        "AWS_ENDPOINT_URL": "https://s3.example.com"}  # https: no AWS_ALLOW_HTTP


@pytest.mark.fast
def test_make_run_on_s3_defines_the_lakes_connection_as_the_jobs_read_it_and_no_server_without_spark_connect():
    """`make run LAKE=s3` defines ``aws_default`` with the local server's account (what a job's
    tasks then get in their environment equals the lake's credentials and endpoint); with
    ``--no-spark-connect`` no server is started and no connection declares one."""
    from argparse import Namespace

    from streamlake.cli.services import _lake_connections
    from streamlake.orchestration.hooks import connection_environment
    from streamlake.platform import object_store

    connections, server = _lake_connections(Namespace(lake="s3", s3_port=9123, no_spark_connect=True))
    assert set(connections) == {"AIRFLOW_CONN_AWS_DEFAULT"} and server is None
    conn = json.loads(connections["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws"
    expected = {k: v for k, v in object_store.local_options(9123).items() if k.startswith("AWS_")}
    assert connection_environment(conn["login"], conn["password"], conn["extra"]) == expected
    assert _lake_connections(Namespace(lake="local", s3_port=9123, no_spark_connect=True)) == ({}, None)


@pytest.mark.fast
def test_a_cli_check_of_a_store_job_uses_the_platforms_server_only_where_it_holds_store_credentials(
        tmp_path, monkeypatch):
    """`streamlake check` / `backfill` without --remote: a job on S3 goes to the platform's running
    Spark Connect server only where that server was started with a store's credentials (its
    service state says so), else a spark-submit that gets this shell's AWS_* environment; a
    local job goes to the server either way. The "server" here is a process that only accepts
    connections (a test double at the socket boundary: the choice is made before any Spark)."""
    import sys

    from conftest import _free_port
    from streamlake.cli.common import connect_or_submit_command
    from streamlake import procs
    from streamlake.platform import spark_connect

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path))
    port = _free_port()
    listener = [sys.executable, "-c", "import socket, time; s = socket.socket(); "
                f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(120)"]
    chosen = {}
    for held in (None, "aws_default"):
        procs.start(spark_connect.SERVICE, listener, info={"url": spark_connect.url(port), "storage_conn_id": held})
        try:
            procs.wait_for(lambda: spark_connect.reachable(spark_connect.url(port)), 20, what="the listener")
            for root in ("s3://lake/j", str(tmp_path / "j")):
                cmd = connect_or_submit_command("verify.py", ["--job", "j"], None, master="local[*]", name="check:j",
                                                root=root)
                chosen[held, root.startswith("s3://")] = "connect" if "--remote" in cmd else "spark-submit"
        finally:
            procs.stop(spark_connect.SERVICE)
    assert chosen == {(None, True): "spark-submit", (None, False): "connect",
                      ("aws_default", True): "connect", ("aws_default", False): "connect"}, chosen


@pytest.mark.fast
def test_the_views_process_reaches_a_job_store_with_its_connection_and_keeps_it_when_the_job_loads_again(
        monkeypatch):
    """reach_store remembers the connection's credentials for the job's root in this process
    (no environment change: the views serve requests side by side); loading the job again,
    which remembers its recorded options, keeps them; another root does not get them."""
    import logging

    from streamlake.operations.jobs import JobSpec
    from streamlake.orchestration.hooks import reach_store

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    conn_id, root = f"views_{uuid.uuid4().hex[:6]}", f"s3://views-{uuid.uuid4().hex[:6]}/lake"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "aws", "login": ACCESS_KEY_ID, "password": "views-secret",
         "extra": {"endpoint_url": "http://127.0.0.1:9"}}))
    job = JobSpec(name="views-s3", root=root, topics=["views"], storage_options={"conditional_put": "etag"},
                  storage_conn_id=conn_id)
    assert "AWS_SECRET_ACCESS_KEY" not in storage_options(f"{root}/silver")
    reach_store(job, logging.getLogger(__name__))
    JobSpec(name="views-s3", root=root, topics=["views"], storage_options={"conditional_put": "etag"},
            storage_conn_id=conn_id)
    options = storage_options(f"{root}/silver")
    assert options["AWS_SECRET_ACCESS_KEY"] == "views-secret" and options["conditional_put"] == "etag"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert "AWS_SECRET_ACCESS_KEY" not in storage_options(f"s3://other-{uuid.uuid4().hex[:6]}/lake")
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ


@pytest.mark.fast
def test_dispose_deletes_a_stored_savepoint_manifest_first_and_an_old_format_one_too(tmp_path, monkeypatch):
    from streamlake.config import savepoints_dir
    from streamlake.operations.savepoints import SavepointError, dispose_savepoint, load_savepoint

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    old = savepoints_dir() / "sp-old"
    old.mkdir(parents=True)
    (old / "manifest.json").write_text(json.dumps({"id": "sp-old", "format": 1, "code_version": "0.0.1"}))
    with pytest.raises(SavepointError, match="older format"):
        load_savepoint("sp-old")
    dispose_savepoint("sp-old")
    assert not old.exists()
    stored = tmp_path / "store" / "sp-new"  # a savepoint kept elsewhere (a target folder)
    (stored / "checkpoints" / "bronze").mkdir(parents=True)
    (stored / "checkpoints" / "bronze" / "metadata").write_text("{}")
    (stored / "manifest.json").write_text("{}")
    (savepoints_dir() / "sp-new").mkdir()
    (savepoints_dir() / "sp-new" / "manifest.json").write_text(json.dumps({"id": "sp-new", "location": str(stored)}))
    dispose_savepoint("sp-new")
    assert not stored.exists() and not (savepoints_dir() / "sp-new").exists()
    with pytest.raises(SavepointError, match="no savepoint 'sp-new'"):
        dispose_savepoint("sp-new")


@pytest.mark.fast
def test_the_ingest_job_gets_secrets_through_its_environment_never_its_command_line():
    import argparse

    from streamlake.pipeline.ingest import IngestConfig, add_ingest_arguments, config_from_args, config_to_args
    from streamlake.pipeline.ingest import secret_environment

    given = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "conditional_put": "etag",
             "aws_secret_access_key": "s3cr3t-value", "AWS_SESSION_TOKEN": "t0ken-value"}
    cfg = IngestConfig(table="s3://b/lake/bronze", checkpoint="/tmp/ck", topics=("t",), storage_options=given)
    args = config_to_args(cfg)
    assert not any("s3cr3t-value" in a or "t0ken-value" in a for a in args), args
    assert secret_environment(cfg) == {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value", "AWS_SESSION_TOKEN": "t0ken-value"}
    parser = argparse.ArgumentParser()
    add_ingest_arguments(parser)
    back = config_from_args(parser.parse_args(args))
    assert back.table == "s3://b/lake/bronze"
    assert back.storage_options == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "conditional_put": "etag"}
    # The job's process has the secrets in its environment: its options are complete again.
    env = {**secret_environment(cfg)}
    assert storage_options(back.table, back.storage_options, env=env).get_any("AWS_SECRET_ACCESS_KEY") == "s3cr3t-value"


@pytest.mark.fast
def test_s3_commits_must_be_safe_or_declared_single_writer():
    with pytest.raises(UnsafeStoreError, match="conditional_put=etag") as refused:
        require_safe_commits(StorageOptions("s3://b/t", {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}))
    assert "s3cr3t-value" not in str(refused.value)
    for safe in ({"conditional_put": "etag"}, {"AWS_CONDITIONAL_PUT": "etag"},
                 {"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}):
        require_safe_commits(StorageOptions("s3://b/t", safe))
    # Local disks, GCS and Azure have an atomic put-if-absent.
    for uri in ("/tmp/t", "gs://b/t", "abfss://c@a.dfs.core.windows.net/t"):
        require_safe_commits(StorageOptions(uri, {}))


# -- on the local S3 server -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3(broker):
    """The local S3 server with a bucket ``lake``; options as a user passes them. The
    secret is unique to the run, so a grep for it finds only leaks."""
    from conftest import _free_port
    from streamlake.platform import object_store

    port = _free_port()
    object_store.start(port)
    options = object_store.local_options(port, secret=f"test-secret-{uuid.uuid4().hex}")
    options["AWS_ACCESS_KEY_ID"] = ACCESS_KEY_ID
    object_store.create_bucket("s3://lake", options)
    yield options
    object_store.stop()


def test_the_s3_command_starts_the_local_server_with_a_bucket_and_stops_it(tmp_path):
    from conftest import _free_port

    port = _free_port()
    env = {"STREAMLAKE_HOME": str(tmp_path / "home")}  # a home of its own: the module's server is untouched
    code, out = cli("s3", "start", "--port", str(port), "--bucket", "scratch", env=env, timeout=60)
    try:
        assert code == 0, out
        assert f"http://127.0.0.1:{port}" in out and "bucket s3://scratch ready" in out
        assert "conditional_put=etag" in out
        code, status = cli("s3", "status", env=env, timeout=30)
        assert code == 0 and json.loads(status)["answers"] is True, status
        import pyarrow.fs as pafs
        from streamlake.platform.object_store import local_options

        fs, bucket = arrow_filesystem(storage_options("s3://scratch", local_options(port), env={}))
        assert fs.get_file_info(bucket).type == pafs.FileType.Directory
    finally:
        code, out = cli("s3", "stop", env=env, timeout=30)
    assert code == 0 and "stopped" in out, out
    assert cli("s3", "status", env=env, timeout=30)[0] == 1


def test_make_run_with_the_lake_on_s3_starts_the_local_server_and_points_every_later_service_at_it(
        tmp_path, monkeypatch):
    """`make run LAKE=s3` (`streamlake platform --lake s3`), before its other services: the local
    S3 server with the bucket ``lake``; this process's environment (inherited by the broker,
    the producers, the Spark cluster and Airflow) puts each defined pipeline at
    ``s3://lake/<name>`` and the platform's tables at ``s3://lake/_platform``, where a write
    lands (read back by the test with pyarrow); ``lake.env`` gives a shell the same settings;
    and the state of a previous lake (gone with the previous server: memory only) is archived,
    not deleted, as for a new broker."""
    from conftest import _free_port
    from streamlake.cli.services import start_local_lake
    from streamlake.operations.jobs import load_job
    from streamlake.delta.records import record_operation
    from streamlake.platform import object_store

    home = tmp_path / "home"
    monkeypatch.setenv("STREAMLAKE_HOME", str(home))
    stale = home / "lakes" / "s3" / "lake" / "sensors" / "_checkpoints"
    stale.mkdir(parents=True)  # the checkpoints of the previous lake's sensors job
    settings = object_store.lake_settings(0)
    for key in settings:
        monkeypatch.setenv(key, "")  # restored when the test ends: start_local_lake sets them
    port = _free_port()
    try:
        start_local_lake(port)
        assert {k: os.environ[k] for k in settings} == object_store.lake_settings(port)
        assert load_job("sensors").root == "s3://lake/sensors"
        assert load_job("sensors").storage_options["conditional_put"] == "etag"
        record_operation("lake-test", "sensors", {"port": port})
        options = object_store.local_options(port)
        assert table_rows(options, "s3://lake/_platform/operations", ("operation",)).column(0).to_pylist() == [
            "lake-test"]
        archived = list((home / "archive").glob("*/lakes/s3/lake/sensors/_checkpoints"))
        assert archived and not stale.exists(), "the lost lake's checkpoints are archived"
        shell = subprocess.run(["bash", "-c", f"source {home / 'lake.env'} && env"], capture_output=True, text=True,
                               env={"PATH": os.environ["PATH"]}, check=True).stdout
        assert {k: v for k, v in (line.split("=", 1) for line in shell.splitlines() if "=" in line)
                if k in settings} == object_store.lake_settings(port)
        assert oct((home / "lake.env").stat().st_mode & 0o777) == "0o600"
    finally:
        object_store.stop()


def storage_flags(options: dict) -> list[str]:
    return [arg for k, v in options.items() for arg in ("--storage-option", f"{k}={v}")]


def cli(*args, env=None, wait=True, timeout=300):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen([STREAMLAKE, *args], env={**clean, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if not wait:
        return proc
    return finish(proc, timeout)


def finish(proc, timeout: float) -> tuple[int, str]:
    """Wait for a CLI process; on timeout kill its process tree and fail with its output."""
    from streamlake.procs import kill_tree

    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid, proc.pid, timeout=5)
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args[1]} did not finish in {timeout:g}s:\n{out[-4000:]}") from None
    return proc.returncode, out


def objects(options: dict, uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = arrow_filesystem(storage_options(uri, options, env={}))
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    return [f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File]


def data_objects(options: dict, uri: str) -> set[str]:
    """Parquet objects under the table (``bucket/key``), referenced or not."""
    return {k for k in objects(options, uri) if k.endswith(".parquet")}


def snapshot_objects(options: dict, uri: str) -> set[str]:
    """The objects the table's latest snapshot references (``bucket/key``)."""
    from deltalake import DeltaTable

    return {u.split("://", 1)[1] for u in
            DeltaTable(uri, storage_options=dict(storage_options(uri, options, env={}))).file_uris()}


def table_rows(options: dict, uri: str, columns=("partition", "offset", "value")) -> pa.Table:
    """The table's snapshot read back by the test itself: delta-rs for the file list,
    pyarrow on the S3 filesystem for the rows (``columns`` of the data files; None: all)."""
    from deltalake import DeltaTable

    opts = storage_options(uri, options, env={})
    fs, _ = arrow_filesystem(opts)
    files = [u.split("://", 1)[1] for u in DeltaTable(uri, storage_options=dict(opts)).file_uris()]
    parts = [pq.read_table(f, filesystem=fs, columns=list(columns) if columns else None) for f in files]
    return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns or ()})


def assert_each_record_once(options: dict, uri: str, producer) -> None:
    rows = table_rows(options, uri)
    keys = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist()))
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} records are in the table twice"
    expected = {producer.lineage[r.seq]: r.value for r in producer.records if r.seq in producer.lineage}
    got = dict(zip(keys, rows.column("value").to_pylist()))
    assert got.keys() == expected.keys(), (f"missing {len(expected.keys() - got.keys())}, "
                                          f"unexpected {len(got.keys() - expected.keys())}")
    assert all(got[k] == v for k, v in expected.items()), "a record's value differs from what was produced"


def wait_for_version(options: dict, uri: str, version: int, proc, timeout_s: float = 180) -> None:
    from deltalake import DeltaTable

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended early:\n{proc.stdout.read()[-3000:]}")
        try:
            if DeltaTable(uri, storage_options=options).version() >= version:
                return
        except Exception:  # noqa: BLE001 - not created yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{uri} did not reach version {version} in {timeout_s:g}s")


def assert_no_secret(options: dict, *texts: str, paths=()) -> None:
    secrets = [options["AWS_SECRET_ACCESS_KEY"], ACCESS_KEY_ID]
    for text in texts:
        assert not any(s in text for s in secrets), "a credential was printed"
    for root in paths:
        for f in Path(root).rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert not any(s.encode() in data for s in secrets), f"a credential is stored in {f}"


@pytest.mark.slow
@pytest.mark.scenario
def test_bronze_ingest_to_s3_lands_every_record_once_across_a_sigkill_and_a_lost_checkpoint(
        s3, live_producer, topic_name, tmp_path):
    table = f"s3://lake/{topic_name}/bronze"
    checkpoint = str(tmp_path / "checkpoint")  # the driver's own disk; the table is all that must survive
    common = ["ingest", "--topic", topic_name, "--table", table, "--checkpoint", checkpoint, "--master", "local[2]"]

    # A continuous job, killed with SIGKILL in its third micro-batch after the files were uploaded,
    # before their Delta commit: an aborted attempt's objects stay behind, never referenced.
    # The records are produced one at a time once its query runs (Spark wrote the checkpoint's
    # metadata): 25 s of them, so the kill comes mid-stream however long the JVM took to start.
    from streamlake.kafka.producer import ensure_topic
    from streamlake.kafka.client import client_config

    ensure_topic(client_config(), topic_name, 3)
    job = cli(*common, "--processing-time", "1", *storage_flags(s3),
              env={"STREAMLAKE_CRASH_AT": "after_files:2"}, wait=False)
    deadline = time.monotonic() + 240
    while not (Path(checkpoint) / "metadata").exists():
        assert job.poll() is None, f"the job ended before its query started:\n{job.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "the job's query did not start in 240 s"
        time.sleep(0.5)
    producer = live_producer(topic_name, partitions=3, rate=60, count=1500, seed=7,
                             duplicate_fraction=0.05, malformed_fraction=0.05, late_fraction=0.1)
    _, out1 = finish(job, 240)
    assert job.returncode == 128 + 9, f"the job should have been SIGKILLed before a commit:\n{out1[-3000:]}"
    assert producer.running, "the kill should happen while records are still being produced"
    orphans = data_objects(s3, table) - snapshot_objects(s3, table)
    assert orphans, "the killed attempt had uploaded its data files"

    # The driver's disk is lost: the restart has only the table's commits to go on.
    shutil.rmtree(checkpoint)
    producer.wait_delivered(1500, timeout_s=120)
    producer.stop()
    code, out2 = cli(*common, "--available-now", *storage_flags(s3))
    assert code == 0, out2[-3000:]
    assert_each_record_once(s3, table, producer)

    code, audit = cli("audit", "--topic", topic_name, "--table", table, *storage_flags(s3), timeout=120)
    assert code == 0, audit[-3000:]
    assert json.loads(audit[:audit.rindex("}") + 1])["table_rows"] == 1500

    # Abort = never referenced: vacuum finds exactly the killed attempt's objects and deletes them.
    vacuum = ["vacuum", "--table", table, "--retention-hours", "0", *storage_flags(s3)]
    code, listed = cli(*vacuum, "--dry-run", timeout=120)
    assert code == 0, listed
    listed_files = json.loads(listed[:listed.rindex("}") + 1])["files"]
    assert {f.split("://", 1)[1] if "://" in f else f"{table.split('://', 1)[1]}/{f}" for f in listed_files} == orphans
    code, out3 = cli(*vacuum, timeout=120)
    assert code == 0, out3
    assert data_objects(s3, table) == snapshot_objects(s3, table)
    assert_each_record_once(s3, table, producer)

    # No credential in what the jobs printed, the driver's checkpoint, the platform's logs,
    # or any object of the table (its Delta log included).
    assert_no_secret(s3, out1, out2, audit, listed, out3, paths=[tmp_path, os.environ["STREAMLAKE_HOME"]])
    opts = storage_options(table, s3, env={})
    fs, _ = arrow_filesystem(opts)
    for key in objects(s3, table):
        if "/_delta_log/" in key:
            with fs.open_input_stream(key) as fh:
                assert_no_secret(s3, fh.read().decode())


def assert_tables_equal_what_was_produced(s3: dict, root: str, definition_file: Path, producer) -> dict:
    """Quarantine holds exactly the malformed records with their reasons, silver each valid event
    once with its values, each gold table the test's own aggregate (tests/oracle.py) of the
    events not held back as late; some late events were kept. Returns the events by id."""
    import oracle
    from streamlake.pipeline.definition import load_definition

    definition = load_definition(definition_file)
    records = producer.records
    silver = f"{root}/silver"
    where = {r.seq: producer.lineage[r.seq] for r in records}
    # quarantine: exactly the malformed records, each with the reason it was produced with
    quarantine = table_rows(s3, f"{root}/quarantine", ("partition", "offset", "reason")).to_pylist()
    expected = {(*where[r.seq], r.reason) for r in records if r.kind == "malformed"}
    assert sorted((q["partition"], q["offset"], q["reason"]) for q in quarantine) == sorted(expected)
    # silver: each valid event once (duplicates dropped), with the typed values produced
    events = {r.fields[definition.event_id]: r.fields for r in records if r.kind in ("valid", "late")}
    rows = table_rows(s3, silver, definition.field_names).to_pylist()
    ids = [row[definition.event_id] for row in rows]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} events are in silver twice"
    assert set(ids) == set(events)
    assert all(row == events[row[definition.event_id]] for row in rows), "an event's values differ"
    # gold: the test's own aggregate of the events not held back as late; late events all kept
    raw = oracle.load(definition_file)
    for agg in definition.aggregates:
        late = table_rows(s3, f"{root}/{agg.late_table}", (definition.event_id,)).column(0).to_pylist()
        assert set(late) <= set(events) and len(late) == len(set(late)), agg.name
        on_time = [e for i, e in events.items() if i not in set(late)]
        gold = table_rows(s3, f"{root}/{agg.gold_table}", None).to_pylist()
        problems = oracle.compare_gold(oracle.expected_gold(raw, agg.name, on_time), gold, list(agg.keys))
        assert not problems, f"gold/{agg.name}:\n" + "\n".join(problems[:20])
    assert any(table_rows(s3, f"{root}/{a.late_table}", ("offset",)).num_rows for a in definition.aggregates), \
        "late events were produced: some must be kept"
    return events


def assert_silver_and_gold_hold(s3: dict, root: str, definition_file: Path, events: dict, more, when: str) -> None:
    """Silver holds ``events`` and the valid events ``more`` produced, each once; each gold table
    is the test's own aggregate of them all but the late events still pending (a backfill
    applied the others)."""
    import oracle
    from streamlake.pipeline.definition import load_definition

    definition = load_definition(definition_file)
    every = {**events, **{r.fields[definition.event_id]: r.fields for r in more.records if r.kind in ("valid", "late")}}
    ids = table_rows(s3, f"{root}/silver", (definition.event_id,)).column(0).to_pylist()
    assert sorted(ids) == sorted(every), f"silver {when}: each event once"
    raw = oracle.load(definition_file)
    for agg in definition.aggregates:
        late = table_rows(s3, f"{root}/{agg.late_table}", (definition.event_id, "applied")).to_pylist()
        pending = {row[definition.event_id] for row in late if not row["applied"]}
        gold = table_rows(s3, f"{root}/{agg.gold_table}", None).to_pylist()
        expected = oracle.expected_gold(raw, agg.name, [e for i, e in every.items() if i not in pending])
        problems = oracle.compare_gold(expected, gold, list(agg.keys))
        assert not problems, f"gold/{agg.name} {when}:\n" + "\n".join(problems[:20])


def executors_of(work_dir: Path) -> list:
    """The executor JVMs a standalone worker launched: their working directory is under the
    worker's work directory (``<work dir>/<app id>/<executor id>``)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if "CoarseGrainedExecutorBackend" in " ".join(proc.info["cmdline"] or ()) and \
                str(proc.info["cwd"] or "").startswith(str(work_dir)):
            found.append(proc)
    return found


def kill_an_executor_running_a_task(work_dir: Path, ui_port: int, job, timeout_s: float = 180,
                                    attempts: int = 5) -> str:
    """SIGKILL an executor of the worker at ``work_dir`` (and its Python workers) at a moment the
    driver's REST API shows it running a task, mid-batch; if its task ended between the look and
    the kill, kill the worker's next executor the same way, up to ``attempts`` times. The sign
    that a task was lost is the driver's own record of a failed task of that executor with
    ``ExecutorLostFailure`` as its reason: another executor's task failing to fetch the killed
    one's shuffle output (``FetchFailed``) is not one. Returns the id of the executor that lost
    a task."""
    import urllib.request

    import psutil

    api = f"http://127.0.0.1:{ui_port}/api/v1/applications"

    def get(path: str):
        with urllib.request.urlopen(f"{api}{path}", timeout=2) as resp:
            return json.load(resp)

    def lost_tasks(app: str, executor_id: str) -> list[str]:
        """The reasons of the failed tasks the driver records for ``executor_id``, ExecutorLostFailure only."""
        return [task.get("errorMessage", "")
                for stage in get(f"/{app}/stages") if stage.get("numFailedTasks", 0)
                for task in get(f"/{app}/stages/{stage['stageId']}/{stage['attemptId']}/taskList"
                                "?status=failed&length=100")
                if task.get("executorId") == executor_id and "ExecutorLostFailure" in task.get("errorMessage", "")]

    deadline = time.monotonic() + timeout_s
    killed: list[str] = []
    while time.monotonic() < deadline and job.poll() is None and len(killed) < attempts:
        try:
            app = get("")[0]["id"]
            busy = {e["id"] for e in get(f"/{app}/executors") if e.get("activeTasks", 0) > 0}
        except (OSError, ValueError, IndexError, KeyError):  # the driver's UI not up yet
            time.sleep(0.2)
            continue
        for executor in executors_of(work_dir):
            try:
                cmd = executor.cmdline()
                executor_id = cmd[cmd.index("--executor-id") + 1]
                if executor_id in busy:
                    for proc in [executor, *executor.children(recursive=True)]:
                        proc.send_signal(signal.SIGKILL)
                    killed.append(executor_id)
                    break
            except (psutil.NoSuchProcess, ValueError):
                continue
        else:
            time.sleep(0.05)
            continue
        lost = time.monotonic() + 30  # the driver notices the lost executor and fails its tasks
        while time.monotonic() < lost and job.poll() is None:
            try:
                reasons = lost_tasks(app, killed[-1])
                if reasons:
                    print(f"executor {killed[-1]} killed; its lost tasks, as the driver records them: {reasons[:3]}")
                    return killed[-1]
                gone = [e for e in get(f"/{app}/allexecutors") if e["id"] == killed[-1] and not e["isActive"]]
            except (OSError, ValueError, KeyError):
                gone = []
            if gone and time.monotonic() > lost - 20:
                break  # removed 10 s ago and none of its tasks lost: its task had ended before the kill
            time.sleep(0.5)
    raise AssertionError(f"no executor of {work_dir} was killed while it ran a task (killed: {killed})")


@pytest.fixture
def cluster(s3):
    """A Spark standalone cluster of two workers (one core each), each with a work directory of
    its own and the store's credentials and endpoint in its environment (which its executors
    inherit), as on worker machines; they share no path with the lake, which is on S3."""
    from conftest import _free_port
    from streamlake import config
    from streamlake.platform import spark_cluster

    port, ui = _free_port(), _free_port()
    spark_cluster.start(workers=2, cores_per_worker=1, memory="1g", port=port, ui_port=ui,
                        worker_env={k: v for k, v in s3.items() if k.startswith("AWS_")})
    try:
        yield {"master": spark_cluster.master_url(port),
               "work_dirs": [config.home() / "spark" / f"spark-worker-{i}" for i in (1, 2)]}
    finally:
        spark_cluster.stop()


@pytest.mark.slow
@pytest.mark.scenario
def test_the_whole_pipeline_on_s3_and_a_two_worker_cluster_survives_a_lost_executor_a_sigkilled_driver_and_a_lost_driver_disk(
        s3, cluster, live_producer, topic_name, tmp_path, monkeypatch):
    """`pipeline run --root s3://... --master spark://...`: bronze, silver, quarantine, gold and
    late events of the orders example (a tumbling and a session aggregate) on the S3 server,
    computed by a Spark standalone cluster of two workers that share no directory with the lake
    (their executors write the data files to S3 with the credentials of their own environment);
    records produced one at a time while it runs (out of order, late, duplicated, malformed).
    An executor of the first worker is SIGKILLed while it runs a task (the driver's REST API
    says when; Spark retries the task and the master starts a new executor); later the driver is
    SIGKILLed after silver's files of a micro-batch were uploaded, before their commit; then
    the driver's disk is lost (checkpoints, control files). The restart, with nothing but the
    tables, lands every record exactly once in every table: the test compares each with what
    it produced and with gold it aggregates itself (tests/oracle.py). Then, with only the
    credentials in the environment (the root's job recorded the other options): `check`
    proves it, `backfill` applies every late event (gold = the aggregate of every event), and
    `quality run` validates silver. A savepoint taken after the backfill (kept on S3) is
    restored by a new driver with an empty home from its URI alone, after more records were
    produced; the run after it takes them from the savepoint's offsets, each table holds every
    record once, gold equals the test's aggregate, and `check` proves it, incrementally from the
    first driver's proof: the platform's own tables (the ledger of proofs, the checks, the
    operations, the quality results) are on the store too (``STREAMLAKE_PLATFORM_ROOT``), none
    in either driver's home. No credential in any output, file, the stored manifest or the
    platform's tables."""
    import oracle
    from helpers import example
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic
    from streamlake.pipeline.definition import load_definition
    from streamlake.operations.jobs import root_identity
    from streamlake.storage.location import state_dir

    definition_file = example("orders", tmp_path, topic_name, lateness="5s")  # late events sooner
    definition = load_definition(definition_file)
    ensure_topic(client_config(), topic_name, 3)
    root = f"s3://lake/{topic_name}/orders"
    state = Path(state_dir(root))
    platform = f"s3://lake/{topic_name}/platform"  # every process below reads and writes one ledger there
    monkeypatch.setenv("STREAMLAKE_PLATFORM_ROOT", platform)
    monkeypatch.setenv("STREAMLAKE_STORAGE_OPTIONS", ",".join(
        f"{k}={v}" for k, v in s3.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")))
    master = cluster["master"]
    common = ["pipeline", "run", "--definition", str(definition_file), "--root", root, "--master", master,
              "--kafka-option", "fetch.wait.max.ms=100", *storage_flags(s3)]
    from conftest import _free_port

    ui_port = _free_port()  # the driver's UI, whose REST API says when an executor runs a task
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"spark.ui.port {ui_port}\n")
    job = cli(*common, "--processing-time", "1", wait=False,
              env={"STREAMLAKE_CRASH_AT": "after_files_silver:8", "SPARK_CONF_DIR": str(conf_dir)})
    deadline = time.monotonic() + 240
    while not (state / "_checkpoints" / "silver" / "metadata").exists() and job.poll() is None:
        assert time.monotonic() < deadline, "the run's queries did not start in 240 s"
        time.sleep(0.5)
    producer = live_producer(topic_name, partitions=3, rate=40, seed=23, definition=definition,
                             late_fraction=0.06, out_of_order_seconds=5, malformed_fraction=0.08,
                             duplicate_fraction=0.05)
    while not (state / "_checkpoints" / "silver" / "commits" / "2").exists() and job.poll() is None:
        assert time.monotonic() < deadline + 120, "silver committed no micro-batch in 360 s"
        time.sleep(0.2)
    # Returns only once the driver's own record (its REST API) has a task of the killed executor
    # failed with ExecutorLostFailure. Not the run's output: when the worker reports the exit
    # before the driver misses the executor, Spark logs the loss ("exited unrelated to the running
    # tasks") at INFO, below the driver's WARN (seen 2026-11-29).
    kill_an_executor_running_a_task(cluster["work_dirs"][0], ui_port, job)
    _, out1 = finish(job, 400)
    assert job.returncode == 128 + 9, f"the run should have been SIGKILLed before silver's commit:\n{out1[-3000:]}"
    assert producer.running, "the kill should happen while records are still being produced"
    silver = f"{root}/silver"
    assert data_objects(s3, silver) - snapshot_objects(s3, silver), "the killed attempt had uploaded silver's files"

    shutil.rmtree(state)  # the driver's disk is lost: the restart has only the tables' commits to go on
    time.sleep(3)  # records go on arriving while the job is down
    producer.stop()
    records = producer.records
    assert len(producer.lineage) == len(records), "every record produced was delivered"
    code, out2 = cli(*common, "--available-now", timeout=400)
    assert code == 0, out2[-3000:]

    events = assert_tables_equal_what_was_produced(s3, root, definition_file, producer)
    raw = oracle.load(definition_file)
    assert "on the Spark Connect server" not in out2, "an S3 root's run has its own JVM (its credentials)"

    # The root's job recorded the options given, without the secrets: `check` and `backfill --root`
    # need only the credentials, from the environment, as a user's shell has them.
    credentials = {k: s3[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    # (the check and the backfill in a local JVM: the cluster's executors already read and wrote
    # the store above, gold's files included; two executor JVMs fewer each)
    code, out3 = cli("check", "--root", root, "--master", "local[2]", env=credentials, timeout=400)
    assert code == 0, out3[-3000:]
    for proof in (f"EXACTLY ONCE: {len(records)} rows", "EVERY BRONZE ROW ONCE", "GOLD EQUALS RECOMPUTE"):
        assert proof in out3, (proof, out3[-3000:])
    code, out4 = cli("backfill", "--root", root, "--master", "local[2]", env=credentials, timeout=400)
    assert code == 0 and "restated" in out4, out4[-3000:]
    for agg in definition.aggregates:  # every late event applied: gold is the aggregate of every event
        gold = table_rows(s3, f"{root}/{agg.gold_table}", None).to_pylist()
        problems = oracle.compare_gold(oracle.expected_gold(raw, agg.name, list(events.values())), gold,
                                       list(agg.keys))
        assert not problems, f"gold/{agg.name} after the backfill:\n" + "\n".join(problems[:20])
        assert all(table_rows(s3, f"{root}/{agg.late_table}", ("applied",)).column(0).to_pylist())
    # A savepoint of the job (idle: no JVM), kept beside its tables on S3.
    job_name = root_identity(root)
    code, out8 = cli("savepoint", "create", "--job", job_name, env=credentials, timeout=120)
    assert code == 0, out8[-3000:]
    savepoint = f"{root}/_savepoints/{out8.split()[0]}"
    assert f"is at {savepoint}" in out8, out8
    code, out5 = cli("quality", "run", "--root", root, "--table", "silver", "--json", env=credentials, timeout=300)
    assert code == 0, out5[-3000:]
    quality = json.loads(out5[out5.index("{"):out5.rindex("}") + 1])
    assert quality["rows"] >= len(events) and quality["status"] in ("PASS", "WARN"), quality
    # More records after the savepoint (the job is not running).
    more = live_producer(topic_name, partitions=3, count=150, seed=24, definition=definition)
    more.wait_delivered(150, timeout_s=60)
    more.stop()

    # A new driver machine (an empty STREAMLAKE_HOME: no job, checkpoint or ledger) restores the
    # savepoint from its URI; the job is defined again from the manifest. The run after it takes
    # the 150 records from the savepoint's offsets: every table holds every record once.
    new_driver = {**credentials, "STREAMLAKE_HOME": str(tmp_path / "new-driver")}
    public = [f for k, v in s3.items() if k not in credentials for f in ("--storage-option", f"{k}={v}")]
    code, out9 = cli("savepoint", "restore", savepoint, *public, env=new_driver, timeout=120)
    assert code == 0, out9[-3000:]
    restored = json.loads(out9[out9.index("{"):out9.rindex("}") + 1])
    assert restored["job"] == job_name and restored["location"] == savepoint, restored
    code, out10 = cli("pipeline", "run", "--definition", str(definition_file), "--root", root, "--master",
                      master, "--available-now", env=new_driver, timeout=400)
    assert code == 0, out10[-3000:]
    code, out11 = cli("check", "--root", root, "--master", "local[2]", env=new_driver, timeout=400)
    assert code == 0, out11[-3000:]
    for proof in (f"EXACTLY ONCE: {len(records) + 150} rows", "EVERY BRONZE ROW ONCE", "GOLD EQUALS RECOMPUTE",
                  "incremental from the proof"):  # the first driver's proof, read from the store
        assert proof in out11, (proof, out11[-3000:])
    assert_silver_and_gold_hold(s3, root, definition_file, events, more, "after the restore")
    # The platform's tables, on the store: both drivers' checks, the runs and the backfill, silver's validation.
    checks = table_rows(s3, f"{platform}/consistency_checks", ("job", "verdict")).to_pylist()
    assert len([c for c in checks if c["job"] == job_name]) >= 2 and all(c["verdict"] == "PASS" for c in checks)
    assert table_rows(s3, f"{platform}/verified_ranges", ("job",)).column(0).to_pylist().count(job_name) >= 2
    operations = set(table_rows(s3, f"{platform}/operations", ("operation",)).column(0).to_pylist())
    assert {"pipeline-run", "backfill"} <= operations, operations
    validations = table_rows(s3, f"{platform}/quality_results", ("validation_id",)).column(0).to_pylist()
    assert quality["validation_id"] in validations, "silver's validation is recorded on the store"
    for home in (Path(os.environ["STREAMLAKE_HOME"]), tmp_path / "new-driver"):
        local = home / "data" / "_platform" / "operations"
        assert not local.exists() or job_name not in read_local_rows(local, "job"), f"{home} keeps a ledger"
    fs, _ = arrow_filesystem(storage_options(root, s3, env={}))
    with fs.open_input_stream(f"{savepoint.removeprefix('s3://')}/manifest.json") as fh:
        stored_manifest = fh.read().decode()
    assert_no_secret(s3, out1, out2, out3, out4, out5, out8, out9, out10, out11, stored_manifest,
                     *[_object_text(s3, o) for o in objects(s3, platform)],
                     paths=[tmp_path, os.environ["STREAMLAKE_HOME"]])


def read_local_rows(path: Path, column: str) -> list:
    """A column of a local Delta table, read by the test with delta-rs."""
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_table(columns=[column]).column(0).to_pylist()


@pytest.mark.slow
@pytest.mark.scenario
def test_two_ingest_jobs_race_on_one_s3_table_and_each_version_has_one_winner(s3, live_producer, topic_name,
                                                                              tmp_path):
    from deltalake import DeltaTable

    table = f"s3://lake/{topic_name}/raced"
    producer = live_producer(topic_name, partitions=3, rate=100, count=2400, seed=11)
    jobs = [cli("ingest", "--topic", topic_name, "--table", table, "--checkpoint", str(tmp_path / f"ck{i}"),
                "--master", "local[1]", "--processing-time", "0.5", "--query-name", f"racer{i}",
                *storage_flags(s3), wait=False) for i in (1, 2)]
    producer.wait_delivered(2400, timeout_s=120)
    producer.stop()
    opts = dict(storage_options(table, s3, env={}))

    def rows_committed() -> int:
        return len(table_rows(s3, table)) if DeltaTable.is_deltatable(table, storage_options=opts) else 0

    # Both keep committing until the table holds every produced record; then Ctrl-C asks each
    # to stop at its next micro-batch boundary.
    deadline = time.monotonic() + 240
    while rows_committed() < 2400:
        assert time.monotonic() < deadline, "the racing jobs did not ingest every record in 4 minutes"
        ended = [job.stdout.read()[-2000:] for job in jobs if job.poll() is not None]
        assert not ended, ended
        time.sleep(1)
    for job in jobs:
        job.send_signal(signal.SIGINT)
    outputs = [finish(job, 120)[1] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], [out[-2000:] for out in outputs]
    assert_each_record_once(s3, table, producer)

    # One winner per version: in version order, every commit moves each partition it names
    # strictly forward, so no two commits (of either job) ever claimed the same records.
    history = sorted((h for h in DeltaTable(table, storage_options=opts).history() if "streamlake" in h),
                     key=lambda h: h["version"])
    reached: dict[tuple[str, str], int] = {}
    for h in history:
        for topic, parts in h["streamlake"]["endOffsets"].items():
            for p, end in parts.items():
                assert end > reached.get((topic, p), -1), f"version {h['version']} did not move {topic}-{p} forward"
                reached[(topic, p)] = end
    assert sum(reached.values()) == 2400
    writers = {h["streamlake"]["queryId"] for h in history}
    lost = sum(out.count("lost to a concurrent commit") for out in outputs)
    print(f"{len(writers)} writers committed {len(history)} versions; {lost} attempts lost a race and re-planned")
    assert_no_secret(s3, *outputs)


@pytest.mark.slow
def test_an_s3_table_without_a_safe_commit_is_refused_before_anything_is_written(s3, produce, topic_name,
                                                                                   tmp_path):
    produce(topic_name, 50, partitions=1, seed=3)
    table = f"s3://lake/{topic_name}/unsafe"
    unsafe = {k: v for k, v in s3.items() if k != "conditional_put"}
    code, out = cli("ingest", "--topic", topic_name, "--table", table, "--checkpoint", str(tmp_path / "ck"),
                    "--available-now", "--master", "local[1]", env=unsafe)  # credentials in the environment
    assert code == 2, out[-3000:]
    assert "UnsafeStoreError" in out and "conditional_put=etag" in out and "AWS_S3_ALLOW_UNSAFE_RENAME" in out
    assert objects(s3, table) == [], "nothing may be written to a store the job refused"
    assert_no_secret(s3, out)


# One process of the platform recording an operation, a proof and a quality result, once the
# file named by argv[2] exists (so that every process commits at the same moment).
_PLATFORM_WRITER = """
import datetime as dt, os, sys, time
from streamlake.kafka.offsets import TopicPartition
from streamlake.operations.ledger import Proof, ProvenRange, record_proof
from streamlake.delta.records import record_operation
from streamlake.quality.results import append_results
i, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.01)
now = dt.datetime.now(dt.timezone.utc)
record_operation("writer-test", f"job-{i}", {"writer": i})
record_proof(Proof(f"chk-{i}", f"job-{i}", "s3://lake/t", f"table-{i}", int(i), now, ("t",),
                   {TopicPartition("t", 0): ProvenRange(0, 10 + int(i), 10 + int(i), 10 + int(i))}))
append_results([{"run_id": f"run-{i}", "validation_id": f"val-{i}", "validated_at": now, "table_name": "silver",
                 "expectation_key": f"key-{e}", "success": True} for e in range(3)])
"""


@pytest.mark.slow
def test_the_platform_tables_on_s3_take_concurrent_writers_once_each_and_refuse_an_unsafe_store(
        s3, tmp_path, monkeypatch):
    """The ledger (``verified_ranges``), the operations and the quality results under
    ``STREAMLAKE_PLATFORM_ROOT=s3://...``, its public options in
    ``STREAMLAKE_STORAGE_OPTIONS`` and the credentials in ``AWS_*``: six processes
    record an operation, a proof and three quality rows at the same moment; each table has one
    commit per writer and every row is there once (read back by the test with delta-rs and
    pyarrow), with nothing under their ``STREAMLAKE_HOME``. Without a
    safe commit the first write is refused before any object is written, and a secret in the
    options variable is refused."""
    from deltalake import DeltaTable

    from streamlake.delta.records import record_operation

    platform = f"s3://lake/platform-{uuid.uuid4().hex[:8]}"
    public = {k: v for k, v in s3.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
           "AWS_ACCESS_KEY_ID": s3["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": s3["AWS_SECRET_ACCESS_KEY"],
           "STREAMLAKE_PLATFORM_ROOT": platform, "STREAMLAKE_HOME": str(tmp_path / "home"),
           "STREAMLAKE_STORAGE_OPTIONS": ",".join(f"{k}={v}" for k, v in public.items())}
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", _PLATFORM_WRITER, str(i), str(go)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(1, 7)]
    time.sleep(3)  # every writer imported and waiting
    go.touch()
    outs = [w.communicate(timeout=120)[0] for w in writers]
    assert all(w.returncode == 0 for w in writers), "\n".join(outs)[-4000:]
    opts = dict(storage_options(platform, s3, env={}))
    for table, key, rows_each in (("operations", "job", 1), ("verified_ranges", "check_id", 2),
                                  ("quality_results", "validation_id", 3)):
        uri = f"{platform}/{table}"
        history = DeltaTable(uri, storage_options=opts).history()
        writes = [h for h in history if h["operation"] == "WRITE"]
        # one commit per writer; the only others are the table's creation (two creators racing
        # may both commit one: delta-rs retries the loser's create at the next version)
        assert len(writes) == 6 and all(h["operation"] == "CREATE TABLE" for h in history if h not in writes), (
            table, [(h["version"], h["operation"]) for h in history])
        values = table_rows(s3, uri, (key,)).column(0).to_pylist()
        assert len(values) == 6 * rows_each and len(set(values)) == 6, (table, values)
    assert not (tmp_path / "home" / "data" / "_platform").exists(), "the platform tables are on the store"
    assert_no_secret(s3, *outs, *[_object_text(s3, o) for o in objects(s3, platform)])

    # Without conditional_put (or a lock table, or a declared single writer): refused, nothing written.
    unsafe = f"s3://lake/platform-unsafe-{uuid.uuid4().hex[:8]}"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"):
        monkeypatch.setenv(key, s3[key])
    monkeypatch.setenv("STREAMLAKE_PLATFORM_ROOT", unsafe)
    monkeypatch.setenv("STREAMLAKE_STORAGE_OPTIONS", "AWS_REGION=" + s3["AWS_REGION"])
    with pytest.raises(UnsafeStoreError, match="conditional_put=etag"):
        record_operation("writer-test", "unsafe", {})
    assert objects(s3, unsafe) == []
    monkeypatch.setenv("STREAMLAKE_STORAGE_OPTIONS", f"AWS_SECRET_ACCESS_KEY={s3['AWS_SECRET_ACCESS_KEY']}")
    with pytest.raises(StorageOptionError, match="never in a setting") as refused:
        record_operation("writer-test", "unsafe", {})
    assert s3["AWS_SECRET_ACCESS_KEY"] not in str(refused.value)


def _object_text(options: dict, key: str) -> str:
    """An object of the store (``bucket/key``) as text, undecodable bytes replaced."""
    fs, _ = arrow_filesystem(storage_options("s3://" + key, options, env={}))
    with fs.open_input_stream(key) as fh:
        return fh.read().decode(errors="replace")


def test_the_exporter_tells_an_s3_table_made_again_from_the_one_it_had_open(s3, monkeypatch):
    """A table deleted and made again at the same S3 path (version 0 again, other rows) is read
    anew by the exporter, not answered from the table it kept open or its cached rows: on a store
    it tells them apart by the first commit object's size and time, as by its inode on a disk."""
    import pyarrow.fs as pafs
    from deltalake import write_deltalake

    from streamlake.delta.table import delta_options
    from streamlake.monitoring.collector import PlatformCollector, table_rows

    for key, value in s3.items():  # the exporter reaches the store through its environment
        monkeypatch.setenv(key, value)
    path = f"s3://lake/exporter-{uuid.uuid4().hex[:8]}/t"
    options = delta_options(path, None)
    collector = PlatformCollector(jobs=lambda: [])
    rows = lambda: collector._cached("rows", path, (t := collector._table(path)).version(),  # noqa: E731
                                     lambda _prev: table_rows(t))
    write_deltalake(path, pa.table({"x": [1, 2, 3]}), storage_options=options)
    write_deltalake(path, pa.table({"x": [4]}), mode="append", storage_options=options)
    assert rows() == 4
    fs, root = arrow_filesystem(storage_options(path))
    fs.delete_dir(root)
    assert fs.get_file_info(root).type == pafs.FileType.NotFound
    write_deltalake(path, pa.table({"x": list(range(10))}), storage_options=options)  # version 0 again
    write_deltalake(path, pa.table({"x": [10, 11]}), mode="append", storage_options=options)  # version 1 again
    assert rows() == 12
    write_deltalake(path, pa.table({"x": [12]}), mode="append", storage_options=options)
    assert rows() == 13


def test_the_delta_streaming_source_reads_an_s3_table_incrementally(spark, s3, live_producer, topic_name, tmp_path):
    """bronze on S3 -> ``readStream.format("streamlake-delta")`` in the session's Spark: the
    first run reads every row once, a restart from its checkpoint only what was committed since."""
    from helpers import ingest
    from streamlake.delta.source import register

    table = f"s3://lake/{topic_name}/bronze"
    public = {k: v for k, v in s3.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
    lake = {"table": table, "checkpoint": str(tmp_path / "ingest-ck")}
    register(spark)

    def stream_once(checkpoint) -> list[tuple[int, int, bytes]]:
        seen: list = []
        reader = spark.readStream.format("streamlake-delta").option("maxFilesPerTrigger", 2)
        for key, value in public.items():
            reader = reader.option(f"storage.{key}", value)
        query = (reader.load(table).writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .foreachBatch(lambda df, _id: seen.extend(
                     (r["partition"], r["offset"], bytes(r["value"])) for r in
                     df.select("partition", "offset", "value").collect())).start())
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        return seen

    def produced(producer, skip: int = 0) -> set:
        return {(*producer.lineage[r.seq], r.value) for r in producer.records[skip:] if r.seq in producer.lineage}

    first = live_producer(topic_name, partitions=2, rate=200, count=400, seed=41)
    first.wait_delivered(400)
    first.stop()
    ingest(spark, lake, topic_name, storage_options=public, max_offsets_per_trigger=150)
    checkpoint = str(tmp_path / "reader-ck")
    rows = stream_once(checkpoint)
    assert len(rows) == len(set(rows)) == 400
    assert set(rows) == produced(first)

    # Delta's own connector reads the same table through s3a, s3:// and s3a:// alike, with the
    # options the platform uses for it (set on the session for that bucket only)
    from streamlake.spark.session import reach_store

    reach_store(spark, table, s3)
    for uri in (table, table.replace("s3://", "s3a://", 1)):
        read = spark.read.format("delta").load(uri).select("partition", "offset", "value").collect()
        assert {(r["partition"], r["offset"], bytes(r["value"])) for r in read} == produced(first), uri
    assert spark.sql(f"SELECT count(*) FROM delta.`{table}`").first()[0] == 400

    second = live_producer(topic_name, partitions=2, rate=200, count=300, seed=42)
    second.wait_delivered(300)
    second.stop()
    ingest(spark, lake, topic_name, storage_options=public)
    more = stream_once(checkpoint)
    assert len(more) == len(set(more)) == 300, "a restart reads only what was committed since"
    assert set(more) == produced(second)

    with pytest.raises(Exception, match="hold credentials"):  # InvalidOptionError, through Spark
        (spark.readStream.format("streamlake-delta").option("storage.AWS_SECRET_ACCESS_KEY", "x")
         .load(table).writeStream.format("noop").start())


@pytest.mark.slow
@pytest.mark.scenario
def test_the_ingest_dag_runs_a_pipeline_on_s3_with_its_credentials_from_an_airflow_connection(
        s3, live_producer, topic_name, tmp_path, monkeypatch, request):
    """`airflow dags test ingest_<job>` of a job rooted on the S3 server, once while its records are
    produced one at a time and once after, then `backfill_<job>`, `savepoint`, another run,
    `restore`, and `rescale` with the run on its new settings, with no AWS_* variable
    in Airflow's environment: the credentials and the endpoint come from an Airflow connection
    of type aws (the job's storage connection). The run, its proof (verify) and the backfill run
    on a Spark Connect server started with that connection's credentials (as `make run LAKE=s3`
    starts one) and declared so in `spark_connect_default`, their clients with them in their
    environment; the tables equal what the test produced and
    its own aggregate (after the backfill: of every event), the savepoint's manifest holds
    bronze's offsets, every table's version, each stage's checkpoint and the definition, the
    restore adds one RESTORE commit to each table that moved past it, every check recorded for
    the job passed, and no credential is in the output or anywhere under STREAMLAKE_HOME
    (Airflow's database and task logs included)."""
    import oracle
    import yaml

    from urllib.parse import urlparse

    from conftest import _free_port
    from helpers import EXAMPLES
    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic
    from streamlake.operations.jobs import JobSpec, load_job, save_job
    from streamlake.delta.txn import committed_offsets
    from streamlake.operations.consistency import recent_checks
    from streamlake.operations.savepoints import list_savepoints
    from streamlake.pipeline.definition import load_definition
    from streamlake.orchestration.hooks import connection_environment
    from streamlake.platform import spark_connect
    from streamlake.platform.airflow import airflow_env, airflow_executable, run_airflow
    from deltalake import DeltaTable

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(pipelines))
    name = f"s3{uuid.uuid4().hex[:6]}"
    data = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    data.update(name=name, topics=[topic_name])
    for aggregate in data["aggregates"]:
        aggregate["allowed_lateness"] = "5s"
    definition_file = pipelines / f"{name}.yaml"
    definition_file.write_text(yaml.safe_dump(data, sort_keys=False))
    definition = load_definition(definition_file)  # the file does not change in this test
    root = f"s3://lake/{name}"
    save_job(JobSpec(name=name, root=root, definition_file=str(definition_file), max_offsets_per_trigger=300,
                     storage_options={"conditional_put": "etag"}, storage_conn_id="lake_s3"))
    ensure_topic(client_config(), topic_name, 3)
    producer = live_producer(topic_name, partitions=3, rate=15, seed=31,
                             definition=definition, late_fraction=0.08,
                             out_of_order_seconds=5, malformed_fraction=0.08, duplicate_fraction=0.05)
    producer.wait_delivered(300, timeout_s=120)

    connection = {"conn_type": "aws", "login": s3["AWS_ACCESS_KEY_ID"], "password": s3["AWS_SECRET_ACCESS_KEY"],
                  "extra": {"region_name": s3["AWS_REGION"], "endpoint_url": s3["AWS_ENDPOINT_URL"]}}
    run_airflow("db", "migrate", timeout=300)
    # The platform's server for this lake: the connection's credentials in its environment
    # (its Python workers read and write the tables' files), declared in its Airflow connection.
    server = spark_connect.start(_free_port(), store_environment=connection_environment(
        connection["login"], connection["password"], connection["extra"]), storage_conn_id="lake_s3")
    request.addfinalizer(spark_connect.stop)
    env = {k: v for k, v in airflow_env().items() if not k.startswith("AWS_")}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **env,
           "STREAMLAKE_PIPELINES": str(pipelines), "AIRFLOW_CONN_LAKE_S3": json.dumps(connection),
           "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": spark_connect.connection(urlparse(server["url"]).port, "lake_s3")}

    def dags_test(dag_id: str, conf: dict, **connections: str) -> str:
        done = subprocess.run([airflow_executable(), "dags", "test", dag_id, "-c", json.dumps(conf)],
                              env={**env, **connections}, capture_output=True, text=True, timeout=900)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert "credentials and endpoint from connection 'lake_s3'" in out, out[-4000:]
        return out

    # One run while the records are being produced (gold's watermark moves on), one after the
    # 300 more produced after it ended (late events are those behind the watermark).
    out0 = dags_test(f"ingest_{name}", {"mode": "scheduled"})
    assert "EVERY BRONZE ROW ONCE" in out0 and "GOLD EQUALS RECOMPUTE" in out0, out0[-4000:]
    # the proof on the server that holds lake_s3's credentials; the run in a JVM of its own (bronze's fast path)
    assert f"verify.py of job {name} on the Spark Connect server {server['url']}" in out0, out0[-4000:]
    assert f"pipeline.py of job {name}: spark-submit, its bronze is on {root}" in out0, out0[-4000:]
    producer.wait_delivered(producer.delivered + 300, timeout_s=120)
    producer.stop()
    out1 = dags_test(f"ingest_{name}", {"mode": "scheduled"})
    for proof in (f"EXACTLY ONCE: {len(producer.records)} rows", "EVERY BRONZE ROW ONCE", "GOLD EQUALS RECOMPUTE"):
        assert proof in out1, (proof, out1[-4000:])
    events = assert_tables_equal_what_was_produced(s3, root, definition_file, producer)
    # the backfill DAG applies every pending late event: gold is then the aggregate of every event
    out2 = dags_test(f"backfill_{name}", {"all_pending": True})
    assert f"backfill.py of job {name} on the Spark Connect server" in out2, out2[-4000:]
    raw = oracle.load(definition_file)
    for agg in definition.aggregates:
        gold = table_rows(s3, f"{root}/{agg.gold_table}", None).to_pylist()
        problems = oracle.compare_gold(oracle.expected_gold(raw, agg.name, list(events.values())), gold,
                                       list(agg.keys))
        assert not problems, f"gold/{agg.name} after the backfill DAG:\n" + "\n".join(problems[:20])
    # The savepoint DAG (its task opens the tables in Airflow's worker, with the connection's
    # credentials), more records and a run, then the restore DAG: the tables are back at the
    # savepoint (its verify proves bronze equals the savepoint's offsets).
    # Its proof where the server's connection declares no store: a spark-submit with the credentials.
    out3 = dags_test("savepoint", {"job": name},
                     AIRFLOW_CONN_SPARK_CONNECT_DEFAULT=spark_connect.connection(urlparse(server["url"]).port))
    assert "verify.py of job %s: spark-submit, its tables are on %s and the Spark Connect server of " \
           "'spark_connect_default' holds no store credentials, not those of 'lake_s3'" % (name, root) in out3, \
        out3[-4000:]
    savepoint = list_savepoints(name)[0]
    assert savepoint.location == f"{root}/_savepoints/{savepoint.id}", savepoint.location
    # The manifest: bronze's offsets as its commits record them, every table's version, each
    # stage's checkpoint and the definition the tables were built with.
    options = dict(storage_options(root, s3, env={}))
    assert savepoint.offsets() == committed_offsets(DeltaTable(f"{root}/bronze", storage_options=options),
                                                    savepoint.offsets())
    assert set(savepoint.versions()) == set(definition.table_names())
    assert set(savepoint.checkpoints) == {"bronze", "silver", "gold"}
    assert savepoint.definition == definition.to_dict(), "the savepoint holds the definition it was built with"
    more = live_producer(topic_name, partitions=3, count=90, seed=32, definition=definition)
    more.wait_delivered(90, timeout_s=60)
    more.stop()
    out4 = dags_test(f"ingest_{name}", {"mode": "scheduled"})
    assert f"EXACTLY ONCE: {len(producer.records) + 90} rows" in out4, out4[-4000:]
    # the proof after an operation is incremental: only the files added since the last proof
    assert "incremental from the proof" in out4, out4[-4000:]
    moved = {t for t, v in savepoint.versions().items()
             if DeltaTable(f"{root}/{t}", storage_options=options).version() > v}
    assert {"bronze", "silver"} <= moved, moved
    out5 = dags_test("restore", {"job": name, "savepoint_id": savepoint.id})
    for proof in ("[restore] job", f"EXACTLY ONCE: {len(producer.records)} rows",
                  "offsets match the expected ones", "restored__"):  # the restore starts the job's run
        assert proof in out5, (proof, out5[-4000:])
    for table in savepoint.versions():  # a restore is a new commit: history is kept
        restores = [c for c in DeltaTable(f"{root}/{table}", storage_options=options).history()
                    if c.get("operation") == "RESTORE"]
        assert len(restores) == (table in moved), (table, restores)
    assert table_rows(s3, f"{root}/bronze", ("offset",)).num_rows == len(producer.records)
    assert sorted(table_rows(s3, f"{root}/silver", (definition.event_id,)).column(0)
                  .to_pylist()) == sorted(events), "silver is back at the savepoint"
    # The rescale DAG: stop-with-savepoint (on S3), new settings (two input splits per partition,
    # gold's aggregations on three partitions, smaller micro-batches), then the job's run on them
    # (`dags test` does not run the run it triggers): it takes the 90 records again and proves it.
    out6 = dags_test("rescale", {"job": name, "spark_conn_id": "spark_default", "total_executor_cores": None,
                                 "executor_cores": None, "min_partitions": 6, "max_offsets_per_trigger": 200,
                                 "gold_partitions": 3})
    assert "rescaled__" in out6, out6[-4000:]
    operation, handover = load_job(name).control.pending_handover()  # binds the job until its run takes it
    assert handover["handed_over"], handover
    out7 = dags_test(f"ingest_{name}", {"mode": "scheduled", "spark_conn_id": "spark_default",
                                        "resumes": "rescale", "handover": operation})
    for proof in (f"EXACTLY ONCE: {len(producer.records) + 90} rows", "[rescale] job", "EVERY BRONZE ROW ONCE",
                  "GOLD EQUALS RECOMPUTE", "pipeline finished: bronze 90 rows"):
        assert proof in out7, (proof, out7[-4000:])
    # Every check after every operation is recorded and passed (the ledger's view of this job).
    done = {(c["operation"], c.get("kind")): c["verdict"] for c in recent_checks(100, name)}
    assert set(done.values()) == {"PASS"}, done
    assert {op for op, _ in done} >= {"ingest-scheduled", "savepoint", "restore", "rescale"}, done
    assert {kind for _, kind in done} == {"kafka-audit", "pipeline-accounting", "gold"}, done
    rescaled = load_job(name)
    assert (rescaled.min_partitions, rescaled.max_offsets_per_trigger, rescaled.gold_partitions) == (6, 200, 3)
    assert_silver_and_gold_hold(s3, root, definition_file, events, more, "after the rescale")
    # The Pipelines and Late events views of the job, served in this process (Airflow's API server
    # in production) with no AWS_* variable: they reach the tables with the connection's
    # credentials (Airflow's connection, from the environment's secrets backend). Versions and
    # late events as the test reads them itself.
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps(connection))
    from helpers import views_client

    pages = views_client()
    overview = next(p for p in pages.get("/api/pipelines").json() if p["name"] == name)
    for table in ("bronze", "silver", "gold/revenue_5m", "late_events/activity"):
        expected = DeltaTable(f"{root}/{table}", storage_options=dict(storage_options(root, s3, env={}))).version()
        assert overview["tables"][table] == expected, (table, overview["tables"])
    hours = pages.get(f"/api/late-events?job={name}").json()
    for agg in definition.aggregates:
        late = table_rows(s3, f"{root}/{agg.late_table}", ("applied",)).column(0).to_pylist()
        mine = [h for h in hours if h["aggregate"] == agg.name]
        assert sum(h["applied"] for h in mine) == sum(late) and sum(h["pending"] for h in mine) == len(late) - sum(late)
        assert overview["pending_late_events"][agg.name] == len(late) - sum(late)
    assert sum(h["applied"] for h in hours) > 0, "the backfill applied late events before the savepoint"
    responses = [pages.get("/pipelines"), pages.get(f"/late-events?job={name}")]
    assert all(r.status_code == 200 for r in responses), [r.text[-2000:] for r in responses]
    html_pages = [r.text for r in responses]
    assert_no_secret(s3, out0, out1, out2, out3, out4, out5, out6, out7, *html_pages,
                     paths=[tmp_path, os.environ["STREAMLAKE_HOME"]])
