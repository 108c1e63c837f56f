"""The embedded Kafka (streamlake.platform.broker, `streamlake kafka`): Apache Kafka in KRaft
mode from the jars `make setup` fetched. Real JVMs, real processes, no mocks: every test
starts its own cluster in a home of its own (tmp_path) on free ports, never the session's
broker, and leaves no process behind."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from streamlake import config
from streamlake import jars
from streamlake.platform import broker

CLI = str(Path(sys.executable).parent / "streamlake")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A STREAMLAKE_HOME of the test's own; whatever cluster the test started there is stopped
    at the end, and no JVM of it may remain."""
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    monkeypatch.delenv(config.ENV_BOOTSTRAP, raising=False)
    yield tmp_path
    broker.stop()
    assert not _kafka_jvms(tmp_path)


def _kafka_jvms(home: Path) -> list[psutil.Process]:
    """Java processes of a cluster under ``home`` (their command line names its files)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "kafka.Kafka" in cmd and str(home) in cmd:
            found.append(proc)
    return found


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, config.ENV_HOME: str(home)}
    env.pop(config.ENV_BOOTSTRAP, None)
    return subprocess.run([CLI, "kafka", *args], capture_output=True, text=True, env=env, timeout=180)


def _quiet():
    import logging

    logger = logging.getLogger("tests.kafka-broker.librdkafka")
    logger.setLevel(logging.CRITICAL)
    return logger


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet())


def _produce(bootstrap: str, topic: str, values: list[bytes], **conf) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "logger": _quiet(), **conf})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 2)
    assert producer.flush(30) == 0


def _eventually(read, what: str, timeout: float = 20.0):
    """``read()`` once it returns a true value without a KafkaException: a created topic
    reaches each broker's metadata a moment after CreateTopics returns, and until then that
    broker answers UNKNOWN_TOPIC_OR_PART (real Kafka, not a defect)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = read()
            if value:
                return value
        except KafkaException:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(0.2)


