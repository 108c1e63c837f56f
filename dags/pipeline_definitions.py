"""
### The definitions in pipelines/ that do not load, as Airflow import errors

This file holds no DAG. Airflow shows what a DAG file raises as an *import
error*, per file, and drops that file's DAGs; so the pipelines' DAGs live in
`pipelines.py`, and this file alone raises, naming every definition file that
does not load, its key and what is wrong (what `streamlake pipeline validate
FILE` prints). The other pipelines' DAGs stay; the error goes once the file is
fixed or removed.
"""

from __future__ import annotations

from streamlake.operations.jobs import definition_errors
from streamlake.pipeline.definition import DefinitionFilesError

_broken = definition_errors()
if _broken:
    raise DefinitionFilesError(_broken)
