"""Logging set-up shared by the spark-submit jobs and the CLI.

StreamLake's own loggers report at the level asked for; libraries that log
routine internals at INFO are held at WARNING, so a task log shows the job's
progress, checks and verdicts, and still every library warning and error:

* ``py4j``: a line per gateway call and from destructors at exit;
* ``great_expectations``: one line per internal function it registers (about
  200 per validation run), metric re-declarations, datasource loading.
"""

from __future__ import annotations

import logging
import sys

QUIET_LIBRARIES = ("py4j", "great_expectations")
JOB_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: int = logging.INFO, fmt: str = JOB_FORMAT) -> None:
    """Log to stderr at ``level`` with ``fmt`` (the handler is added only if the process has
    none yet); :data:`QUIET_LIBRARIES` at WARNING or above."""
    logging.basicConfig(format=fmt, stream=sys.stderr)
    logging.getLogger().setLevel(level)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
