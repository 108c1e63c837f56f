"""Kafka's own faults under a running job: a broker SIGKILLed and restarted, a partition
leader SIGKILLed in a three-node cluster. Real processes only: the embedded Apache Kafka
(KRaft) JVMs of the test's own cluster, the continuous bronze job as a user runs it
(`streamlake job define` + `streamlake job run` under a restart strategy, a spark-submit
of its own), librdkafka producers of the test's own. What must hold afterwards: bronze
holds every record the test was told was written (delivery report, transaction commit)
exactly once, none of an aborted transaction, and the offset audit passes.

Each test starts its cluster in a home of its own (tmp_path) on free ports, never the
session's broker, and leaves no process behind (psutil).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamlake import config, procs
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import TopicPartition as TP
from streamlake.operations.audit import audit_offsets
from streamlake.platform import broker

pytestmark = [pytest.mark.scenario, pytest.mark.slow]
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
PARTITIONS = 3


def _quiet(name: str = "producer") -> logging.Logger:
    logger = logging.getLogger(f"tests.kafka-faults.librdkafka.{name}")
    logger.setLevel(logging.CRITICAL)  # a dead broker makes librdkafka log every reconnect
    return logger


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A STREAMLAKE_HOME of the test's own (its cluster's data, its job's spec)."""
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    monkeypatch.delenv(config.ENV_BOOTSTRAP, raising=False)
    monkeypatch.delenv("STREAMLAKE_CRASH_AT", raising=False)
    return tmp_path


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# --- what the test wrote ------------------------------------------------------------------------

class Ledger:
    """Every value the test wrote and what Kafka said about it: ``acked`` (a delivery report
    without error for a plain record, a committed transaction for a transactional one),
    ``failed`` (a delivery report with an error: it may or may not be in Kafka), ``aborted``
    (records of an aborted transaction, flushed to the log before the abort)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed: dict[bytes, str] = {}
        self.aborted: set[bytes] = set()

    def on_delivery(self, err, msg) -> None:
        with self.lock:
            if err is None:
                self.acked[msg.value()] = (msg.partition(), msg.offset())
            else:
                self.failed[msg.value()] = str(err)


class PlainProducer:
    """An idempotent ``acks=all`` producer in a background thread: ``plain-<tag>-<n>`` to
    partition n % 3, ``rate`` records a second. ``one_at_a_time``: each record waits for
    its delivery report before the next is sent."""

    def __init__(self, bootstrap: str, topic: str, ledger: Ledger, tag: str, rate: float,
                 one_at_a_time: bool = False, **conf):
        self.topic, self.ledger, self.tag, self.rate, self.one_at_a_time = topic, ledger, tag, rate, one_at_a_time
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 0, "client.id": f"faults-{tag}", **conf}, logger=_quiet(tag))
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"plain-{tag}", daemon=True)

    def start(self) -> PlainProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                ahead = self.sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self.producer.poll(min(ahead, 0.05))
                    continue
                value = f"plain-{self.tag}-{self.sent}".encode()
                self.producer.produce(self.topic, value=value, partition=self.sent % PARTITIONS,
                                      on_delivery=self.ledger.on_delivery)
                self.sent += 1
                if self.one_at_a_time:
                    while self.producer.flush(0.1) and not self._stop.is_set():
                        pass
                self.producer.poll(0)
        except Exception as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(repr(exc))

    def halt(self) -> None:
        """The end of a failed test: stop sending, drop what waits."""
        self._stop.set()
        self._thread.join(30)
        self.producer.purge()

    def stop(self, flush_s: float = 120.0) -> int:
        """Stop sending, wait for every delivery report (up to ``flush_s``); the records
        still without one."""
        self._stop.set()
        self._thread.join(30)
        left = self.producer.flush(flush_s)
        assert not self.errors, self.errors
        return left


def transaction(producer: Producer, topic: str, ledger: Ledger, tag: str, count: int, commit: bool) -> None:
    """One transaction of ``count`` records ``txn-<tag>-<n>`` over the partitions; flushed
    before it ends, so an aborted one's records take offsets in the log too."""
    values = [f"txn-{tag}-{n}".encode() for n in range(count)]
    producer.begin_transaction()
    for n, value in enumerate(values):
        producer.produce(topic, value=value, partition=n % PARTITIONS)
    assert producer.flush(30) == 0
    if commit:
        producer.commit_transaction(30)
        with ledger.lock:
            ledger.acked.update({v: (-1, -1) for v in values})
    else:
        producer.abort_transaction(30)
        ledger.aborted.update(values)


