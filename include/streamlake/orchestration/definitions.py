"""What Spark's analyzer says of the definitions in ``pipelines/``, at the DAG processor's parse.

The DAG processor starts no JVM. Where the platform's Spark Connect server answers
(the ``spark_connect_default`` connection, as the DAGs' tasks find it), the rules of
each definition that loaded and whose verdict is not remembered yet
(:func:`streamlake.pipeline.definition_check.spark_verdict_known`) are analysed
there, so a rule only Spark refuses (an unknown function, a wrong argument type)
is an import error at the next parse too. Where no server answers they are left to
the run, whose job refuses them before it writes anything.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)


def spark_refusals(files: Mapping[str, Path], conn_id: str = "spark_connect_default") -> dict[Path, str]:
    """File -> why, for each definition in ``files`` (name -> file) whose rules Spark's
    analyzer refuses on the Spark Connect server of ``conn_id``; {} when every verdict is
    known or no server answers. Never raises for an unreachable server."""
    from streamlake.pipeline.definition import DefinitionError, load_definition
    from streamlake.pipeline.definition_check import spark_verdict_known

    pending = {}
    for path in files.values():
        try:
            definition = load_definition(path)
        except DefinitionError:
            continue  # reported by definition_errors
        if not spark_verdict_known(definition):
            pending[path] = definition
    if not pending:
        return {}
    remote = _server(conn_id)
    if remote is None:
        return {}
    # In a process of its own: a process that opened a Spark Connect session cannot start a
    # classic one afterwards, and whoever parses the DAG files (a test, `airflow dags test`)
    # may need one.
    import json
    import subprocess
    import sys

    try:  # within the DAG processor's import timeout (30 s by default)
        done = subprocess.run([sys.executable, "-m", __name__, remote, *map(str, pending)], capture_output=True,
                              text=True, timeout=25)
    except subprocess.TimeoutExpired:
        log.warning("Spark's analysis of the definitions' rules at parse took over 25 s: left to the run")
        return {}
    if done.returncode != 0:
        log.warning("Spark's analysis of the definitions' rules at parse failed (left to the run): %s",
                    done.stderr.strip()[-500:])
        return {}
    return {Path(path): why for path, why in json.loads(done.stdout).items()}


def _analyse(remote: str, paths: list[str]) -> dict[str, str]:
    """File -> why, for the definitions in ``paths`` whose rules the server refuses."""
    from streamlake.pipeline.definition import DefinitionError, load_definition
    from streamlake.pipeline.definition_check import check_definition
    from streamlake.spark.session import get_spark

    session = get_spark("streamlake-dag-parse", remote=remote)
    refused: dict[str, str] = {}
    try:
        for path in paths:
            try:
                check_definition(load_definition(path), spark=session)
            except DefinitionError as exc:
                refused[path] = str(exc)
    finally:
        session.stop()
    return refused


def _server(conn_id: str) -> str | None:
    from streamlake.platform.spark_connect import connect_url

    try:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        configured = SparkConnectHook(conn_id).get_connection_url()
    except Exception as exc:  # noqa: BLE001 - no such connection: the run checks instead
        log.info("no Spark Connect connection %r at parse (%s): rules left to the run", conn_id, exc)
        return None
    return connect_url(configured)


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(_analyse(sys.argv[1], sys.argv[2:])))
