"""The whole check of a definition, run by every entry point before it writes anything.

:func:`~streamlake.pipeline.definition.load_definition` checks the file without
Spark (its structure, types, durations, and its rules statically:
:mod:`streamlake.pipeline.rules`). :func:`check_definition` adds the rest: the
``datagen`` hints, and Spark's analyzer on every rule (:func:`check_rules`), the
authority on Spark's own syntax, functions and argument types.

``pipeline run``, ``job define``, ``check``/``backfill``/``quality run`` with
``--definition``, ``pipeline validate``, the ingest DAG's run and the pipeline
job itself call :func:`checked_definition` (or :func:`check_definition`) first,
so a definition that Spark refuses leaves no job, no control file and no table
behind, and the user sees one line naming the file and the key.

The analysis needs a Spark session: the caller's, this process's active one,
the Spark Connect server named by ``remote`` when it answers, else a small
local one (about 6 s to start). A rule set Spark accepted is remembered
(:func:`_verdict_path`: a file named by the digest of the fields, the rules and
pyspark's version, in the user's cache directory), so each definition pays the
analysis once per machine. Nothing is remembered for a definition Spark refuses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from streamlake.pipeline.definition import DefinitionError, PipelineDefinition, load_definition

log = logging.getLogger(__name__)


def checked_definition(path: str | Path, spark=None, remote: str | None = None) -> PipelineDefinition:
    """The definition in ``path``, checked whole (:func:`check_definition`). Raises
    DefinitionError naming the file and the key."""
    definition = load_definition(path)
    check_definition(definition, spark=spark, remote=remote)
    return definition


def check_definition(definition: PipelineDefinition, spark=None, remote: str | None = None) -> None:
    """What :func:`load_definition` cannot check without Spark: the ``datagen`` hints and
    Spark's analysis of every rule. ``spark``: the session to analyse with (else the active
    one, the Spark Connect server ``remote`` if it answers, or a local one started and
    stopped here).
    Raises DefinitionError naming the key; writes nothing but, for rules Spark accepts,
    the remembered verdict."""
    from streamlake.errors import InvalidOptionError
    from streamlake.kafka.events import check_datagen

    try:
        check_datagen(definition)
    except InvalidOptionError as exc:
        raise DefinitionError("datagen", str(exc), definition.source) from None
    if not definition.rules:
        return
    verdict = _verdict_path(definition)
    if spark is None and verdict.exists():
        return
    if spark is not None:
        check_rules(spark, definition)
    else:
        _check_rules_in_some_session(definition, remote)
    try:
        verdict.parent.mkdir(parents=True, exist_ok=True)
        verdict.write_text(json.dumps(_rule_set(definition)))
    except OSError as exc:  # only a cache: the next check asks Spark again
        log.debug("could not remember the rules' verdict in %s: %s", verdict, exc)


def spark_verdict_known(definition: PipelineDefinition) -> bool:
    """Whether Spark's analyzer is not needed for ``definition``: it has no rules, or Spark
    accepted these very rules over these fields before (the remembered verdict)."""
    return not definition.rules or _verdict_path(definition).exists()


def _check_rules_in_some_session(definition: PipelineDefinition, remote: str | None) -> None:
    from pyspark.sql import SparkSession

    from streamlake.platform import spark_connect
    from streamlake.spark.session import get_spark, quiet_local_session

    active = SparkSession.getActiveSession()
    if active is not None:
        check_rules(active, definition)
        return
    # Connect only when asked for: a process that used a Connect session cannot start a classic one
    # (quality run validates in one after this check).
    url = spark_connect.connect_url(remote) if remote else None
    if url:
        session = get_spark("streamlake-check-definition", remote=url)
    else:
        session = quiet_local_session("streamlake-check-definition")
    try:
        check_rules(session, definition)
    finally:
        session.stop()


def check_rules(spark, definition: PipelineDefinition) -> None:
    """Every rule is a boolean Spark SQL expression over the declared fields (analysed by
    Spark on an empty DataFrame of the typed fields; nothing runs). Raises DefinitionError
    naming the rule; Spark's whole error goes to this module's log at debug level."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    if not definition.rules:
        return
    empty = spark.createDataFrame([], ", ".join(f"`{f.name}` {f.type.sql}" for f in definition.fields))
    context_logger = logging.getLogger("SQLQueryContextLogger")  # pyspark logs every analysis error in full
    level = context_logger.level
    context_logger.setLevel(logging.CRITICAL)
    try:
        for i, rule in enumerate(definition.rules):
            key = f"rules[{i}].check"
            try:
                column = F.expr(rule.check)
                dtype = empty.select(column.alias("r")).schema["r"].dataType
                empty.where(column).schema  # aggregates and windows are refused here (analysed: Connect is lazy)
            except PySparkException as exc:
                log.debug("rule %s: Spark's analyzer refused %r", rule.name, rule.check, exc_info=True)
                raise DefinitionError(key, f"rule {rule.name}: {rule.check!r} is not a valid Spark SQL expression "
                                           f"over the declared fields: {_first_line(exc)}", definition.source) \
                    from None
            if not isinstance(dtype, BooleanType):
                raise DefinitionError(key, f"rule {rule.name}: {rule.check!r} is of type {dtype.simpleString()}, "
                                           "not a boolean", definition.source)
    finally:
        context_logger.setLevel(level)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    first = re.sub(r"\s*SQLSTATE: \w+;?.*$", "", first)
    if len(lines) > 1 and "PARSE_SYNTAX_ERROR" in first:
        first += " " + lines[1]
    return first


def _rule_set(definition: PipelineDefinition) -> dict:
    from importlib.metadata import version

    return {"pyspark": version("pyspark"), "fields": [[f.name, f.type.sql] for f in definition.fields],
            "rules": [[r.name, r.check] for r in definition.rules]}


def _verdict_path(definition: PipelineDefinition) -> Path:
    """Where Spark's acceptance of this definition's rules is remembered: the digest of what
    the analysis depends on, in ``$XDG_CACHE_HOME/streamlake`` (``~/.cache/streamlake``)."""
    digest = hashlib.sha256(json.dumps(_rule_set(definition), sort_keys=True).encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "streamlake" / "rule-checks" / digest
