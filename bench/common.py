"""Pieces the benchmarks share: a private local Kafka broker, machine load, targets, live producers.

Every figure a bench reports is written next to the machine's load average
(``os.getloadavg()``) when it was measured: the benches run on shared machines,
and a number measured at load 6 on 2 cores means something else than at load 1.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load() -> float:
    """1-minute load average, rounded."""
    return round(os.getloadavg()[0], 2)


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), or the platform's if unreadable:
    machines of the same size here differ in speed by 1.6x and more, so figures name it."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    return f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}"


def spark_cores(master: str) -> int:
    """Cores a Spark master gives the job: local[N] / local[*] / local, else the machine's."""
    if master.startswith("local"):
        inside = master[len("local"):].strip("[]").split(",")[0]
        if inside == "*":
            return os.cpu_count() or 1
        return int(inside) if inside else 1
    return os.cpu_count() or 1


@contextmanager
def private_broker(work: Path):
    """An embedded Kafka of its own (one node, own STREAMLAKE_HOME, free ports) for one bench;
    ``STREAMLAKE_KAFKA_BOOTSTRAP`` points at it while the block runs."""
    os.environ["STREAMLAKE_HOME"] = str(work / "home")
    os.environ.pop("STREAMLAKE_KAFKA_BOOTSTRAP", None)
    from streamlake.platform import broker

    state = broker.start(broker.find_free_port())
    os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"] = state["bootstrap"]
    try:
        yield state["bootstrap"]
    finally:
        broker.stop()


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT MET"


def target_line(what: str, value: float, target: float, unit: str = "", higher_is_better: bool = True,
                digits: int = 2) -> str:
    sign = "≥" if higher_is_better else "≤"
    return (f"{what}: {value:.{digits}f}{unit} (target {sign} {target:g}{unit}): "
            f"{verdict(value, target, higher_is_better)}")


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def write_results(results: Path, name: str, result: dict, markdown, plot) -> None:
    """``<name>.json``, ``<name>.md`` (``markdown(result)``) and ``<name>.png`` (``plot(result, path)``)
    in ``results``; prints the result's summary lines."""
    write_json(results / f"{name}.json", result)
    (results / f"{name}.md").write_text(markdown(result))
    plot(result, results / f"{name}.png")
    print("\n".join(result["summary"]) + f"\nresults in {results}/{name}.md", flush=True)


def rewrite_results(results: Path, name: str, finish, markdown, plot) -> int:
    """``--render``: ``<name>.md`` and ``.png`` (and the summary) again from ``<name>.json``,
    ``finish(result)`` first; nothing is measured."""
    result = json.loads((results / f"{name}.json").read_text())
    finish(result)
    write_results(results, name, result, markdown, plot)
    return 0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


# How a SteadyProducer batches (librdkafka settings on top of its defaults).
PRODUCER_BATCHING = {"one-record": {"linger.ms": 0, "batch.num.messages": 1}, "client-defaults": {}}


@dataclass
class SteadyProducer:
    """Writes ``rate`` records/s from a background thread, batched as ``batching`` says:

    - ``"one-record"``: one record per record batch (``linger.ms=0``,
      ``batch.num.messages=1``), the smallest batches a live producer writes;
    - ``"client-defaults"``: librdkafka's own batching (``linger.ms`` 5 ms): what a
      producer application sends unless it is tuned, small batches at this rate.

    ``make(seq, now)`` returns (key, value, partition) for record ``seq`` produced at
    wall-clock ``now`` (seconds); the record's Kafka timestamp is librdkafka's
    CreateTime, set when ``produce()`` is called, unless ``make`` returns a fourth
    item, the timestamp (epoch ms) to stamp it with. Delivered records are counted;
    with ``keep``, ``acked`` maps (partition, offset) to when the broker's
    acknowledgement arrived (the record is in the log from then on).
    """

    bootstrap: str
    topic: str
    rate: float
    seconds: float
    make: callable
    keep: bool = False
    batching: str = "one-record"
    sent: int = 0
    delivered: int = 0
    errors: list = field(default_factory=list)
    acked: dict = field(default_factory=dict)
    behind_s: float = 0.0  # how far the producer fell behind its schedule at worst
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "SteadyProducer":
        self._thread = threading.Thread(target=self._run, name=f"steady-{self.topic}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _on_delivery(self, err, msg) -> None:
        if err is None:
            self.delivered += 1
            if self.keep:
                self.acked[(msg.partition(), msg.offset())] = time.time()
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        from confluent_kafka import Producer

        config = {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                  "client.id": f"steady-{self.topic}", **PRODUCER_BATCHING[self.batching]}
        producer = Producer(config)
        started = time.monotonic()
        total = int(self.rate * self.seconds)
        try:
            while self.sent < total and not self._stop.is_set():
                due = started + self.sent / self.rate
                ahead = due - time.monotonic()
                if ahead > 0:
                    # librdkafka's poll timeout is whole milliseconds: a shorter one returns at
                    # once and the loop would spin a core that the broker and the job need.
                    producer.poll(min(max(ahead, 0.001), 0.01))
                    continue
                self.behind_s = max(self.behind_s, -ahead)
                now = time.time()
                key, value, partition, *stamp = self.make(self.sent, now)
                extra = {"timestamp": stamp[0]} if stamp else {}
                while True:
                    try:
                        producer.produce(self.topic, value=value, key=key, partition=partition,
                                         on_delivery=self._on_delivery, **extra)
                        break
                    except BufferError:
                        producer.poll(0.01)
                self.sent += 1
                producer.poll(0)
        except Exception as exc:  # noqa: BLE001 - reported by the bench
            self.errors.append(repr(exc))
        finally:
            left = producer.flush(60)
            if left:
                self.errors.append(f"{left} records not delivered")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {load():.1f}] {message}", file=sys.stderr, flush=True)


def run_job(cmd: list[str], log: Path, env: dict | None = None, new_session: bool = False) -> tuple[int, float]:
    """Run a Spark job's command to its end: its stderr and stdout into ``log``, the stdout lines
    that are not Spark's INFO/WARN log lines echoed to the terminal (the job's own progress);
    (exit status, wall seconds). ``new_session``: in a process group of its own."""
    started = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, text=True, env=env,
                                start_new_session=new_session)
        for line in proc.stdout:  # Spark's driver puts the job's log lines here too
            fh.write(line)
            if " INFO " not in line and " WARN " not in line:
                print(f"  {line.rstrip()}", file=sys.stderr)
        code = proc.wait()
    return code, time.perf_counter() - started
