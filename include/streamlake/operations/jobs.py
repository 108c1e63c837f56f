"""Named ingest jobs: what a DAG, a savepoint or a rescale refers to by name.

A job is a bronze ingest (topics -> table, with its checkpoint) plus the Spark
resources it runs with. Specs are JSON files in ``$STREAMLAKE_HOME/jobs/``; the
demo job ``bronze_sensors`` is defined on first use. Rescaling rewrites the
spec, so every later start (scheduled, supervised, restored) uses the new
settings. Cheap to import (DAG files do).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields

from streamlake import config
from streamlake.errors import InvalidOptionError

DEMO_JOB = "bronze_sensors"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class JobSpec:
    name: str
    topics: list[str]
    table: str
    checkpoint: str
    max_offsets_per_trigger: int | None = 50_000
    min_partitions: int | None = None
    processing_time_s: float = 5.0  # trigger interval when run continuously
    starting_offsets: str = "earliest"
    master: str = "local[*]"  # for the CLI; Airflow uses the spark connection below
    spark_conn_id: str = "spark_default"
    total_executor_cores: int | None = None  # spark.cores.max on a standalone cluster
    executor_cores: int | None = None
    kafka: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidOptionError(f"job name {self.name!r} may only contain letters, digits, _ . -")
        if not self.topics:
            raise InvalidOptionError(f"job {self.name}: at least one topic is required")

    def ingest_config(self, continuous: bool):
        """The job as an IngestConfig (imported here: DAG files import this module)."""
        from streamlake.pipeline.ingest import IngestConfig

        return IngestConfig(
            table=self.table, checkpoint=self.checkpoint, topics=tuple(self.topics),
            starting_offsets=self.starting_offsets,
            processing_time_s=self.processing_time_s if continuous else None,
            max_offsets_per_trigger=self.max_offsets_per_trigger, min_partitions=self.min_partitions,
            kafka=dict(self.kafka), query_name=self.name,
        )

    def spark_conf(self) -> dict[str, str]:
        """Spark properties for the job's resources (what spark-submit flags would set)."""
        conf = {}
        if self.total_executor_cores:
            conf["spark.cores.max"] = str(self.total_executor_cores)
        if self.executor_cores:
            conf["spark.executor.cores"] = str(self.executor_cores)
        return conf

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidOptionError(f"unknown job field(s): {', '.join(unknown)}")
        return cls(**data)


def jobs_dir():
    path = config.home() / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def demo_job() -> JobSpec:
    data = config.home() / "data"
    return JobSpec(name=DEMO_JOB, topics=["sensors"], table=str(data / "bronze" / "sensors"),
                   checkpoint=str(data / "checkpoints" / DEMO_JOB))


def save_job(spec: JobSpec) -> JobSpec:
    path = jobs_dir() / f"{spec.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec.to_dict(), indent=2))
    os.replace(tmp, path)
    return spec


def load_job(name: str) -> JobSpec:
    """The job's spec. Raises KeyError for an unknown job (the demo job always exists)."""
    path = jobs_dir() / f"{name}.json"
    if path.exists():
        return JobSpec.from_dict(json.loads(path.read_text()))
    if name == DEMO_JOB:
        return save_job(demo_job())
    raise KeyError(f"no job named {name!r} (known: {', '.join(list_jobs()) or 'none'})")


def list_jobs() -> list[str]:
    names = {p.stem for p in jobs_dir().glob("*.json")}
    return sorted(names | {DEMO_JOB})
