"""A job's tables as Airflow Assets, so the UI shows which task writes which table and what
feeds what (Kafka topic -> bronze -> silver/quarantine -> gold/<aggregate>, late_events/<aggregate>).

Assets are declared when DAG files are parsed, for every table of every pipeline;
names are ``<job>.<table>``, URIs the tables' ``file://`` locations.
"""

from __future__ import annotations

from airflow.sdk import Asset

from streamlake.operations.jobs import load_job


def table_assets(job_name: str) -> dict[str, Asset]:
    """One Asset per table the job writes, keyed by table name."""
    job = load_job(job_name)
    return {name: Asset(name=f"{job.name}.{name}", uri=f"file://{path}", group="streamlake-tables")
            for name, path in job.tables().items()}


def topic_assets(job_name: str) -> list[Asset]:
    job = load_job(job_name)
    return [Asset(name=f"kafka.{topic}", uri=f"kafka://streamlake/{topic}", group="streamlake-topics")
            for topic in job.source_topics]


def stage_outputs(job_name: str) -> list[Asset]:
    """Every table the job's stages write (what an ingest run produces)."""
    return list(table_assets(job_name).values())
