"""Spark's Python processes forked warm: the launcher Spark starts instead of the interpreter.

A Spark JVM starts a new interpreter for each of its Python processes: the worker daemon of
each application, the runner of each streaming query on a Python data source (one per query
start: the pipeline's stages start three per run), the planner of each read of one. Each
spends 0.3-0.7 s importing pyspark, pyarrow and pandas before its first byte (measured idle;
twice that on a busy machine), and the worker daemon's children import the worker module
after they are forked. Where the platform's fork server runs (:mod:`streamlake.platform.fork_server`),
:func:`streamlake.spark.interpreter.spark_python` names a launcher instead of the interpreter
(Spark's ``spark.pyspark.python`` / ``PYSPARK_PYTHON``), the one :func:`write_launcher` writes
here: a script run by the same interpreter with
no site packages (``-IS``, about 10 ms) that hands ``-m pyspark.<module> ARGS`` to the fork
server with its standard input, output and error, forwards the signals it gets to the
forked child and exits with the child's status. Anything else (another module, ``-c``, no
server, a refusal) it ``exec``s the interpreter with the same arguments, so it is never
wrong to start it, only slower.

Only for masters of this machine (``local``, ``local[N]``, a ``spark://`` master on
127.0.0.1 or localhost, the platform's own cluster): an executor on another machine has
neither the launcher nor the server. The child it forks has the launcher's pid in its
environment (:data:`streamlake.procs.LAUNCHER_PID_ENV`): where the process tree as Spark sees
it goes on (:func:`streamlake.procs.spark_lineage`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

_LAUNCHER = '''#!{python} -IS
# Written by streamlake.platform.spark_python: Spark's Python processes forked by the fork server.
import json, os, signal, socket, struct, sys

PYTHON, SOCKET, MODULES, PID_ENV = {python!r}, {socket!r}, {prefixes!r}, {pid_env!r}
args = sys.argv[1:]


def interpreter():
    os.execv(PYTHON, [PYTHON, *args])


def frame(sock):
    data = b""
    while len(data) < 5:
        chunk = sock.recv(5 - len(data))
        if not chunk:
            return None, None
        data += chunk
    kind, length = struct.unpack(">cI", data)
    payload = b""
    while len(payload) < length:
        chunk = sock.recv(length - len(payload))
        if not chunk:
            return None, None
        payload += chunk
    return kind, payload


if len(args) < 2 or args[0] != "-m" or not args[1].startswith(MODULES):
    interpreter()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(SOCKET)
    request = {{"module": args[1], "args": args[2:], "env": {{**os.environ, PID_ENV: str(os.getpid())}},
               "cwd": os.getcwd(), "python": PYTHON}}
    socket.send_fds(sock, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
    kind, payload = frame(sock)
except OSError:
    kind = None
if kind != b"a":
    sock.close()
    interpreter()
child = int(payload)


def forward(number, _frame):
    try:
        os.kill(child, number)
    except OSError:  # it has ended: its status is on the way
        pass


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, forward)
try:
    kind, payload = frame(sock)
except OSError:
    kind = None
if kind != b"x":  # the server went away: its child must not outlive the process Spark knows
    try:
        os.kill(child, signal.SIGTERM)
    except OSError:
        pass
status = int(payload) if kind == b"x" else 1
if status > 128 and status - 128 in signal.valid_signals():
    signal.signal(status - 128, signal.SIG_DFL)
    os.kill(os.getpid(), status - 128)
sys.exit(status)
'''


def write_launcher(socket_file: str, module_prefixes: Sequence[str]) -> Path:
    """Write the launcher of the fork server at ``socket_file`` (this interpreter's), for the
    modules it runs (``module_prefixes``: the server's, ``fork_server.MODULE_PREFIXES`` for the
    platform's); returns its path."""
    from streamlake.procs import LAUNCHER_PID_ENV
    from streamlake.spark.interpreter import launcher_path, python_executable

    path = launcher_path(socket_file)
    # the interpreter's own path, not its resolved link: a virtualenv is known by it
    text = _LAUNCHER.format(python=os.path.abspath(python_executable()), socket=socket_file,
                            prefixes=tuple(module_prefixes), pid_env=LAUNCHER_PID_ENV)
    if not path.exists() or path.read_text() != text:
        staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        staged.write_text(text)
        staged.chmod(0o700)
        staged.replace(path)
    return path