def transactional_producer(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"faults-{uuid.uuid4().hex[:8]}",
                         "acks": "all", "linger.ms": 0}, logger=_quiet("txn"))
    producer.init_transactions(60)
    return producer


# --- what Kafka and bronze hold -----------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, **kwargs) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet("admin"))
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, **kwargs)])[topic].result(30)
    wait_until(lambda: _leaders(admin, topic), 30, f"leaders of {topic}'s partitions", 0.2)


def _leaders(admin: AdminClient, topic: str) -> dict[int, int] | None:
    try:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    except Exception:  # noqa: BLE001 - not in this broker's metadata yet
        return None
    leaders = {p: m.leader for p, m in partitions.items()}
    return leaders if len(leaders) == PARTITIONS and all(l >= 0 for l in leaders.values()) else None


def kafka_records(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """Everything a ``read_committed`` consumer of the test's own reads from the topic:
    (partition, offset) -> value (no transaction is open then, so every partition's last
    stable offset is its high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-read-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "error"}, logger=_quiet("reader"))
    try:
        ends = {}
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=20)
            ends[p] = (low, high)
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        records, done = {}, {p for p, (low, high) in ends.items() if low == high}
        deadline = time.monotonic() + 60
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"reading {topic}: partitions {sorted(done)} of {PARTITIONS} read"
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                if msg.offset() >= ends[msg.partition()][1]:
                    done.add(msg.partition())
                continue
            records[(msg.partition(), msg.offset())] = msg.value()
        return records
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-ends-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed"}, logger=_quiet("ends"))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def bronze_committed(table: str, topic: str) -> dict[int, int]:
    try:
        offsets = committed_offsets(open_table(table), [TP(topic, p) for p in range(PARTITIONS)])
    except Exception:  # noqa: BLE001 - not created yet, or a commit in progress
        return {}
    return {tp.partition: n for tp, n in offsets.items()}


def bronze_rows(table: str) -> list[tuple[int, int, bytes]]:
    rows = open_table(table).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    return [(r["partition"], r["offset"], r["value"]) for r in rows]


def caught_up(table: str, topic: str, ends: dict[int, int]) -> bool:
    committed = bronze_committed(table, topic)
    return all(committed.get(p, 0) >= end for p, end in ends.items())


class BronzeWatch:
    """A thread noting when each new bronze version appeared (monotonic time, version)."""

    def __init__(self, table: str):
        self.table, self.versions = table, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                version = open_table(self.table).version()
            except Exception:  # noqa: BLE001 - not created yet
                version = None
            if version is not None and version != last:
                self.versions.append((time.monotonic(), version))
                last = version
            time.sleep(0.2)

    def first_after(self, t: float) -> float | None:
        return next((at for at, _ in self.versions if at > t), None)

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --- the job ------------------------------------------------------------------------------------

class Job:
    """A bronze-only continuous job run as a user runs it: `streamlake job define NAME --topic T
    --root DIR --processing-time 1`, then `streamlake job run NAME` (the supervisor, fixed-delay
    restarts) in a process of its own, its output in a log file."""

    def __init__(self, home: Path, bootstrap: str, topic: str):
        self.name, self.topic = "faults", topic
        self.root = home / "lake" / self.name
        self.table = str(self.root / "bronze")
        self.log = home / "job-run.log"
        self.env = {**os.environ, config.ENV_HOME: str(home), config.ENV_BOOTSTRAP: bootstrap}
        self.env.pop("STREAMLAKE_CRASH_AT", None)
        self.proc: subprocess.Popen | None = None
        self.seen: dict[int, float] = {}  # pid -> create time of every process of the run seen

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([STREAMLAKE, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def define_and_run(self) -> None:
        done = self.cli("job", "define", self.name, "--topic", self.topic, "--root", str(self.root),
                        "--processing-time", "1")
        assert done.returncode == 0, done.stderr
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [STREAMLAKE, "job", "run", self.name, "--restart-strategy", "fixed-delay",
                 "--restart-attempts", "5", "--restart-delay", "2"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def note_processes(self) -> None:
        """Remember every process of the run (the supervisor, spark-submit's JVM, the driver,
        Spark's Python workers) so the end can check that none is left."""
        try:
            family = [psutil.Process(self.proc.pid)]
            family += family[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in family:
            try:
                self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.NoSuchProcess:
                pass

    def running(self) -> bool:
        assert self.proc.poll() is None, f"the supervisor ended: {self.output()[-4000:]}"
        self.note_processes()
        return self.status().get("running", False)

    def status(self) -> dict:
        done = self.cli("job", "status", self.name, timeout=60)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 120) -> dict:
        """`streamlake job stop` (the driver ends at a micro-batch boundary), then the
        supervisor ends: what `job run` printed (runs, restarts, causes)."""
        wait_until(self.running, 90, "the job's driver to run (not between two restarts)", 1)
        done = self.cli("job", "stop", self.name, "--timeout", str(timeout), timeout=timeout + 30)
        assert done.returncode == 0, done.stdout + done.stderr
        self.proc.wait(60)
        out = self.output()
        assert self.proc.returncode == 0, out[-4000:]
        return json.loads(out[out.rindex("\n{"):]) if "\n{" in out else json.loads(out[out.index("{"):])

    def kill(self) -> None:
        """The end of a failed test: whatever of the run is left, SIGKILLed."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 1:
                    proc.kill()
            except psutil.NoSuchProcess:
                pass

    def leftovers(self, grace_s: float = 10) -> list[str]:
        """Processes of the run still alive ``grace_s`` after this call."""
        alive = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 1:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        alive = procs.wait_gone(alive, grace_s)
        left = []
        for proc in alive:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
            except psutil.NoSuchProcess:
                pass
        return left


def processes_under(home: Path) -> list[str]:
    """Live processes whose command line names the test's home (Kafka's JVMs, the job's)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(home) in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid != os.getpid():
                found.append(f"{proc.pid}: {cmd[:200]}")
        except psutil.NoSuchProcess:
            pass
    return found


def shut_down(home: Path, job: Job | None, *helpers) -> list[str]:
    """The end of every test, passed or not: the test's producer and watcher threads, what is
    left of the job, then the cluster. Returns the processes that were left behind (checked
    before anything is killed here: a stopped job must have ended all of its processes)."""
    for helper in helpers:
        if helper is not None:
            helper.halt()
    left = []
    try:
        if job is not None:
            left += job.leftovers()
            job.kill()
    finally:
        broker.stop()
    return left + processes_under(home)


def assert_bronze_is_exactly(job: Job, ledger: Ledger, kafka: dict[tuple[int, int], bytes]) -> None:
    """Bronze holds what Kafka holds, once each, at the same offsets; every acknowledged record
    among them, no aborted one; a record whose delivery failed at most where Kafka has it."""
    rows = bronze_rows(job.table)
    positions = [(p, o) for p, o, _ in rows]
    assert len(positions) == len(set(positions)), "an offset twice in bronze"
    values = [v for _, _, v in rows]
    assert len(values) == len(set(values)), "a record twice in bronze"
    assert {(p, o): v for p, o, v in rows} == kafka, "bronze differs from what Kafka holds (read_committed)"
    held = set(values)
    missing = set(ledger.acked) - held
    assert not missing, f"{len(missing)} acknowledged records not in bronze, e.g. {sorted(missing)[:5]}"
    assert not (ledger.aborted & held), f"aborted records in bronze: {sorted(ledger.aborted & held)[:5]}"
    unexplained = held - set(ledger.acked) - set(ledger.failed)
    assert not unexplained, f"records in bronze the test never wrote: {sorted(unexplained)[:5]}"
    for value, (p, o) in ledger.acked.items():
        if p >= 0:  # a plain record: where its delivery report put it
            assert kafka.get((p, o)) == value, f"{value!r} acknowledged at {p}/{o}, Kafka holds {kafka.get((p, o))!r}"


def assert_audit_passes(job: Job) -> dict:
    report = audit_offsets(job.table, [job.topic])
    assert report.exactly_once, report.summary()
    done = job.cli("audit", "--topic", job.topic, "--table", job.table, timeout=120)
    assert done.returncode == 0, f"streamlake audit:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


# --- the tests ----------------------------------------------------------------------------------

def test_broker_sigkill_between_two_transactions_then_restart_every_record_once(home, monkeypatch):
    """The single broker is SIGKILLed while the continuous job ingests, after transaction A
    committed and before transaction B begins; it restarts on the same port and data. Plain
    idempotent records flow all along (through the outage: librdkafka retries them), and
    transactions commit and abort before and after. The job recovers by itself; bronze then
    holds exactly the acknowledged records, once, none aborted, and the audit passes."""
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    port = broker.find_free_port()
    job = plain = watch = None
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        state = broker.start(port)
        bootstrap = state["bootstrap"]
        monkeypatch.setenv(config.ENV_BOOTSTRAP, bootstrap)  # this process's clients (audit) too
        create_topic(bootstrap, topic)
        ledger = Ledger()
        job = Job(home, bootstrap, topic)
        job.define_and_run()
        plain = PlainProducer(bootstrap, topic, ledger, "a", rate=30).start()
        txn = transactional_producer(bootstrap)
        transaction(txn, topic, ledger, "1", 30, commit=True)
        transaction(txn, topic, ledger, "2", 30, commit=False)
        wait_until(lambda: sum(bronze_committed(job.table, topic).values()) > 100, 180,
                   "the job to ingest its first records")
        job.note_processes()
        timings["job_first_rows_s"] = time.monotonic() - t0
        watch = BronzeWatch(job.table)

        transaction(txn, topic, ledger, "A", 60, commit=True)
        [node] = broker.status(probe=False)["brokers"]
        os.kill(node["pid"], signal.SIGKILL)  # after A's commit, before B begins
        killed_at = time.monotonic()
        wait_until(lambda: not psutil.pid_exists(node["pid"]) or
                   psutil.Process(node["pid"]).status() == psutil.STATUS_ZOMBIE, 10, "the broker to die", 0.1)
        time.sleep(5)  # the job meets a dead broker: connections refused, records pile up in the producer
        restarted = broker.start(port)
        back_at = time.monotonic()
        assert not restarted["already_running"] and restarted["brokers"][0]["pid"] != node["pid"]
        timings["broker_down_s"] = back_at - killed_at

        transaction(txn, topic, ledger, "B", 60, commit=True)  # the same producer, after the restart
        transaction(txn, topic, ledger, "C", 30, commit=False)
        ends_after_b = end_offsets(bootstrap, topic)
        b_committed_at = time.monotonic()
        wait_until(lambda: caught_up(job.table, topic, ends_after_b), 150,
                   "the job to ingest what was written up to transaction B after the broker came back", 0.2)
        timings["recovered_s"] = time.monotonic() - back_at  # broker back -> bronze holds everything up to B
        timings["b_to_bronze_s"] = time.monotonic() - b_committed_at
        first = watch.first_after(back_at)
        timings["first_commit_after_back_s"] = (first - back_at) if first else float("nan")

        time.sleep(3)  # more plain records after the restart
        transaction(txn, topic, ledger, "D", 30, commit=True)
        txn.flush(10)
        left = plain.stop()
        assert left == 0, f"{left} plain records without a delivery report"
        ends = end_offsets(bootstrap, topic)
        wait_until(lambda: caught_up(job.table, topic, ends), 120, "the job to ingest everything", 0.5)
        watch.halt()
        result = job.stop()

        kafka = kafka_records(bootstrap, topic)
        assert not ledger.failed, f"{len(ledger.failed)} deliveries failed: {list(ledger.failed.values())[:3]}"
        assert_bronze_is_exactly(job, ledger, kafka)
        assert len(kafka) == len(ledger.acked)  # nothing failed: Kafka holds exactly what was acknowledged
        summary = assert_audit_passes(job)
        assert summary["table_rows"] == summary["kafka_records"] == len(ledger.acked)
        timings["total_s"] = time.monotonic() - t0
        print(f"\nbroker SIGKILL: {len(ledger.acked)} records ({plain.sent} plain, "
              f"{len(ledger.acked) - plain.sent} in committed transactions), {len(ledger.aborted)} aborted; "
              f"supervisor: {result}; timings: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    finally:
        left = shut_down(home, job, plain, watch)
    assert not left, f"processes left behind: {left}"


def test_leader_sigkill_in_a_three_node_cluster_every_acknowledged_record_once(home, monkeypatch):
    """Three nodes, a topic of 3 replicas with min.insync.replicas=2. While the continuous
    job ingests (bootstrap: all three nodes) and an idempotent acks=all producer writes one
    record at a time, the node leading partition 0 is SIGKILLed. Its partitions move to the
    other nodes; every record whose delivery was acknowledged is in bronze once; bronze is
    exactly what Kafka holds (read_committed, a consumer of the test's own), and the audit
    passes. The killed node is started again and the cluster heals (every replica in sync),
    while the job goes on."""
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    port = broker.find_free_port(brokers=3)
    job = plain = None
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        state = broker.start(port, brokers=3)
        bootstrap = state["bootstrap"]
        assert len(bootstrap.split(",")) == 3
        monkeypatch.setenv(config.ENV_BOOTSTRAP, bootstrap)
        create_topic(bootstrap, topic, replication_factor=3, config={"min.insync.replicas": "2"})
        admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet("admin"))
        leaders = _leaders(admin, topic)
        assert {len(m.replicas) for m in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()} == {3}
        victim = next(b for b in broker.status(probe=False)["brokers"] if b["id"] == leaders[0])
        led = sorted(p for p, leader in leaders.items() if leader == victim["id"])

        ledger = Ledger()
        job = Job(home, bootstrap, topic)
        job.define_and_run()
        plain = PlainProducer(bootstrap, topic, ledger, "f", rate=25, one_at_a_time=True,
                              **{"message.timeout.ms": 30000}).start()
        wait_until(lambda: sum(bronze_committed(job.table, topic).values()) > 100, 180,
                   "the job to ingest its first records")
        job.note_processes()
        timings["job_first_rows_s"] = time.monotonic() - t0

        offsets = KafkaMetadataClient(client_config())  # how the job's source asks Kafka for ends
        tps = [TP(topic, p) for p in range(PARTITIONS)]
        offsets.latest(tps)  # it knows the leaders now
        with ledger.lock:
            before = set(ledger.acked)
        os.kill(victim["pid"], signal.SIGKILL)  # the leader of partition 0 (and of `led`)
        killed_at = time.monotonic()
        # librdkafka alone keeps asking the dead leader (60 s and more); the client finds the new one
        assert set(offsets.latest(tps)) == set(tps)
        timings["ends_answered_s"] = time.monotonic() - killed_at
        offsets.close()

        def moved():
            now = _leaders(admin, topic)
            return now if now and all(now[p] != victim["id"] for p in led) else None

        new_leaders = wait_until(moved, 60, f"partitions {led} to get a leader other than node {victim['id']}", 0.2)
        timings["leader_moved_s"] = time.monotonic() - killed_at

        def acked_on_moved() -> bool:  # records acknowledged on every moved partition since the kill
            with ledger.lock:
                return all(any(part == p and value not in before for value, (part, _) in ledger.acked.items())
                           for p in led)

        wait_until(acked_on_moved, 60, "acknowledged writes to the moved partitions", 0.2)
        timings["writes_resumed_s"] = time.monotonic() - killed_at
        ends = end_offsets(bootstrap, topic)
        wait_until(lambda: caught_up(job.table, topic, ends), 120,
                   "the job to ingest what the new leaders hold", 0.2)
        timings["job_caught_up_after_kill_s"] = time.monotonic() - killed_at

        restarted_at = time.monotonic()
        broker.start(port, brokers=3)  # the killed node again; the others keep running
        timings["node_restart_s"] = time.monotonic() - restarted_at

        def healed() -> bool:
            partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
            return all(len(m.isrs) == 3 for m in partitions.values())

        wait_until(healed, 90, "every partition's replicas to be in sync again", 0.5)
        timings["isr_healed_s"] = time.monotonic() - restarted_at
        time.sleep(3)
        left = plain.stop(flush_s=60)
        assert left == 0, f"{left} records without a delivery report"
        ends = end_offsets(bootstrap, topic)
        wait_until(lambda: caught_up(job.table, topic, ends), 120, "the job to ingest everything", 0.5)
        result = job.stop()

        kafka = kafka_records(bootstrap, topic)
        assert_bronze_is_exactly(job, ledger, kafka)
        summary = assert_audit_passes(job)
        assert summary["table_rows"] == summary["kafka_records"] == len(kafka)
        timings["total_s"] = time.monotonic() - t0
        print(f"\nleader failover: node {victim['id']} (leader of {led}) killed; new leaders {new_leaders}; "
              f"{len(ledger.acked)} acknowledged of {plain.sent} sent, {len(ledger.failed)} failed "
              f"({sorted(set(ledger.failed.values()))[:3]}), {len(set(ledger.failed) & set(kafka.values()))} of "
              f"those in Kafka; supervisor: {result}; timings: "
              + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    finally:
        left = shut_down(home, job, plain)
    assert not left, f"processes left behind: {left}"
