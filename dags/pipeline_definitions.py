"""
### The definitions in pipelines/ that do not load, as Airflow import errors

This file holds no DAG. Airflow shows what a DAG file raises as an *import
error*, per file, and drops that file's DAGs; so the pipelines' DAGs live in
`pipelines.py`, and this file alone raises, naming every definition file that
does not load, its key and what is wrong (what `streamlake pipeline validate
FILE` prints). That includes rules only Spark's analyzer refuses, asked of the
platform's Spark Connect server when it answers (else the run refuses them
before writing anything). The other pipelines' DAGs stay; the error goes once
the file is fixed or removed.
"""

from __future__ import annotations

from streamlake.operations.jobs import definition_errors, definition_files
from streamlake.orchestration.definitions import spark_refusals
from streamlake.pipeline.definition import DefinitionFilesError

_broken = {**definition_errors(), **spark_refusals(definition_files())}
if _broken:
    raise DefinitionFilesError(_broken)
