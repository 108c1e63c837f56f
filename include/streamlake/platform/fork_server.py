"""Warm Spark Connect clients: a service that forks each job's client with its libraries imported.

A proof (``jobs/verify.py``), a backfill or an available-now run on the platform's Spark
Connect server is a thin Python client, but a new interpreter spends seconds importing
what it needs before its first query: Great Expectations alone 2.6 s, pyspark's Connect
client 0.5 s (2 cores, 2026-11-28), on every operation's path from trigger to proven.
``streamlake platform`` (``make run``) therefore runs this fork server: one process that
imports those libraries once (:data:`PRELOAD`) and listens on a Unix socket; for each
request it forks a child that becomes the client, as if started with
``python jobs/<application> ARGS``: the request's environment, working directory and
arguments, its output streamed back on the connection as it is written, its exit status
after it. StreamLake's own modules are never preloaded: a child imports them afresh, so
an edited checkout takes effect at the next run, as with a new interpreter.

What it guarantees:

* a request runs one application of the applications directory (``jobs/``), by file name,
  and only with the interpreter the caller would start (:func:`run_client` sends its
  ``python_executable()``; a server of another one refuses);
* each child is a process of its own in a session of its own; when its client's
  connection ends before it does (the Airflow task was killed), its session gets SIGTERM,
  then SIGKILL 10 s later;
* the caller learns the child's exit status (a signal's as 128 + its number), or
  :class:`ForkServerError` when the server went away before telling it; when no server
  runs, :func:`run_client` returns None and the caller starts the interpreter itself.

The socket is the platform user's (mode 0600, in the run directory), like the other
services' files: anyone who can write it can run the jobs as that user, nothing more.

It also forks Spark's own Python processes (:mod:`streamlake.platform.spark_python`,
:mod:`streamlake.spark.interpreter`): a
Spark JVM of this machine starts ``python -m pyspark.<module>`` (the worker daemon, a
streaming source's runner, a data source's planner) through a small launcher that sends the
request with its standard input, output and error (the file descriptors themselves); the
child runs the module on them as a new interpreter would, with pyspark, pyarrow and pandas
already imported (:data:`PRELOAD_SPARK`), and its exit status goes back to the launcher. Only
``pyspark.*`` modules (:data:`MODULE_PREFIXES`), only with the server's interpreter and hash seed (``PYTHONHASHSEED``:
Spark gives its workers one, and a forked child keeps the server's).

Frames on the connection (server to client): a type byte, a 4-byte big-endian length,
the payload: ``a`` accepted (the child's pid), ``r`` refused (why), ``o`` output bytes,
``x`` exit status (decimal).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

# What a job's Connect client imports before its first query (the costly ones), never StreamLake's.
PRELOAD = ("pyarrow", "pyarrow.compute", "pyarrow.dataset", "pyarrow.parquet", "pandas", "deltalake",
           "confluent_kafka", "yaml", "psutil", "pyspark.sql.connect.session", "pyspark.sql.connect.functions",
           "great_expectations")
# What Spark's Python processes import first (python -m pyspark.<module>, then the worker module).
PRELOAD_SPARK = ("pyspark.daemon", "pyspark.worker", "pyspark.sql.streaming.python_streaming_source_runner",
                 "pyspark.sql.worker.plan_data_source_read", "pyspark.sql.worker.create_data_source",
                 "pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.commit_data_source_write",
                 "pyspark.sql.pandas.serializers")
MODULE_PREFIXES = ("pyspark.",)  # the modules it runs as `python -m`: Spark's
HASH_SEED = "0"  # the server's PYTHONHASHSEED, Spark's default for its workers
KILL_GRACE_S = 10.0
_HEADER = struct.Struct(">cI")


class ForkServerError(RuntimeError):
    """The fork server accepted a run and went away before its exit status."""


# ----------------------------------------------------------------------------------- the client

def socket_path(run_dir: Path | None = None) -> str:
    """Where the platform's fork server listens: ``<run dir>/fork-server.sock``, or a path
    under the system's temporary directory named after the run directory when that would
    exceed a Unix socket's 107 bytes."""
    from streamlake import config

    run = Path(run_dir or config.run_dir())
    path = str(run / "fork-server.sock")
    if len(path.encode()) <= 100:
        return path
    digest = hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"streamlake-fork-{digest}.sock")


