"""The embedded Kafka cluster for development and tests: Apache Kafka 4 in KRaft mode.

``make setup`` fetches the broker's jars from Maven Central (jar set ``kafka``:
``jars/kafka.pom.xml``, :mod:`streamlake.jars`); this module formats
the nodes' log directories and runs ``kafka.Kafka`` on them, one JVM per node,
each node a broker and a KRaft controller on 127.0.0.1. Production uses a
Kafka cluster of its own: set ``STREAMLAKE_KAFKA_BOOTSTRAP``.

Layout under ``$STREAMLAKE_HOME/kafka/``: ``cluster.json`` (the cluster's id and
nodes, written when the nodes are formatted; a restart reuses it),
``log4j2.yaml``, and per node ``node-<id>/server.properties`` and
``node-<id>/data/`` (its log directory: topics and the metadata log). Topics
therefore survive a stop and a start. Node ``i`` (0-based) of a cluster on
port ``P`` with ``N`` nodes serves clients on ``P + i`` and its controller on
``P + N + i``. Each node runs as the service ``kafka-<id>``
(:mod:`streamlake.procs`, log ``logs/kafka-<id>.log``); while the
cluster runs, ``run/kafka.json`` holds its bootstrap servers
(:func:`streamlake.config.embedded_bootstrap`).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from streamlake import config
from streamlake import jars
from streamlake import procs
from streamlake.spark.session import C1_JIT_OPTIONS

JAR_SET = jars.KAFKA
SERVICE_PREFIX = "kafka-"
RUN_STATE = "kafka.json"
MAX_BROKERS = 5
#: Seconds a node may take from launch to "Kafka Server started" (about 4 s when idle on
#: 2 cores; three nodes starting together on a machine that also runs Spark take longer).
START_TIMEOUT_S = 90
#: Seconds a node may take to stop on SIGTERM before it is killed: the nodes of a 3-node cluster
#: stopped together take up to ~6 s (the last one waits 5 s for its quorum); a node left
#: without a quorum never finishes its controlled shutdown.
STOP_TIMEOUT_S = 12
#: Lines of a node's log shown when it does not start.
LOG_TAIL_LINES = 20

#: The nodes' JVM. Heap: a node of this configuration held 44-46 MiB live (16 MiB of it the
#: cleaner's buffer, see server_properties), idle and after 1,000,000 records of 200 bytes
#: (2026-12-06; resident 206-250 MiB per node). SerialGC: one GC thread and no concurrent ones on a 2-core machine
#: that runs Spark beside it (Kafka's scripts pick G1 for large heaps). JIT stopped at C1, as in
#: the platform's Spark JVMs (streamlake.spark.session): C2's compilations cost more CPU than they
#: save in a local broker. Measured on 2 cores, 2026-12-07, a node's CPU from launch to started,
#: 30 s idle, then 100,000 records of 1 KB produced at 5,000/s: 12.3 and 12.6 CPU-s with C2,
#: 7.5 and 8.2 with C1 only (start 3.4 against 2.1).
JVM_OPTIONS = ("-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", *C1_JIT_OPTIONS, "-Djava.awt.headless=true")

#: log4j2 configuration of every node: warnings and errors, and the lines saying that a node
#: starts, started and stops (the default INFO writes the whole configuration, ~1,200 lines
#: per start).
LOG4J2_YAML = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: kafka.server.SharedServer
        level: INFO
"""

#: What a node's log says once it serves clients (kafka.server.KafkaRaftServer).
STARTED_LINE = "Kafka Server started"


@dataclass(frozen=True)
class Node:
    id: int
    port: int             # clients (PLAINTEXT listener)
    controller_port: int  # the KRaft controller listener


class KafkaStartError(RuntimeError):
    """The cluster could not start; nothing of it is left running."""


def kafka_dir() -> Path:
    """The cluster's home: ``$STREAMLAKE_HOME/kafka`` (not created here)."""
    return config.home(create=False) / "kafka"


def cluster_file() -> Path:
    return kafka_dir() / "cluster.json"


def node_dir(node_id: int) -> Path:
    return kafka_dir() / f"node-{node_id}"


