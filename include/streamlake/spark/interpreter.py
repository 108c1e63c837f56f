"""The Python Spark's processes run: this environment's interpreter, or the fork server's launcher.

Where the platform's fork server runs (:mod:`streamlake.platform.fork_server`), Spark's
Python processes (the worker daemon, a streaming source's runner, a data source's planner)
are forked warm by it: Spark is given a launcher instead of the interpreter
(``spark.pyspark.python`` / ``PYSPARK_PYTHON``), a small script the fork server writes next to
its socket (:mod:`streamlake.platform.spark_python` writes it and says what it does). This
module decides which of the two a Spark application gets (:func:`spark_python`), and knows
a launcher when it sees one (:func:`is_launcher`), so the driver and the platform's own
commands always run the interpreter itself (:func:`python_executable`).

Only for masters of this machine (``local``, ``local[N]``, a ``spark://`` master on
127.0.0.1 or localhost, the platform's own cluster): an executor on another machine has
neither the launcher nor the server.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

FORK_SERVER = "fork-server"  # the fork server's service name (streamlake.procs)
LAUNCHER_NAME = "spark-python"
_LOCAL_MASTER = re.compile(r"^(local(\[[^\]]*\])?|spark://(127\.0\.0\.1|localhost)(:\d+)?)$")


def launcher_path(socket_file: str) -> Path:
    """Where the launcher of the fork server at ``socket_file`` is: next to its socket, named
    after it (``fork-server-spark-python``), so that two servers never share one."""
    socket_file = Path(socket_file)
    return socket_file.with_name(f"{socket_file.stem}-{LAUNCHER_NAME}")


def is_launcher(path: str) -> bool:
    """Whether ``path`` names a launcher (not an interpreter)."""
    return os.path.basename(path).endswith(LAUNCHER_NAME)


def python_executable() -> str:
    """The interpreter Spark's Python workers must use (this environment's); never the fork
    server's launcher a driver may have been given."""
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    return sys.executable if is_launcher(python) else python


def is_local_master(master: str | None) -> bool:
    """Whether Spark's executors of ``master`` run on this machine."""
    return bool(master) and bool(_LOCAL_MASTER.match(master.strip()))


def spark_python(master: str | None) -> str:
    """The interpreter to give Spark (``spark.pyspark.python``, ``PYSPARK_PYTHON``) for an
    application on ``master``: the fork server's launcher when one runs with this very
    interpreter (another one chosen, a wrapper of the caller's, is respected) and the master is
    this machine's; otherwise this interpreter."""
    from streamlake import procs

    python = python_executable()
    state = procs.status(FORK_SERVER) if is_local_master(master) else None
    if state is None or not state.info.get("python") or \
            os.path.abspath(state.info["python"]) != os.path.abspath(python):
        return python
    launcher = launcher_path(state.info["socket"])
    return str(launcher) if launcher.exists() else python