def _read(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[tuple[int, int], list[tuple[int, bytes]]]]:
    """Per partition: (low, high) watermarks and every (offset, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": _quiet()})
    try:
        out = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=20)
            consumer.assign([TopicPartition(topic, p, low)])
            records = []
            while len(records) < high - low:
                msg = consumer.poll(10)
                assert msg is not None, f"partition {p}: {len(records)} of {high - low} records read"
                assert msg.error() is None, msg.error()
                records.append((msg.offset(), msg.value()))
            out[p] = ((low, high), records)
        return out
    finally:
        consumer.close()


def test_start_status_stop_and_topics_survive_a_restart(home):
    port = broker.find_free_port()
    started = _cli(home, "start", "--port", str(port))
    assert started.returncode == 0, started.stderr
    assert f"started at 127.0.0.1:{port}" in started.stdout

    shown = _cli(home, "status")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    bootstrap = f"127.0.0.1:{port}"
    assert status["running"] and status["answers"]
    assert status["bootstrap"] == bootstrap == status["clients_use"] == config.embedded_bootstrap()
    [node] = status["brokers"]
    assert (node["id"], node["port"], node["controller_port"]) == (1, port, port + 1)
    assert psutil.pid_exists(node["pid"]) and _kafka_jvms(home)[0].pid == node["pid"]
    assert status["kafka"] == "4.1.1" and status["cluster_id"]

    # idempotent on the same layout, a clear error on another
    again = broker.start(port)
    assert again["already_running"] and again["brokers"][0]["pid"] == node["pid"]
    with pytest.raises(broker.KafkaStartError, match="already runs here with 1 node"):
        broker.start(port + 10)
    with pytest.raises(broker.KafkaStartError, match="already runs here"):
        broker.start(port, brokers=3)

    topic = "survivor"
    admin = _admin(bootstrap)  # referenced while its futures run
    assert admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30) is None
    _produce(bootstrap, topic, [f"v{i}".encode() for i in range(11)])
    before = _read(bootstrap, topic, 2)
    assert {p: w for p, (w, _) in before.items()} == {0: (0, 6), 1: (0, 5)}

    stopped = _cli(home, "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    assert not _kafka_jvms(home) and not psutil.pid_exists(node["pid"])
    assert not broker.status()["running"] and not (config.run_dir() / "kafka.json").exists()
    assert _cli(home, "status").returncode == 1

    restarted = broker.start()  # the recorded port, the same data
    assert not restarted["already_running"] and restarted["bootstrap"] == bootstrap
    assert restarted["cluster_id"] == status["cluster_id"]
    assert _read(bootstrap, topic, 2) == before  # same records at the same offsets


def test_three_nodes_replicate_every_topic_three_times_with_two_in_sync(home):
    port = broker.find_free_port(brokers=3)
    state = broker.start(port, brokers=3)
    bootstrap = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    assert state["running"] and state["bootstrap"] == bootstrap
    assert [(b["id"], b["port"], b["controller_port"]) for b in state["brokers"]] == \
        [(1, port, port + 3), (2, port + 1, port + 4), (3, port + 2, port + 5)]
    assert len({b["pid"] for b in state["brokers"]}) == 3 and len(_kafka_jvms(home)) == 3
    status = broker.status()
    assert status["answers"] and len(status["brokers"]) == 3

    admin = _admin(bootstrap)
    topic = "replicated"
    assert admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result(30) is None  # the defaults
    partitions = _eventually(lambda: admin.list_topics(topic, timeout=10).topics[topic].partitions,
                             "partitions in the metadata")
    assert {p: len(m.replicas) for p, m in partitions.items()} == {0: 3, 1: 3, 2: 3}
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = _eventually(lambda: admin.describe_configs([resource])[resource].result(20), "topic configs")
    assert configs["min.insync.replicas"].value == "2"
    _produce(bootstrap, topic, [b"x"] * 10, acks="all")

    pids = [b["pid"] for b in status["brokers"]]
    assert broker.stop()
    assert not _kafka_jvms(home) and not any(psutil.pid_exists(pid) for pid in pids)


@pytest.mark.parametrize("taken", ["client", "controller"])
def test_a_port_in_use_is_refused_and_nothing_starts(home, taken):
    port = broker.find_free_port()
    busy = port if taken == "client" else port + 1
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", busy))
        listener.listen()
        with pytest.raises(broker.KafkaStartError, match=f"port {busy} \\(node 1's {taken} port\\) already in use"):
            broker.start(port)
    assert not _kafka_jvms(home) and not broker.status()["running"]
    assert not broker.cluster_file().exists()  # nothing formatted either


def test_a_node_whose_data_is_gone_is_a_clear_error_and_reset_starts_over(home):
    port = broker.find_free_port()
    broker.start(port)
    broker.stop()

    (broker.data_dir(1) / "meta.properties").unlink()
    with pytest.raises(broker.KafkaStartError, match="lacks its meta.properties") as info:
        broker.start()
    assert "--reset" in str(info.value) and "Nothing was started" in str(info.value)
    shutil.rmtree(broker.data_dir(1))
    with pytest.raises(broker.KafkaStartError, match=f"node 1's data directory {broker.data_dir(1)} is gone"):
        broker.start()
    assert not _kafka_jvms(home)

    reset = _cli(home, "start", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert "deleting the embedded Kafka's data" in reset.stdout and f"started at 127.0.0.1:{port}" in reset.stdout
    assert broker.status()["running"]


def test_a_node_that_does_not_start_reports_its_log_tail_and_nothing_runs(home):
    bad = {"log.retention.check.interval.ms": "soon"}
    invalid = "Invalid value soon for configuration log.retention.check.interval.ms"
    port = broker.find_free_port()
    # a fresh home: Kafka's storage tool refuses the configuration; nothing is formatted
    with pytest.raises(broker.KafkaStartError, match="formatting Kafka node 1's log directory") as info:
        broker.start(port, properties=bad)
    assert invalid in str(info.value) and not broker.kafka_dir().exists()

    # a formatted node: the broker itself exits
    broker.start(port)
    broker.stop()
    with pytest.raises(broker.KafkaStartError, match="exited while starting") as info:
        broker.start(port, properties=bad)
    message = str(info.value)
    assert invalid in message and "logs/kafka-1.log" in message
    assert len(message.splitlines()) <= broker.LOG_TAIL_LINES + 1
    assert not _kafka_jvms(home) and not broker.status()["running"]
    assert not (config.run_dir() / "kafka.json").exists()


def test_missing_java_or_jars_are_clear_errors(home, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setenv("JAVA_HOME", str(home / "no-jdk"))
        with pytest.raises(FileNotFoundError, match="Java not found"):
            broker.start(broker.find_free_port())
    with monkeypatch.context() as patch:
        patch.setattr(jars, "installed_dir", lambda: home / "no-jars")  # as before `make setup`
        with pytest.raises(jars.JarsNotInstalled, match="run `make setup`"):
            broker.start(broker.find_free_port())
    assert not _kafka_jvms(home) and not broker.cluster_file().exists()
