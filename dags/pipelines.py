"""
### One ingest and one backfill DAG per pipeline definition

Every definition in the pipelines directory (`pipelines/*.yaml`, or
`$STREAMLAKE_PIPELINES`) is scheduled and operable: `ingest_<name>` runs its
stages every few minutes (or continuously) and proves the result;
`backfill_<name>` applies its late events to gold, hourly, by hand or through
Airflow's Backfill. Add a definition file and its DAGs appear at the next parse.
A file that does not load gets no DAGs (the others are unaffected): *StreamLake →
Pipelines* lists it with what is wrong, as `streamlake pipeline validate FILE` does.
The DAGs are built by `streamlake.orchestration.pipeline_dags`; savepoint,
restore and rescale are shared DAGs with the pipeline as a drop-down.
"""

from __future__ import annotations

from streamlake.operations.jobs import definition_files, load_job
from streamlake.orchestration.pipeline_dags import backfill_dag, ingest_dag

for _name in definition_files():
    _job = load_job(_name)
    _definition = _job.definition
    globals()[f"ingest_{_name}"] = ingest_dag(_job, _definition)
    globals()[f"backfill_{_name}"] = backfill_dag(_job, _definition)
