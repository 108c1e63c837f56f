"""
### One ingest and one backfill DAG per pipeline definition

Every definition in the pipelines directory (`pipelines/*.yaml`, or
`$STREAMLAKE_PIPELINES`) is scheduled and operable: `ingest_<name>` runs its
stages every few minutes (or continuously) and proves the result;
`backfill_<name>` applies its late events to gold, hourly, by hand or through
Airflow's Backfill. Add a definition file and its DAGs appear at the next parse.

A file that does not load is an import error of `pipeline_definitions.py`, which
names the file and the key (as `streamlake pipeline validate FILE` does), and
*StreamLake → Pipelines* lists it; the other pipelines' DAGs are unaffected. A
new file that does not load gets no DAGs. A pipeline that ran before keeps its
DAGs, described by the definition its tables were built with: the job keeps
running on that one, and each new run fails, saying what is wrong with the file,
until it is fixed.

The DAGs are built by `streamlake.orchestration.pipeline_dags`; savepoint,
restore and rescale are shared DAGs with the pipeline as a drop-down.
"""

from __future__ import annotations

from streamlake.operations.jobs import load_job, pipeline_names
from streamlake.orchestration.pipeline_dags import backfill_dag, ingest_dag

for _name in pipeline_names():
    _job = load_job(_name)
    _definition = _job.definition
    globals()[f"ingest_{_name}"] = ingest_dag(_job, _definition)
    globals()[f"backfill_{_name}"] = backfill_dag(_job, _definition)