def running_socket() -> str | None:
    """The socket of the platform's running fork server; None when none runs."""
    from streamlake import procs
    from streamlake.spark.interpreter import FORK_SERVER

    state = procs.status(FORK_SERVER)
    return state.info.get("socket") if state is not None else None


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    header = _read_exact(sock, _HEADER.size)
    if header is None:
        return None
    kind, length = _HEADER.unpack(header)
    payload = _read_exact(sock, length) if length else b""
    return (kind, payload) if payload is not None else None


def run_client(application: str, args: Sequence[str], env: Mapping[str, str], *, cwd: str | None = None,
               write: Callable[[str], None] = print, socket_file: str | None = None,
               connect_timeout_s: float = 5.0) -> int | None:
    """Run ``jobs/<application> ARGS`` as a child of the running fork server; ``write`` gets
    its output line by line as it comes. Returns the child's exit status, or None when no
    fork server runs, it does not answer, or it refuses (``write`` says why): the caller then
    starts the interpreter itself. Raises ForkServerError when the server accepted the run
    and its connection ended before the exit status (the run's outcome is unknown)."""
    from streamlake.spark.interpreter import python_executable

    path = socket_file or running_socket()
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(connect_timeout_s)
        try:
            sock.connect(path)
            request = {"application": application, "args": list(args), "env": dict(env),
                       "cwd": cwd or os.getcwd(), "python": python_executable()}
            sock.sendall(json.dumps(request).encode() + b"\n")
            first = _read_frame(sock)
        except OSError as exc:
            write(f"fork server at {path} does not answer ({exc}): a new interpreter")
            return None
        if first is None or first[0] == b"r":
            write(f"fork server at {path} refused the run ({first[1].decode() if first else 'closed'}): "
                  "a new interpreter")
            return None
        sock.settimeout(None)  # the run takes what it takes
        pending = b""
        while True:
            try:
                frame = _read_frame(sock)
            except OSError as exc:
                raise ForkServerError(f"fork server connection broken during {application}: {exc}") from exc
            if frame is None:
                raise ForkServerError(f"fork server at {path} went away during {application} (child pid "
                                      f"{first[1].decode()}): its outcome is unknown")
            kind, payload = frame
            if kind == b"o":
                pending += payload
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    write(line.decode(errors="replace"))
            elif kind == b"x":
                if pending:
                    write(pending.decode(errors="replace"))
                return int(payload)
    finally:
        sock.close()


# ----------------------------------------------------------------------------------- the service

def start(timeout_s: float = 120.0) -> dict:
    """Start the platform's fork server (idempotent); return when it answers, with its socket.
    Raises RuntimeError naming its log when it does not answer within ``timeout_s``."""
    from streamlake import config, procs
    from streamlake.platform.spark_python import write_launcher
    from streamlake.spark.interpreter import FORK_SERVER, python_executable

    if procs.status(FORK_SERVER) is None:
        path = socket_path()
        applications = config.project_root() / "jobs"
        cmd = [python_executable(), "-m", "streamlake.platform.fork_server", "--socket", path,
               "--applications", str(applications)]
        procs.start_until_ready(FORK_SERVER, cmd, lambda: _answers(path), timeout_s,
                                what=f"the fork server at {path}", info={"socket": path, "python": cmd[0]},
                                env={**os.environ, "PYTHONHASHSEED": HASH_SEED})
    return {"socket": running_socket(), "spark_python": str(write_launcher(running_socket(), MODULE_PREFIXES))}


def stop() -> bool:
    from streamlake import procs
    from streamlake.spark.interpreter import FORK_SERVER

    return procs.stop(FORK_SERVER, timeout=KILL_GRACE_S)


