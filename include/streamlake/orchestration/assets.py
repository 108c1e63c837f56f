"""The pipeline's tables as Airflow Assets, so the UI shows which task writes which table
and what feeds what (Kafka topic -> bronze -> silver/quarantine -> gold/late_events).

Assets are declared when DAG files are parsed, for the demo job's tables (the
job a DAG's params default to); URIs are the tables' ``file://`` locations.
"""

from __future__ import annotations

from airflow.sdk import Asset

from streamlake.operations.jobs import STAGE_TABLES, load_job


def table_assets(job_name: str) -> dict[str, Asset]:
    """One Asset per table the job writes, keyed by table name."""
    job = load_job(job_name)
    return {name: Asset(name=f"{job.name}.{name}", uri=f"file://{path}", group="streamlake-tables")
            for name, path in job.tables().items()}


def topic_assets(job_name: str) -> list[Asset]:
    job = load_job(job_name)
    return [Asset(name=f"kafka.{topic}", uri=f"kafka://streamlake/{topic}", group="streamlake-topics")
            for topic in job.source_topics]


def stage_outputs(job_name: str, stages: tuple[str, ...] = ("bronze", "silver", "gold")) -> list[Asset]:
    assets = table_assets(job_name)
    return [assets[t] for stage in stages for t in STAGE_TABLES[stage] if t in assets]