def data_dir(node_id: int) -> Path:
    """Node ``node_id``'s log directory (``log.dirs``), formatted by Kafka's storage tool."""
    return node_dir(node_id) / "data"


def service(node_id: int) -> str:
    return f"{SERVICE_PREFIX}{node_id}"


def is_node_service(name: str) -> bool:
    return name.startswith(SERVICE_PREFIX) and name[len(SERVICE_PREFIX):].isdigit()


def layout(port: int, brokers: int) -> list[Node]:
    """The nodes of a cluster of ``brokers`` nodes whose first client port is ``port``."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise KafkaStartError(f"--brokers must be 1..{MAX_BROKERS}, not {brokers}")
    if not 1024 <= port <= 65535 - 2 * brokers:
        raise KafkaStartError(f"port {port} out of range: the cluster uses ports {port}..{port + 2 * brokers - 1}")
    return [Node(i + 1, port + i, port + brokers + i) for i in range(brokers)]


def find_free_port(brokers: int = 1) -> int:
    """A port ``P`` such that ``P`` .. ``P + 2*brokers - 1`` (the layout's client and controller
    ports) are free on 127.0.0.1 now (tests and benchmarks start clusters there). Chosen below
    the kernel's ephemeral range: outgoing connections take their local ports from that range,
    so a port free there now may be a client's by the time a node binds it (seen: a 3-node
    cluster's controller port taken while the other test worker's clients connected)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10_000, low - 2 * brokers)
        if all(_bindable(p) for p in range(port, port + 2 * brokers)):
            return port
    raise RuntimeError(f"found no {2 * brokers} consecutive free ports on 127.0.0.1 in 10000-{low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def java_executable() -> str:
    """The ``java`` of ``$JAVA_HOME``, else the one on PATH. Raises FileNotFoundError."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise FileNotFoundError(f"Java not found ({where}): the Kafka broker needs Java 17+ "
                                f"(Debian/Ubuntu: apt-get install openjdk-17-jre-headless, or set JAVA_HOME)")
    return candidate


def new_cluster_id() -> str:
    """A KRaft cluster id, as ``kafka-storage random-uuid`` makes one: 16 random bytes in
    URL-safe base64 without padding, never starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


# --- the cluster's record and each node's configuration -------------------------------------

def load_record() -> dict | None:
    """``cluster.json``: ``{"cluster_id", "kafka", "nodes": [{id, port, controller_port}]}``, or None."""
    try:
        return json.loads(cluster_file().read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise KafkaStartError(f"the Kafka cluster record {cluster_file()} is unreadable ({exc}); "
                              f"start over empty with `streamlake kafka start --reset`") from None


def _nodes_of(record: dict) -> list[Node]:
    return [Node(**n) for n in record["nodes"]]


def _write_record(cluster_id: str, nodes: list[Node]) -> None:
    record = {"cluster_id": cluster_id, "kafka": _kafka_version(), "nodes": [asdict(n) for n in nodes]}
    tmp = cluster_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(cluster_file())


def _kafka_version() -> str:
    names = [p.name for p in jars.jar_dir(JAR_SET).glob("kafka_2.13-*.jar")]
    return names[0].removeprefix("kafka_2.13-").removesuffix(".jar") if names else "unknown"


def server_properties(node: Node, nodes: list[Node], extra: dict | None = None) -> str:
    """Node ``node``'s ``server.properties``: every node a broker and a controller of one static
    KRaft quorum on 127.0.0.1, with the settings of a dev/test cluster (each says why)."""
    replicas = min(3, len(nodes))
    min_isr = max(1, replicas - 1)
    voters = ",".join(f"{n.id}@127.0.0.1:{n.controller_port}" for n in nodes)
    lines = [
        "# Written by streamlake.platform.broker at every start: edits here are overwritten.",
        "process.roles=broker,controller",
        f"node.id={node.id}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir(node.id)}",
        f"# Replication: {replicas} replica(s) of every topic the cluster creates (Kafka's defaults, 1 and 3,",
        "# would leave a 3-node cluster without redundancy or a 1-node cluster without its internal",
        "# topics); with 3 replicas an acks=all write needs 2 in sync, so it survives a node's death.",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        "# A consumer group's first rebalance at once, not after 3 s (Kafka's default waits for more members).",
        "group.initial.rebalance.delay.ms=0",
        "# Retention and compaction within seconds, not minutes, so their tests do not wait: the retention",
        "# check every 2 s (default 5 min), the cleaner's idle back-off 1 s (default 15 s), and the",
        "# log manager's periodic tasks from 1 s after start-up (default 30 s).",
        "log.retention.check.interval.ms=2000",
        "log.cleaner.backoff.ms=1000",
        "log.initial.task.delay.ms=1000",
        "# The log cleaner's (compaction's) key map: 16 MiB (about 700,000 keys per pass) instead of",
        "# 128 MiB of heap, which Kafka allocates at start-up whether a topic is compacted or not.",
        "log.cleaner.dedupe.buffer.size=16777216",
    ]
    if extra:
        lines.append("# Given to this start (streamlake.platform.broker.start(properties=...)):")
        lines += [f"{key}={value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def _write_configs(nodes: list[Node], extra: dict | None) -> None:
    (kafka_dir() / "log4j2.yaml").write_text(LOG4J2_YAML)
    for node in nodes:
        node_dir(node.id).mkdir(parents=True, exist_ok=True)
        (node_dir(node.id) / "server.properties").write_text(server_properties(node, nodes, extra))


def _java_command(classpath: str, main: str, *args: str) -> list[str]:
    return [java_executable(), *JVM_OPTIONS, "-cp", classpath,
            f"-Dlog4j2.configurationFile={kafka_dir() / 'log4j2.yaml'}", main, *args]


def _format(cluster_id: str, nodes: list[Node], classpath: str) -> None:
    """Format every node's log directory (Kafka's storage tool, one JVM each, side by side)."""
    def run(node: Node) -> tuple[Node, subprocess.CompletedProcess]:
        cmd = _java_command(classpath, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                            "-c", str(node_dir(node.id) / "server.properties"))
        return node, subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        results = list(pool.map(run, nodes))
    for node, result in results:
        if result.returncode != 0 or not (data_dir(node.id) / "meta.properties").exists():
            output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
            raise KafkaStartError(f"formatting Kafka node {node.id}'s log directory {data_dir(node.id)} failed "
                                  f"(exit {result.returncode}):\n{output}")


def _meta_cluster_id(node_id: int) -> str | None:
    try:
        for line in (data_dir(node_id) / "meta.properties").read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def _check_data(record: dict, nodes: list[Node]) -> None:
    """Every node's formatted log directory is there and belongs to the recorded cluster."""
    problems = []
    for node in nodes:
        found = _meta_cluster_id(node.id)
        if found is None:
            gone = "is gone" if not data_dir(node.id).exists() else "lacks its meta.properties (not formatted)"
            problems.append(f"node {node.id}'s data directory {data_dir(node.id)} {gone}")
        elif found != record["cluster_id"]:
            problems.append(f"node {node.id}'s data directory {data_dir(node.id)} belongs to cluster {found}")
    if problems:
        raise KafkaStartError(
            f"the Kafka cluster {record['cluster_id']} recorded in {cluster_file()} ({len(nodes)} node(s)) cannot "
            f"start: {'; '.join(problems)}. Its topics there are lost, and a node must not start on an empty "
            f"directory as if nothing happened. Nothing was started. To start over with an empty cluster: "
            f"`streamlake kafka start --reset` (deletes everything under {kafka_dir()}).")


# --- start, stop, status -----------------------------------------------------------------------

def _running_nodes() -> dict[int, procs.ServiceState]:
    found = {}
    for path in config.run_dir(create=False).glob(f"{SERVICE_PREFIX}*.json"):
        if is_node_service(path.stem):
            state = procs.status(path.stem)
            if state is not None:
                found[int(path.stem[len(SERVICE_PREFIX):])] = state
    return found


def _run_state() -> dict:
    try:
        return json.loads((config.run_dir(create=False) / RUN_STATE).read_text())["info"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _bootstrap(nodes: list[Node]) -> str:
    return ",".join(f"127.0.0.1:{n.port}" for n in nodes)


def _log_path(name: str) -> Path:
    """Where procs.start writes service ``name``'s output (``logs/<name>.log``)."""
    return config.home(create=False) / "logs" / f"{name}.log"


def _log_size(name: str) -> int:
    try:
        return _log_path(name).stat().st_size
    except OSError:
        return 0


def _log_since(name: str, offset: int) -> str:
    try:
        with open(_log_path(name), "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(the log is empty)"


def start(port: int | None = None, brokers: int | None = None, properties: dict | None = None,
          timeout: float = START_TIMEOUT_S) -> dict:
    """Start the cluster (idempotent) and return :func:`status` plus ``already_running``.

    ``port``/``brokers`` default to the recorded cluster's (``cluster.json``), else
    ``config.DEFAULT_BROKER_PORT`` and 1. A fresh home formats new nodes; a home with a
    cluster record starts the recorded nodes on their data (a different ``port`` moves the
    listeners; a different ``brokers`` is refused). ``properties`` are extra broker settings
    for this start (every node; tests use them).

    Raises :class:`KafkaStartError` (a RuntimeError) when a port is in use, a node's data
    directory is gone, a node does not start (with its log's tail), or the cluster already
    runs with another layout; nothing of this start is left running then. Raises
    :class:`~streamlake.jars.JarsNotInstalled` or FileNotFoundError (Java) first."""
    classpath = jars.classpath(JAR_SET)
    java_executable()
    properties = {str(k): str(v) for k, v in (properties or {}).items()}
    record = load_record()
    recorded = _nodes_of(record) if record else None
    if brokers is None:
        brokers = len(recorded) if recorded else 1
    if port is None:
        port = recorded[0].port if recorded else config.DEFAULT_BROKER_PORT
    nodes = layout(port, brokers)

    running = _running_nodes()
    if running:
        current = _nodes_of(record) if record else [Node(**b) for b in _run_state().get("brokers", [])]
        if nodes != current or properties != _run_state().get("properties", {}):
            raise KafkaStartError(
                f"Kafka already runs here with {len(current)} node(s) at {_bootstrap(current) or '?'}"
                f"{' and other properties' if nodes == current else ''}; stop it first (`streamlake kafka stop`)")
        if set(running) == {n.id for n in nodes}:
            return {**status(probe=False), "already_running": True}
        # some nodes died: start those (the others keep running)
        missing = [n for n in nodes if n.id not in running]
        if record is None:
            raise KafkaStartError(f"Kafka runs here without its cluster record {cluster_file()}: stop it "
                                  f"(`streamlake kafka stop`) and start again")
        _check_data(record, missing)
        _check_ports(missing)
        _write_configs(nodes, properties)
        _launch(nodes, missing, classpath, properties, timeout)
        return {**status(probe=False), "already_running": False}

    if recorded is not None:
        if len(recorded) != brokers:
            raise KafkaStartError(
                f"this home's Kafka cluster ({cluster_file()}) has {len(recorded)} node(s), not {brokers}: start it "
                f"with --brokers {len(recorded)}, or start over with an empty cluster of {brokers} with "
                f"`streamlake kafka start --brokers {brokers} --reset` (deletes its topics)")
        _check_data(record, nodes)
        _check_ports(nodes)
        _write_configs(nodes, properties)
        if nodes != recorded:
            _write_record(record["cluster_id"], nodes)
        _launch(nodes, nodes, classpath, properties, timeout)
        return {**status(probe=False), "already_running": False}

    leftovers = sorted(kafka_dir().glob("node-*/data")) if kafka_dir().exists() else []
    if leftovers:
        raise KafkaStartError(
            f"{kafka_dir()} holds Kafka data ({', '.join(map(str, leftovers))}) but no cluster record "
            f"({cluster_file().name}); nothing was started. Start over empty with `streamlake kafka start --reset` "
            f"(deletes everything under {kafka_dir()}).")
    _check_ports(nodes)
    kafka_dir().mkdir(parents=True, exist_ok=True)
    cluster_id = new_cluster_id()
    try:
        _write_configs(nodes, properties)
        _format(cluster_id, nodes, classpath)
    except BaseException:
        shutil.rmtree(kafka_dir(), ignore_errors=True)
        raise
    _write_record(cluster_id, nodes)
    _launch(nodes, nodes, classpath, properties, timeout)
    return {**status(probe=False), "already_running": False, "formatted": True}


def _check_ports(nodes: list[Node]) -> None:
    taken = [f"{p} (node {n.id}'s {what})" for n in nodes
             for p, what in ((n.port, "client port"), (n.controller_port, "controller port"))
             if procs.accepts_connections(p)]
    if taken:
        first, n = nodes[0].port, len(nodes)
        span = (lambda a, b: str(a) if a == b else f"{a}..{b}")
        raise KafkaStartError(
            f"port {', '.join(taken)} already in use by another program; nothing was started. A cluster of "
            f"{n} node(s) on --port {first} uses {span(first, first + n - 1)} for clients and "
            f"{span(first + n, first + 2 * n - 1)} for its controller(s): choose another --port")


def _launch(nodes: list[Node], to_start: list[Node], classpath: str, properties: dict, timeout: float) -> None:
    """Start ``to_start`` side by side (a KRaft quorum elects its leader once a majority of
    voters run) and wait until every one of them serves clients; on any failure stop those
    started here and raise KafkaStartError with the failed node's log tail."""
    started: list[Node] = []
    offsets = {n.id: _log_size(service(n.id)) for n in to_start}
    try:
        for node in to_start:
            procs.start(service(node.id),
                        _java_command(classpath, "kafka.Kafka", str(node_dir(node.id) / "server.properties")),
                        info={"node_id": node.id, "port": node.port, "controller_port": node.controller_port})
            started.append(node)
        _write_run_state(nodes, properties)
        deadline = time.monotonic() + timeout
        waiting = list(to_start)
        while waiting:
            for node in list(waiting):
                log = _log_since(service(node.id), offsets[node.id])
                if STARTED_LINE in log:
                    waiting.remove(node)
                elif procs.status(service(node.id)) is None:
                    raise KafkaStartError(f"Kafka node {node.id} (127.0.0.1:{node.port}) exited while starting; "
                                          f"the end of its log ({_log_path(service(node.id))}):\n"
                                          f"{_tail(log)}")
            if waiting and time.monotonic() > deadline:
                node = waiting[0]
                raise KafkaStartError(
                    f"Kafka node {node.id} (127.0.0.1:{node.port}) did not start within {timeout:g} s; the end of "
                    f"its log ({_log_path(service(node.id))}):\n"
                    f"{_tail(_log_since(service(node.id), offsets[node.id]))}")
            if waiting:
                time.sleep(0.1)
        _await_leaders(nodes, deadline)
    except BaseException:
        _stop_nodes([n.id for n in started])
        if not _running_nodes():
            (config.run_dir() / RUN_STATE).unlink(missing_ok=True)
        raise


def _await_leaders(nodes: list[Node], deadline: float) -> None:
    """Wait until a metadata request lists every node and every partition answers a
    ListOffsets from its leader. A node logs "started" once it is unfenced; the partitions it
    leads after a restart get their leaders a moment later, and a broker's metadata names
    the new leader a moment before that leader serves (until then clients get
    NOT_LEADER_OR_FOLLOWER)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes)}, logger=_quiet_logger())
    ids = {n.id for n in nodes}
    problem = "no metadata"
    while True:
        try:
            metadata = admin.list_topics(timeout=5)
            missing = ids - set(metadata.brokers)
            leaderless = sorted(f"{t}[{p}]" for t, tm in metadata.topics.items()
                                for p, pm in tm.partitions.items() if pm.leader not in ids)
            if missing:
                problem = f"node(s) {sorted(missing)} not in the metadata"
            elif leaderless:
                problem = f"no leader for {', '.join(leaderless[:10])}{' ...' if len(leaderless) > 10 else ''}"
            else:
                partitions = [TopicPartition(t, p) for t, tm in metadata.topics.items() for p in tm.partitions]
                if partitions:
                    futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=5)
                    for future in futures.values():
                        future.result()
                return
        except Exception as exc:  # noqa: BLE001 - not serving yet
            problem = str(exc)
        if time.monotonic() > deadline:
            raise KafkaStartError(f"Kafka at {_bootstrap(nodes)} started but is not serving: {problem}")
        time.sleep(0.2)


def _quiet_logger():
    import logging

    logger = logging.getLogger("streamlake.librdkafka.broker-check")
    logger.setLevel(logging.CRITICAL)
    return logger


def _write_run_state(nodes: list[Node], properties: dict) -> None:
    """``run/kafka.json``: what clients of the embedded cluster use (config.embedded_bootstrap)."""
    info = {"bootstrap": _bootstrap(nodes), "port": nodes[0].port, "brokers": [asdict(n) for n in nodes],
            "data": str(kafka_dir()), "properties": properties}
    (config.run_dir() / RUN_STATE).write_text(json.dumps({"info": info}, indent=2))


def _stop_nodes(ids: list[int]) -> list[int]:
    """Stop those nodes side by side (each a controlled shutdown on SIGTERM), process trees
    included; returns the ids that were running."""
    if not ids:
        return []
    with ThreadPoolExecutor(max_workers=len(ids)) as pool:
        stopped = list(pool.map(lambda i: procs.stop(service(i), timeout=STOP_TIMEOUT_S), ids))
    return [i for i, was in zip(ids, stopped) if was]


def stop() -> bool:
    """Stop every node of the cluster (its data stays). False if none was running."""
    ids = sorted(set(_running_nodes()) | {n["id"] for n in _run_state().get("brokers", [])})
    stopped = _stop_nodes(ids)
    (config.run_dir(create=False) / RUN_STATE).unlink(missing_ok=True)
    return bool(stopped)


def reset() -> dict | None:
    """Delete the cluster's data (every topic) and record, so the next :func:`start` formats an
    empty cluster. Returns what was deleted (``cluster_id``, ``nodes``, ``path``), or None when
    there was nothing. Raises KafkaStartError while the cluster runs."""
    if _running_nodes():
        raise KafkaStartError("Kafka is running: stop it first (`streamlake kafka stop`), then --reset")
    if not kafka_dir().exists():
        return None
    try:
        record = load_record() or {}
    except KafkaStartError:
        record = {}
    shutil.rmtree(kafka_dir())
    return {"cluster_id": record.get("cluster_id"), "nodes": len(record.get("nodes", [])), "path": str(kafka_dir())}


def status(probe: bool = True) -> dict:
    """``running`` (every node of the cluster runs), ``bootstrap`` (all nodes' host:port),
    ``brokers`` ([{id, pid, port, controller_port, running, log}]), ``cluster_id``, ``kafka``
    (its version), ``data`` (its directory); with ``probe``, while running, ``answers``: a
    metadata request lists every node."""
    try:
        record = load_record()
    except KafkaStartError:
        record = None
    info = _run_state()
    nodes = _nodes_of(record) if record else [Node(**b) for b in info.get("brokers", [])]
    running = _running_nodes()
    brokers = []
    for node in nodes:
        state = running.get(node.id)
        brokers.append({"id": node.id, "pid": state.pid if state else None, "port": node.port,
                        "controller_port": node.controller_port, "running": state is not None,
                        "log": str(_log_path(service(node.id)))})
    up = bool(nodes) and all(b["running"] for b in brokers)
    bootstrap = _bootstrap(nodes) if nodes else config.embedded_bootstrap()
    result = {"running": up, "bootstrap": bootstrap, "brokers": brokers,
              "cluster_id": record["cluster_id"] if record else None,
              "kafka": record.get("kafka") if record else None, "data": str(kafka_dir())}
    if up and probe:
        result["answers"] = _answers_metadata(bootstrap, len(nodes))
    return result


def _answers_metadata(bootstrap: str, brokers: int) -> bool:
    """Whether the cluster answers a metadata request listing all its brokers."""
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet_logger()).list_topics(timeout=5)
        return len(metadata.brokers) == brokers
    except Exception:  # noqa: BLE001 - not up
        return False