def _answers(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(path)
            sock.sendall(b'{"ping": true}\n')
            frame = _read_frame(sock)
            return frame is not None and frame[0] == b"a"
    except OSError:
        return False


@dataclass
class _Run:
    """One forked client: its connection, the read end of its output, its exit status."""

    conn: socket.socket
    pid: int
    output: int | None  # None: the child writes to its launcher's own descriptors
    status: int | None = None
    output_open: bool = True
    exited_at: float | None = None
    kill_at: float | None = None


class ForkServer:
    """The service's loop (one thread: it forks). See the module docstring."""

    def __init__(self, path: str, applications: Path, python: str,
                 module_prefixes: Sequence[str] = MODULE_PREFIXES) -> None:
        self.path, self.applications, self.python = path, applications.resolve(), python
        self.module_prefixes = tuple(module_prefixes)
        self.selector = selectors.DefaultSelector()
        self.runs: dict[int, _Run] = {}
        # SIGCHLD wakes the loop (a byte on this pipe): an exit status is passed on at once.
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(self.wakeup_write, False)

    def serve(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old_mask)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, ("wakeup", None))
        signal.set_wakeup_fd(self.wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        print(f"fork server: listening on {self.path}, applications in {self.applications}", flush=True)
        try:
            while True:
                for key, _mask in self.selector.select(timeout=0.5):
                    what, run = key.data
                    if what == "accept":
                        self._accept()
                    elif what == "output":
                        self._forward(run)
                    elif what == "client":
                        self._client_readable(run)
                    elif what == "wakeup":
                        _drain(self.wakeup_read)
                self._reap()
        finally:
            self.listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(5.0)
        fds: list[int] = []
        try:
            first, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
            request = json.loads(first + (b"" if first.endswith(b"\n") or not first else _read_line(conn)) or b"{}")
        except (OSError, ValueError) as exc:
            _close_all(fds)
            self._refuse(conn, f"unreadable request: {exc}")
            return
        if request.get("ping"):
            _close_all(fds)
            try:
                _send(conn, b"a", b"0")
            except OSError:  # the pinger hung up first
                pass
            conn.close()
            return
        reason = self._refusal(request, fds)
        if reason:
            _close_all(fds)
            self._refuse(conn, reason)
            return
        read_end, write_end = os.pipe() if not fds else (None, None)
        sys.stdout.flush()
        sys.stderr.flush()
        # SIGTERM held across the fork: one that came before the child reset the server's
        # handler would run it there (exit outside the run's own handling); the child takes it
        # once its handlers are a new interpreter's (_leave_server), the server at once
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory: this run is refused, the server goes on
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            _close_all([*fds, *((read_end, write_end) if not fds else ())])
            self._refuse(conn, f"could not fork: {exc}")
            return
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if pid == 0:  # the child: never returns
            if fds:
                self._become_module(request, fds, conn)
            os.close(read_end)
            self._become_client(request, write_end, conn)
        _close_all(fds)
        conn.settimeout(None)
        if fds:
            run = _Run(conn, pid, None, output_open=False)
        else:
            os.close(write_end)
            run = _Run(conn, pid, read_end)
            self.selector.register(read_end, selectors.EVENT_READ, ("output", run))
        self.runs[pid] = run
        try:
            _send(conn, b"a", str(pid).encode())
        except OSError:  # the client hung up while its child was being forked: end the child
            self._client_gone(run)  # (raised, it ended the server and left the child running)
        else:
            self.selector.register(conn, selectors.EVENT_READ, ("client", run))
        what = request.get("application") or f"-m {request['module']}"
        print(f"fork server: pid {pid} runs {what} {' '.join(request.get('args', []))[:200]}", flush=True)

    def _refusal(self, request: dict, fds: Sequence[int]) -> str | None:
        if request.get("python") and os.path.realpath(request["python"]) != os.path.realpath(self.python):
            return f"the run wants the interpreter {request['python']}; this server is {self.python}"
        if "module" in request:
            module = str(request.get("module") or "")
            if not module.startswith(self.module_prefixes):
                return f"not a module it runs ({', '.join(p + '*' for p in self.module_prefixes)}): {module!r}"
            if len(fds) != 3:
                return f"a module run needs its standard input, output and error; {len(fds)} descriptors came"
            seed = (request.get("env") or {}).get("PYTHONHASHSEED")
            if seed is not None and seed != os.environ.get("PYTHONHASHSEED"):
                return f"PYTHONHASHSEED={seed}; this server's children hash with {os.environ.get('PYTHONHASHSEED')}"
            return None
        if fds:
            return "an application's run takes no file descriptors"
        application = str(request.get("application") or "")
        if not application or Path(application).name != application or not application.endswith(".py"):
            return f"not an application's file name: {application!r}"
        if not (self.applications / application).is_file():
            return f"no application {application} in {self.applications}"
        return None

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        print(f"fork server: refused a run: {reason}", flush=True)
        try:
            _send(conn, b"r", reason.encode())
        except OSError:
            pass
        conn.close()

    def _leave_server(self, conn: socket.socket, session: bool = True) -> None:
        """In a forked child: a session of its own (or, ``session=False``, a process group: Spark's
        worker daemon makes its own, which a session leader cannot), a new interpreter's signal
        handling (SIGINT's KeyboardInterrupt, the server's handlers out), none of the server's
        descriptors."""
        if session:
            os.setsid()
        else:
            os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig, handler in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGCHLD, signal.SIG_DFL),
                             (signal.SIGINT, signal.default_int_handler)):
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # held across the fork (_accept)
        conn.close()
        self.listener.close()
        for run in self.runs.values():  # the other runs' connections and pipes
            run.conn.close()
            if run.output_open:
                os.close(run.output)
        self.selector.close()
        os.close(self.wakeup_read)
        os.close(self.wakeup_write)

    def _become_client(self, request: dict, output: int, conn: socket.socket) -> None:
        """In the forked child: become ``python jobs/<application> ARGS`` and exit with its status."""
        def run() -> None:
            self._leave_server(conn)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.close(devnull)
            os.close(output)
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
            os.chdir(request.get("cwd") or "/")
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
            script = str(self.applications / request["application"])
            sys.argv = [script, *[str(a) for a in request.get("args", [])]]
            sys.path.insert(0, str(self.applications))  # as `python jobs/x.py` has it
            import runpy

            runpy.run_path(script, run_name="__main__")

        _exit_with(run)

    def _become_module(self, request: dict, fds: Sequence[int], conn: socket.socket) -> None:
        """In the forked child: become ``python -m MODULE ARGS`` on the launcher's standard
        input, output and error, and exit with its status."""
        def run() -> None:
            self._leave_server(conn, session=False)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            _close_all(fds)
            env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}  # the launcher's pid too
            unbuffered = bool(env.get("PYTHONUNBUFFERED"))
            sys.stdout.reconfigure(write_through=unbuffered)
            sys.stderr.reconfigure(write_through=True)
            cwd = request.get("cwd") or "/"
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            # sys.path as `python -m` starts with it: the working directory, then PYTHONPATH's entries.
            first = [cwd, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
            sys.path[:] = first + [p for p in sys.path if p not in first]
            sys.argv = [request["module"], *[str(a) for a in request.get("args", [])]]
            import runpy

            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)

        _exit_with(run)

    def _forward(self, run: _Run) -> None:
        try:
            data = os.read(run.output, 65536)
        except OSError:
            data = b""
        if data:
            try:
                _send(run.conn, b"o", data)
            except OSError:
                self._client_gone(run)
            return
        self.selector.unregister(run.output)
        os.close(run.output)
        run.output_open = False

    def _client_readable(self, run: _Run) -> None:
        try:
            data = run.conn.recv(1024)
        except OSError:
            data = b""
        if not data:
            self._client_gone(run)

    def _client_gone(self, run: _Run) -> None:
        """The client hung up before the run ended (its task was killed): end the run."""
        if run.status is None and run.kill_at is None:
            print(f"fork server: the client of pid {run.pid} went away: SIGTERM to its session", flush=True)
            _kill_session(run.pid, signal.SIGTERM)
            run.kill_at = time.monotonic() + KILL_GRACE_S
        try:
            self.selector.unregister(run.conn)
        except (KeyError, ValueError):
            pass

    def _reap(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.status is None:
                try:
                    pid, status = os.waitpid(run.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = run.pid, 255 << 8
                if pid:
                    run.status = os.waitstatus_to_exitcode(status)
                    run.status = 128 - run.status if run.status < 0 else run.status
                    run.exited_at = now
                elif run.kill_at is not None and now >= run.kill_at:
                    _kill_session(run.pid, signal.SIGKILL)
                    run.kill_at = now + KILL_GRACE_S
            # Done once the child exited and its output is drained (or a grandchild holds it: 5 s).
            if run.status is not None and (not run.output_open or now - run.exited_at > 5.0):
                self._finish(run)

    def _finish(self, run: _Run) -> None:
        if run.output_open:
            self.selector.unregister(run.output)
            os.close(run.output)
        try:
            self.selector.unregister(run.conn)
        except (KeyError, ValueError):
            pass
        try:
            _send(run.conn, b"x", str(run.status).encode())
        except OSError:
            pass
        run.conn.close()
        del self.runs[run.pid]
        print(f"fork server: pid {run.pid} exited with status {run.status}", flush=True)


def _read_line(conn: socket.socket, limit: int = 1 << 22) -> bytes:
    """The request: one JSON line (no file object: it would keep the socket open in a child)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _exit_with(run: Callable[[], None]) -> None:
    """In a forked child: ``run()``, then exit with the status an interpreter running it would
    (a SystemExit's code, 1 and the traceback for an exception); never returns."""
    code = 1
    try:
        try:
            run()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
    except BaseException:  # noqa: BLE001 - the child reports everything, as an interpreter would
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _send(conn: socket.socket, kind: bytes, payload: bytes) -> None:
    conn.sendall(_HEADER.pack(kind, len(payload)) + payload)


def _kill_session(pid: int, sig: int) -> None:
    """``sig`` to the run's process group, or to the run itself while it is not yet the leader
    of one (just forked: its group is still the server's)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    except PermissionError:
        pass


def preload(modules: Sequence[str] = PRELOAD) -> dict[str, float]:
    """Import ``modules`` (seconds each); one that does not import is reported, not fatal.

    Then everything the imports left on the heap is moved to the collector's permanent
    generation (``gc.freeze``): a forked child's collections never scan it again. Without it
    each one scanned the 300,000-odd objects of the libraries: pyspark's worker daemon runs a
    full collection after every task of a reused worker (``gc.collect()``), 140-220 ms each
    (2 cores, 2026-12-05), and the scan wrote to every page the child shares with the server."""
    took = {}
    for name in modules:
        start = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a child imports it itself, as a new interpreter would
            print(f"fork server: {name} not preloaded: {type(exc).__name__}: {exc}", flush=True)
            continue
        took[name] = round(time.monotonic() - start, 2)
    gc.collect()  # what is garbage already is not kept forever
    gc.freeze()
    return took


def _exit_on_signal(*_) -> None:
    """SIGTERM (``streamlake stop`` sends it to the group and to the process): exit once, so the
    server's clean-up (its socket) is not cut short by the second one."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamlake.platform.fork_server", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--applications", required=True, help="the directory of the applications it runs (jobs/)")
    parser.add_argument("--module-prefix", action="append", dest="module_prefixes",
                        help=f"run `python -m` of modules named so (repeatable; default: {', '.join(MODULE_PREFIXES)})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    took = preload(PRELOAD + PRELOAD_SPARK)
    print(f"fork server: preloaded {len(took)} modules in {time.monotonic() - started:.1f} s: {took}", flush=True)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    ForkServer(args.socket, Path(args.applications), sys.executable,
               args.module_prefixes or MODULE_PREFIXES).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
