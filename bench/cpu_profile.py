"""Where a command's CPU goes, by kind of process: `make test` on 2 cores is CPU-bound.

    .venv/bin/python bench/cpu_profile.py                 # profiles `make test`
    .venv/bin/python bench/cpu_profile.py -- bash .ci/run # any command

Runs the command and, once a second, reads every process's CPU time from ``/proc``
(user + system, per process identified by pid and start time) and the machine's
from ``/proc/stat``. Each process is counted under a kind (:data:`KINDS`, the first
rule its command line matches): the test session's own JVMs, spark-submit JVMs, the
Spark Connect server, Spark's Python helper processes (streaming source runners,
planner and worker daemons), pytest, Airflow's services and task processes, the
browser, the broker... A process that exits between two readings loses the CPU it
used since the last one, and processes running before the command are counted from
its start; the difference from the machine's total is shown as ``unattributed``.

Writes bench/results/<name>.md, .json and .png (CPU by kind over time, stacked, with
the machine's cores as the ceiling). Prints a progress line every minute.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import RESULTS, load, machine, rewrite_results, write_results  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
BIN_S = 10

# (kind, pattern on the command line); the first match wins, in this order.
KINDS: list[tuple[str, re.Pattern]] = [(kind, re.compile(pattern)) for kind, pattern in [
    ("JVM: Spark Connect server", r"java .*SparkConnectServer"),
    ("JVM: test session (pytest's own Spark)", r"java .*spark\.app\.name=streamlake-tests"),
    ("JVM: Spark standalone master/worker", r"java .*deploy\.(master\.Master|worker\.Worker)\b"),
    ("JVM: Spark executor", r"java .*CoarseGrainedExecutorBackend"),
    ("JVM: spark-submit job", r"java .*SparkSubmit"),
    # the embedded Kafka's nodes and its storage tool (streamlake.platform.broker)
    ("JVM: Kafka broker (kafka.Kafka)", r"java .*\bkafka\.(Kafka|tools\.StorageTool)\b"),
    ("JVM: other", r"^\S*java "),
    ("Python: Spark streaming source runner", r"python_streaming_source_runner"),
    ("Python: Spark worker and planner daemons", r"-m pyspark\.(daemon|worker)\b"),
    ("Python: job driver (jobs/*.py)", r"/jobs/\w+\.py"),
    # the fork server and its children, which keep its command line: Spark's Python daemons,
    # workers and source runners, and the proofs' and backfills' Spark Connect clients
    ("Python: forked by the fork server", r"-m streamlake\.platform\.fork_server\b"),
    ("producers", r"bin/streamlake produce\b"),
    ("streamlake CLI", r"bin/streamlake "),
    ("Python: pytest", r"bin/pytest |exec\(eval\(sys\.stdin|^\[pytest-xdist"),  # xdist workers: execnet's command
    ("Airflow: scheduler", r"bin/airflow scheduler"),
    ("Airflow: API server", r"bin/airflow api[-_]server|^airflow api_server"),
    ("Airflow: DAG processor", r"bin/airflow dag-processor"),
    ("Airflow: triggerer", r"bin/airflow triggerer"),
    ("Airflow: task processes", r"^airflow (worker|task)|bin/airflow (tasks|dags test)"),
    ("Airflow: other", r"bin/airflow |^airflow "),
    ("browser (Chromium, Playwright)", r"chrom|headless_shell|playwright/driver"),
    ("S3 server (moto)", r"\bmoto\b"),
    ("set-up (pip, venv, class archive)", r"\bpip\b|-m venv|class_archive"),
]]


def kind_of(cmdline: str) -> str:
    if not cmdline.strip():  # kernel threads have no command line (kdamond took 58 CPU-s of a run)
        return "kernel threads (not this project's)"
    for kind, pattern in KINDS:
        if pattern.search(cmdline):
            return kind
    return "other"


def _machine_busy_ticks() -> int:
    fields = open("/proc/stat").readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return user + nice + system + irq + softirq


class ProcessSampler:
    """Reads /proc once per ``interval`` s in a thread; CPU seconds by kind and by time bin."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.started = time.monotonic()
        self._last: dict[tuple[str, str], int] = {}
        self._cmd: dict[tuple[str, str], str] = {}
        self.by_kind: Counter = Counter()
        self.by_process: Counter = Counter()
        self.processes: Counter = Counter()
        self.bins: dict[int, Counter] = defaultdict(Counter)
        self.machine_bins: Counter = Counter()
        self._machine_last = _machine_busy_ticks()
        self.machine_total = 0.0
        self._since_boot = float(open("/proc/uptime").read().split()[0])  # when sampling started
        self._stop = threading.Event()
        self.lock = threading.Lock()  # held while a reading updates the counters
        self._read(first=True)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def _read(self, first: bool = False) -> None:
        with self.lock:
            self._read_all(first)

    def _read_all(self, first: bool) -> None:
        slot = int((time.monotonic() - self.started) // BIN_S)
        busy = _machine_busy_ticks()
        self.machine_bins[slot] += (busy - self._machine_last) / TICK
        self.machine_total += (busy - self._machine_last) / TICK
        self._machine_last = busy
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    stat = fh.read()
                fields = stat[stat.rfind(")") + 2:].split()
                key, ticks = (pid, fields[19]), int(fields[11]) + int(fields[12])
                if key not in self._cmd or not self._cmd[key].startswith(("/", "java")):
                    # re-read until the process has exec'd what it runs (bash spark-class -> java)
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        self._cmd[key] = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            previous = self._last.get(key)
            self._last[key] = ticks
            if first:
                continue
            if previous is None:
                self.processes[kind_of(self._cmd[key])] += 1
                # a process that started after the sampler: all its CPU is the command's
                previous = 0 if int(fields[19]) / TICK >= self._since_boot else ticks
            used = (ticks - previous) / TICK
            if used > 0:
                kind = kind_of(self._cmd[key])
                self.by_kind[kind] += used
                self.by_process[key] += used
                self.bins[slot][kind] += used

    def command_line(self, key: tuple[str, str]) -> str:
        return self._cmd.get(key, "")


def report(sampler: ProcessSampler, command: list[str], seconds: float, code: int) -> dict:
    attributed = sum(sampler.by_kind.values())
    kinds = [{"kind": k, "cpu_s": round(v, 1), "share": round(v / sampler.machine_total, 3) if sampler.machine_total else 0,
              "processes": sampler.processes[k]} for k, v in sampler.by_kind.most_common()]
    kinds.append({"kind": "unattributed", "cpu_s": round(sampler.machine_total - attributed, 1),
                  "share": round(1 - attributed / sampler.machine_total, 3) if sampler.machine_total else 0,
                  "processes": 0})
    cores = os.cpu_count() or 1
    slots = range(max(sampler.machine_bins) + 1)
    result = {"command": " ".join(command), "exit_code": code, "wall_s": round(seconds, 1), "cores": cores,
              "machine_cpu_s": round(sampler.machine_total, 1),
              "busy": round(sampler.machine_total / (cores * seconds), 3) if seconds else 0,
              "machine": machine(), "measured_at": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "load_at_end": load(), "kinds": kinds,
              "bins": {"seconds": BIN_S, "machine": [round(sampler.machine_bins[i] / BIN_S, 2) for i in slots],
                       "by_kind": {k: [round(sampler.bins[i][k] / BIN_S, 2) for i in slots] for k in sampler.by_kind}}}
    result["largest_processes"] = [
        {"pid": int(key[0]), "kind": kind_of(sampler.command_line(key)), "cpu_s": round(cpu, 1),
         "command": sampler.command_line(key)[:300]} for key, cpu in sampler.by_process.most_common(30)]
    summarize(result)
    return result


def summarize(result: dict) -> None:
    """The summary lines: wall time, how busy the machine was, the largest kinds."""
    top = ", ".join(f"{k['kind']} {100 * k['share']:.0f} %" for k in result["kinds"][:4])
    result["summary"] = [
        f"{result['command']}: {result['wall_s'] / 60:.1f} min wall, exit {result['exit_code']}; machine "
        f"{100 * result['busy']:.0f} % busy ({result['machine_cpu_s']:.0f} CPU-s on {result['cores']} cores)",
        f"largest: {top}"]


def markdown(result: dict) -> str:
    lines = [f"# CPU by kind of process: `{result['command']}`", "",
             f"{result['machine']}; {result['measured_at']} UTC (the end). Wall {result['wall_s']:.0f} s "
             f"(exit {result['exit_code']}); the machine was busy {100 * result['busy']:.0f} % of the time "
             f"({result['machine_cpu_s']:.0f} CPU-s of {result['cores'] * result['wall_s']:.0f}). "
             "CPU read from /proc once a second per process (bench/cpu_profile.py).", "",
             "| kind of process | CPU-s | share of the machine's CPU | processes |", "|---|---:|---:|---:|"]
    for k in result["kinds"]:
        lines.append(f"| {k['kind']} | {k['cpu_s']:.0f} | {100 * k['share']:.1f} % | {k['processes']} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = result["bins"]
    n = len(bins["machine"])
    grouped: dict[str, list[float]] = {}
    for kind, values in bins["by_kind"].items():  # Airflow's services and tasks as one series
        name = "Airflow: services and tasks" if kind.startswith("Airflow:") else kind
        previous = grouped.get(name, [0.0] * n)
        grouped[name] = [a + b for a, b in zip(previous, values)]
    order = sorted(grouped, key=lambda k: -sum(grouped[k]))
    top, rest = order[:11], order[11:]
    minutes = [i * bins["seconds"] / 60 for i in range(n)]
    series = [grouped[k] for k in top]
    series.append([sum(grouped[k][i] for k in rest) for i in range(n)])
    fig, ax = plt.subplots(figsize=(11, 5.5))
    colors = [plt.get_cmap("tab20")(i) for i in range(len(series))]
    ax.stackplot(minutes, *series, labels=[*top, "everything else"], colors=colors, step="post", alpha=0.9)
    ax.step(minutes, bins["machine"], where="post", color="black", linewidth=0.8, label="machine, all processes")
    ax.axhline(result["cores"], color="red", linestyle="--", linewidth=1, label=f"{result['cores']} cores")
    ax.set_xlabel("minutes since the command started")
    ax.set_ylabel("CPU (cores busy)")
    ax.set_title(f"CPU by kind of process: {result['command']} ({result['wall_s'] / 60:.1f} min)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="make_test_cpu", help="results file name (bench/results/NAME.*)")
    parser.add_argument("--render", action="store_true", help="re-render .md and .png from NAME.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command (default: make test), after --")
    args = parser.parse_args(argv)
    if args.render:
        return rewrite_results(RESULTS, args.name, summarize, markdown, plot)
    command = (args.command[1:] if args.command[:1] == ["--"] else args.command) or ["make", "test"]
    sampler = ProcessSampler().start()
    started = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            with sampler.lock:
                busy, most = sampler.machine_total, sampler.by_kind.most_common(3)
            print(f"[cpu_profile] {elapsed / 60:.0f} min: machine {busy:.0f} CPU-s "
                  f"({100 * busy / ((os.cpu_count() or 1) * elapsed):.0f} % busy); "
                  f"most: {', '.join(f'{k} {v:.0f}' for k, v in most)}", flush=True)
    seconds = time.monotonic() - started
    sampler.stop()
    write_results(RESULTS, args.name, report(sampler, command, seconds, child.returncode), markdown, plot)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
