"""The fork server of the Spark Connect clients, as a real service process on a real Unix socket.

Its applications here are small scripts of the test's own (a directory of its own, as
``jobs/`` is the platform's): what each prints, where and with what exit status is
written below, not read from the server. The platform's own use (every proof of the
live platform a forked client) is asserted in test_live_platform.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from streamlake.platform.fork_server import PRELOAD, run_client, socket_path
from streamlake.platform.spark_python import write_launcher
from streamlake.procs import LAUNCHER_PID_ENV

APPS = {
    "echo.py": """
        import os, sys
        print("args", sys.argv[1:])
        print("env", os.environ.get("FORK_TEST"), "cwd", os.getcwd())
        print("to stderr", file=sys.stderr)
        import signal
        print("signals", [str(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE)])
        print("warm", all(m in sys.modules for m in {preload!r}))
        # the server's own package inits only (docstrings): no module of StreamLake's code
        print("own modules fresh", {{m for m in sys.modules if m.startswith("streamlake")}} <= {{"streamlake", "streamlake.platform"}})
        sys.exit(int(sys.argv[1]))
    """,
    "fails.py": """
        print("before the error", flush=True)
        raise ValueError("the application's own error")
    """,
    "says_why.py": """
        import sys
        sys.exit("a message as exit status")
    """,
    "closes_output.py": """
        import os, time
        print("closing", flush=True)
        os.close(1)
        os.close(2)
        time.sleep(1.5)
    """,
    "sleeps.py": """
        import os, sys, time
        print(os.getpid(), flush=True)
        time.sleep(float(sys.argv[1]))
        print("slept", sys.argv[1], flush=True)
    """,
}


# A module run as `python -m forkprobe CODE` (how Spark starts its Python processes, with
# its standard input, output and error): what it got, who its parent is and which launcher
# started it (the process tree as Spark sees it: streamlake.procs.spark_lineage).
PROBE = """
    import os, signal, sys, time
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FORK_TEST"), flush=True)
    print("stdin", sys.stdin.read().strip(), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    print("signals", [str(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)], flush=True)
    print("parent", os.getppid(), flush=True)
    print("pid", os.getpid(), "launcher", os.environ.get(PID_ENV), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
""".replace("PID_ENV", repr(LAUNCHER_PID_ENV))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fork server (the service's own command) with the test's applications."""
    root = tmp_path_factory.mktemp("forks")
    apps = root / "apps"
    apps.mkdir()
    for name, body in APPS.items():
        (apps / name).write_text(textwrap.dedent(body.format(preload=sorted(PRELOAD))))
    modules = root / "modules"
    modules.mkdir()
    (modules / "forkprobe.py").write_text(textwrap.dedent(PROBE))
    sock = socket_path(root)
    # As the platform starts it (fork_server.start), with the hash seed Spark gives its workers;
    # `python -m` of Spark's modules and of the test's probe.
    proc = subprocess.Popen([sys.executable, "-m", "streamlake.platform.fork_server", "--socket", sock,
                             "--applications", str(apps), "--module-prefix", "pyspark.", "--module-prefix",
                             "forkprobe"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "0"})
    (root / "server.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
        time.sleep(0.1)
    yield sock, root
    proc.terminate()
    proc.wait(10)
    assert not os.path.exists(sock), "the server removes its socket when it stops"


def run(sock, application, *args, env=None, cwd=None):
    lines = []
    code = run_client(application, list(args), env or {"PATH": os.environ["PATH"]}, cwd=cwd, write=lines.append,
                      socket_file=sock)
    return code, lines


def test_a_run_gets_its_arguments_environment_directory_and_exit_status_and_its_output_in_order(server, tmp_path):
    sock, root = server
    code, lines = run(sock, "echo.py", "3", "x y", env={"FORK_TEST": "value 1", "PATH": os.environ["PATH"]},
                      cwd=str(tmp_path))
    assert code == 3
    assert lines[:3] == ["args ['3', 'x y']", f"env value 1 cwd {tmp_path}", "to stderr"]
    assert lines[4:] == ["warm True", "own modules fresh True"]
    # The same script as a new interpreter: the same signal handling (the server's own is not inherited).
    fresh = subprocess.run([sys.executable, str(root / "apps" / "echo.py"), "0"], capture_output=True, text=True)
    assert lines[3] == next(line for line in fresh.stdout.splitlines() if line.startswith("signals"))
    code, lines = run(sock, "echo.py", "0")
    assert code == 0 and lines[1].startswith("env None"), "each run has the environment of its request only"


def test_an_application_error_is_its_exit_status_with_the_traceback(server):
    sock, _root = server
    code, lines = run(sock, "fails.py")
    assert code == 1
    assert lines[0] == "before the error" and lines[-1] == "ValueError: the application's own error"
    assert any(line.startswith("Traceback") for line in lines)
    code, lines = run(sock, "says_why.py")
    assert (code, lines) == (1, ["a message as exit status"])


def test_only_the_applications_directory_with_the_same_interpreter_runs(server):
    sock, root = server
    (root / "outside.py").write_text("print('must not run')\n")
    for application in ("../outside.py", str(root / "outside.py"), "absent.py", "apps"):
        code, lines = run(sock, application)
        assert code is None and "refused" in lines[0], (application, lines)
    lines = []
    os.environ["PYSPARK_PYTHON"], previous = "/usr/bin/python3", os.environ.get("PYSPARK_PYTHON")
    try:
        assert run_client("echo.py", ["0"], {}, write=lines.append, socket_file=sock) is None
    finally:
        if previous is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = previous
    assert "interpreter" in lines[0]


def test_no_server_means_the_caller_starts_the_interpreter(tmp_path):
    lines = []
    assert run_client("echo.py", ["0"], {}, write=lines.append, socket_file=str(tmp_path / "none.sock")) is None
    assert "does not answer" in lines[0]


def test_runs_side_by_side_each_get_their_own_output(server):
    sock, _root = server
    results = {}

    def one(seconds):
        results[seconds] = run(sock, "sleeps.py", seconds)

    threads = [threading.Thread(target=one, args=(s,)) for s in ("1.5", "0.2")]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - started < 10
    assert results["1.5"][0] == 0 and results["1.5"][1][-1] == "slept 1.5"
    assert results["0.2"][0] == 0 and results["0.2"][1][-1] == "slept 0.2"
    assert results["1.5"][1][0] != results["0.2"][1][0], "two processes"


def test_a_burst_of_runs_each_succeeds_with_its_own_output(server):
    """Runs forked while others start and end; one of them while a run that closed its
    output still runs (the server has closed that pipe's end: a child must not close it again)."""
    sock, _root = server
    results = {}
    closing = threading.Thread(target=lambda: results.setdefault("closing", run(sock, "closes_output.py")))
    closing.start()
    time.sleep(0.7)
    assert run(sock, "echo.py", "0")[0] == 0, "a run forked while another's output is closed"
    closing.join(30)
    assert results.pop("closing") == (0, ["closing"])

    def one(i):
        results[i] = run(sock, "sleeps.py", f"0.0{i % 3}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(12))
    for i, (code, lines) in results.items():
        assert code == 0 and lines[-1] == f"slept 0.0{i % 3}", (i, code, lines)
    assert len({lines[0] for _code, lines in results.values()}) == 12, "twelve processes"


def wait_ended(process: psutil.Process, timeout_s: float, message: str) -> None:
    """Until ``process`` has ended (exited, a zombie or reaped); fails with ``message`` after
    ``timeout_s``. Its pid alone cannot tell: once reaped, the kernel may give the pid to a new
    process or thread (JVM threads take pids from the same space; CI failed once on a pid that
    lived on for 10 s after its process had been reaped). ``is_running`` compares the start time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def test_a_client_that_goes_away_ends_its_run(server):
    """The Airflow task of a run killed: its connection closes, and the forked client is ended."""
    sock, _root = server
    script = (f"from streamlake.platform.fork_server import run_client\n"
              f"run_client('sleeps.py', ['600'], {{}}, write=lambda l: print(l, flush=True), socket_file={sock!r})\n")
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(client.stdout.readline())
    forked = psutil.Process(pid)
    client.kill()
    client.wait(10)
    wait_ended(forked, 15, f"forked client {pid} still runs after its caller went away")


def test_a_long_run_directory_gets_a_short_socket_path(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "run"
    path = socket_path(deep)
    assert len(path.encode()) <= 107 and path == socket_path(deep)
    assert socket_path(Path("/r/run")) == "/r/run/fork-server.sock"


def probe(command, env, cwd, stdin="input line"):
    done = subprocess.run([*command, "-m", "forkprobe", *env.pop("ARGS")], input=stdin, env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()


def test_the_launcher_runs_a_module_forked_on_its_own_descriptors_as_the_interpreter_would(server, tmp_path):
    """``launcher -m MODULE ARGS`` (what Spark starts for its Python processes) runs in a child
    of the fork server on the launcher's own standard input, output and error, with the
    launcher's environment, directory and arguments, and ends with its exit status; compared
    line by line with the interpreter itself, but for the parent."""
    sock, root = server
    launcher = write_launcher(sock, ("pyspark.", "forkprobe"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root / "modules"), "FORK_TEST": "value 2",
           "PYTHONHASHSEED": "0"}
    forked = probe([str(launcher)], {**env, "ARGS": ["3"]}, tmp_path)
    fresh = probe([sys.executable], {**env, "ARGS": ["3"]}, tmp_path)
    assert forked[0] == fresh[0] == 3
    assert forked[2] == fresh[2] == ["to stderr"]
    assert forked[1][:3] == fresh[1][:3] == [f"argv ['3'] cwd {tmp_path} env value 2", "stdin input line",
                                            fresh[1][2]]
    assert forked[1][3] == f"parent {(root / 'server.pid').read_text()}", "forked by the server"
    assert fresh[1][3] == f"parent {os.getpid()}"


def test_the_launcher_starts_the_interpreter_for_anything_else(server, tmp_path):
    """Another module, ``-c``, another hash seed (Spark's workers must hash alike), or no
    server: the launcher ``exec``s the interpreter (the probe's parent is then the caller)."""
    sock, root = server
    launcher = write_launcher(sock, ("pyspark.", "forkprobe"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root / "modules")}
    code, out, _err = probe([str(launcher)], {**env, "PYTHONHASHSEED": "5", "ARGS": ["0"]}, tmp_path)
    assert code == 0 and out[-2] == f"parent {os.getpid()}", out
    other = subprocess.run([str(launcher), "-c", "import os, sys; print(os.getppid(), sys.argv[1:])", "x"],
                           capture_output=True, text=True, env=env)
    assert other.stdout.split() == [str(os.getpid()), "['x']"], other
    offline = write_launcher(str(tmp_path / "no-server.sock"), ("forkprobe",))
    code, out, _err = probe([str(offline)], {**env, "PYTHONHASHSEED": "0", "ARGS": ["4"]}, tmp_path)
    assert code == 4 and out[-2] == f"parent {os.getpid()}", out


def test_a_signal_to_the_launcher_reaches_its_child_and_is_its_exit(server, tmp_path):
    """Spark stops a Python process by signalling the process it started: the launcher passes
    the signal on, and ends as the child did (killed by it)."""
    sock, root = server
    launcher = write_launcher(sock, ("pyspark.", "forkprobe"))
    proc = subprocess.Popen([str(launcher), "-m", "forkprobe", "sleep"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True,
                            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(root / "modules"),
                                 "PYTHONHASHSEED": "0"})
    lines = [proc.stdout.readline().strip() for _ in range(5)]
    child = int(lines[-1].split()[1])
    forked = psutil.Process(child)
    assert forked.ppid() == int((root / "server.pid").read_text())
    # The process tree as Spark sees it goes on through the launcher (the crash points kill by it).
    assert lines[-1].split()[2:] == ["launcher", str(proc.pid)], "the launcher names itself to its child"
    proc.send_signal(15)
    assert proc.wait(30) == -15, "the launcher ends as its child did: by SIGTERM"
    wait_ended(forked, 10, "the child outlived the signal")


def test_a_launcher_gone_before_its_child_is_named_ends_the_child_and_not_the_server(server, tmp_path):
    """A launcher killed right after it asked for a run (Spark stopping a Python process as it
    starts) hangs up before the server names the child it forked: the server's answer fails.
    The child is ended as for any client gone, and the server goes on serving. (Seen in a
    fresh-clone run: the failed answer ended the server and left the child running.)"""
    import json
    import socket

    from streamlake.platform.fork_server import _answers

    sock, root = server
    read_end, write_end = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    for _ in range(5):  # the server forks before it answers: a client this quick is always gone first
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(sock)
        request = {"module": "forkprobe", "args": ["sleep"], "cwd": str(tmp_path), "python": sys.executable,
                   "env": {"PATH": os.environ["PATH"], "PYTHONPATH": str(root / "modules"), "PYTHONHASHSEED": "0"}}
        socket.send_fds(client, [json.dumps(request).encode() + b"\n"], [devnull, write_end, write_end])
        client.close()
    os.close(write_end)
    os.close(devnull)
    children = []
    with os.fdopen(read_end) as output:
        for line in output:  # each child prints its pid before it sleeps (EOF: every child ended)
            if line.startswith("pid "):
                children.append(psutil.Process(int(line.split()[1])))
            if len(children) == 5:
                break
    for child in children:
        wait_ended(child, 30, "a child whose launcher hung up still runs")
    assert _answers(sock), "the fork server stopped answering"


def test_a_fork_that_fails_refuses_that_run_and_the_server_goes_on(tmp_path):
    """The kernel refusing a fork (out of processes or memory) refuses that one run, which its
    caller then starts in an interpreter of its own; the server answers the next run, and a
    SIGTERM still stops it (the signal held across the fork is not left held)."""
    apps = tmp_path / "apps"
    apps.mkdir()
    (apps / "echo.py").write_text(textwrap.dedent(APPS["echo.py"].format(preload=[])))
    sock = socket_path(tmp_path)
    # the service's loop in a process whose first fork fails as the kernel's would (EAGAIN)
    script = f"""
import os, signal, sys
from pathlib import Path
from streamlake.platform import fork_server
real, forks = os.fork, []
def fork():
    forks.append(1)
    if len(forks) == 1:
        raise BlockingIOError(11, "Resource temporarily unavailable")
    return real()
os.fork = fork
signal.signal(signal.SIGTERM, fork_server._exit_on_signal)
fork_server.ForkServer({sock!r}, Path({str(apps)!r}), sys.executable).serve()
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
            time.sleep(0.05)
        refused = run(sock, "echo.py", "0")
        assert refused[0] is None and "refused the run (could not fork: [Errno 11]" in refused[1][0], refused
        code, lines = run(sock, "echo.py", "3", env={"PATH": os.environ["PATH"], "FORK_TEST": "after"})
        assert code == 3 and "env after" in " ".join(lines), lines
        proc.terminate()
        assert proc.wait(10) == 0, "SIGTERM stops the server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "refused a run: could not fork" in proc.stdout.read()


def test_the_session_s_spark_starts_its_python_processes_through_the_fork_server(spark):
    """The test session's local Spark (as a platform job's on a local master) starts its
    Python processes with the launcher: its worker daemon runs forked, and a Python UDF on it
    gives the sum the test computes."""
    from pyspark.sql import functions as F

    from streamlake import config

    doubled = F.udf(lambda value: value * 2, "long")
    assert spark.range(1000).select(doubled("id").alias("x")).agg({"x": "sum"}).first()[0] == 2 * sum(range(1000))
    log = (config.log_dir() / "fork-server.log").read_text()
    assert "runs -m pyspark.daemon pyspark.worker" in log, log[-2000:]
