"""Background services started by the platform, tracked by pid files, stopped whole.

Every service runs in its own session (process group), and its state file
records pid, process group and start time. Stopping sends SIGTERM to the group,
waits, then SIGKILLs the group and any descendant that left it, so nothing a
service started keeps running (Airflow and Spark both fork helpers).

Also the process tree as Spark sees it (:func:`spark_lineage`, :func:`forked_below`): a
process the platform's fork server forked for one of Spark's launchers
(:mod:`streamlake.platform.fork_server`, :mod:`streamlake.platform.spark_python`) is not a
child of the launcher Spark started, but its environment names it
(:data:`LAUNCHER_PID_ENV`). A top-level helper: the platform's services, the crash points
(:mod:`streamlake.faults`) and Spark's interpreter (:mod:`streamlake.spark.interpreter`) use it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from streamlake import config

# Set in the environment of a process the fork server forks for a launcher (inherited by what it
# forks): the pid of the launcher Spark started, where the process tree as Spark sees it goes on.
LAUNCHER_PID_ENV = "STREAMLAKE_SPARK_LAUNCHER_PID"


@dataclass
class ServiceState:
    name: str
    pid: int
    pgid: int
    create_time: float
    cmd: list[str]
    log: str
    info: dict = field(default_factory=dict)


def state_file(name: str, create: bool = True) -> Path:
    return config.run_dir(create) / f"{name}.json"


def _load(name: str) -> ServiceState | None:
    try:  # reading a state creates no directory: a command refused early leaves the home as it was
        return ServiceState(**json.loads(state_file(name, create=False).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _alive(state: ServiceState) -> bool:
    try:
        proc = psutil.Process(state.pid)
        return abs(proc.create_time() - state.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def status(name: str) -> ServiceState | None:
    """State of a running service, or None (a stale state file is removed)."""
    state = _load(name)
    if state is None:
        return None
    if not _alive(state):
        state_file(name).unlink(missing_ok=True)
        return None
    return state


def running_services() -> list[ServiceState]:
    names = sorted(p.stem for p in config.run_dir().glob("*.json"))
    return [s for s in (status(n) for n in names) if s is not None]


def start(name: str, cmd: Sequence[str], env: Mapping[str, str] | None = None,
          info: Mapping | None = None, cwd: str | None = None) -> ServiceState:
    """Start ``cmd`` in a new session with output to ``logs/<name>.log``.

    Raises RuntimeError if a service of that name is already running.
    """
    if status(name) is not None:
        raise RuntimeError(f"{name} is already running")
    log_path = config.log_dir() / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
    state = ServiceState(name, proc.pid, proc.pid, psutil.Process(proc.pid).create_time(), list(cmd),
                         str(log_path), dict(info or {}))
    state_file(name).write_text(json.dumps(asdict(state), indent=2))
    return state


def start_until_ready(name: str, cmd: Sequence[str], ready, timeout: float, what: str,
                      info: Mapping | None = None, env: Mapping[str, str] | None = None) -> ServiceState:
    """Start service ``name`` (see :func:`start`) and wait until ``ready()`` is true.

    Raises RuntimeError naming the service's log when it is not ready within ``timeout``
    seconds; the service is stopped then."""
    state = start(name, cmd, env=env, info=info)
    try:
        wait_for(ready, timeout=timeout, what=what)
    except TimeoutError as exc:
        stop(name)
        raise RuntimeError(f"{exc}; see {state.log}") from None
    return state


def kill_tree(pid: int, pgid: int | None = None, timeout: float = 10.0) -> None:
    """SIGTERM a process group and its descendants, SIGKILL what is left after ``timeout``."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    groups = {pgid} if pgid else set()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        procs = wait_gone(procs, timeout if sig == signal.SIGTERM else 5)
        if not procs:
            return


def wait_gone(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to end (reaping those that are this process's
    children); returns those still running (zombies count as ended).

    psutil.wait_procs opens a pidfd per process; on Linux 6.9 and later that raises
    FileNotFoundError when the process has ended and its pid already names a thread of
    another process (seen on `make test-scenarios`' machine). Then each process is
    polled by its identity (pid and start time), which a reused pid does not match."""
    try:
        return psutil.wait_procs(procs, timeout=timeout)[1]
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while True:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(name: str, timeout: float = 10.0) -> bool:
    """Stop a service and its whole process tree. Returns False if it was not running."""
    state = status(name)
    if state is None:
        state_file(name).unlink(missing_ok=True)
        return False
    kill_tree(state.pid, state.pgid, timeout)
    state_file(name).unlink(missing_ok=True)
    return True


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition") -> None:
    """Poll ``predicate`` until true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


def accepts_connections(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (a port a service would collide with)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def spark_lineage() -> list:
    """This process's ancestors (psutil.Process, nearest first), then, for a process the fork
    server forked for a launcher (or one forked below it), that launcher and its ancestors:
    where the Spark application that started it is found."""
    lineage = psutil.Process().parents()
    try:
        launcher = psutil.Process(int(os.environ[LAUNCHER_PID_ENV]))
        return [*lineage, launcher, *launcher.parents()]
    except (KeyError, ValueError, psutil.Error):
        return lineage


def forked_below(pids) -> list:
    """The processes the fork server forked for any launcher among ``pids``, and theirs."""
    wanted = {str(pid) for pid in pids}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(LAUNCHER_PID_ENV) in wanted:
                found.append(proc)
        except psutil.Error:
            continue
    return found
