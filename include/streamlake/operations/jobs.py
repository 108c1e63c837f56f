"""Jobs: what a DAG, a savepoint, a rescale, a check or a backfill refers to by name.

A job is a pipeline definition (:mod:`streamlake.pipeline.definition`: topics,
fields, rules, aggregates) run under one root directory, plus the Spark
resources it runs with; a job without a definition only ingests bronze. Every
definition in the pipelines directory (``pipelines/``, or
``$STREAMLAKE_PIPELINES``) is a job of the same name, rooted at
``$STREAMLAKE_HOME/data/<name>`` unless defined otherwise
(``streamlake job define NAME --definition FILE --root DIR``).

**Identity.** A job's name is unique in ``$STREAMLAKE_HOME``; its spec is
``$STREAMLAKE_HOME/jobs/<name>.json``. The root knows its job: the first
command that reaches a root (``pipeline run``, ``job define``) writes the
name into the root's control directory (``_control/job.json``), and every later
command given that root (``backfill --root``, ``check --root``, ...) finds the
job there, whichever command came first. Two roots are two jobs: a root whose
wanted name (the definition's) is taken by another root gets the name plus a
short hash of its absolute path. Settings are recorded as given: an option not
given is not recorded (None means the platform default).

**The definition** a job's tables were built with (the *applied* definition)
is kept in the root (``_control/definition.json``, :mod:`streamlake.pipeline.evolution`);
checks, backfills and savepoints use it. Runs read the definition file
(``definition_file``) and apply its changes where they are compatible.

Layout under ``root`` (:class:`JobSpec` derives every path from it):
``bronze/``, ``silver/``, ``quarantine/``, ``gold/<aggregate>/``,
``late_events/<aggregate>/`` (Delta tables), ``_checkpoints/<stage>/`` (Spark
checkpoints; gold stages are ``gold/<aggregate>``), ``_control/`` (identity,
applied definition, lock, stop/pause requests, state, progress). Cheap to
import (DAG files do).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from streamlake import config
from streamlake.errors import InvalidOptionError
from streamlake.storage.location import is_object_store, is_secret, join, normalize, remember_options, state_dir

log = logging.getLogger(__name__)

DEMO_JOB = "sensors"
STAGES = ("bronze", "silver", "gold")
# Available-now runs of scheduled jobs read at most this many Kafka records per micro-batch.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 50_000
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
IDENTITY_FILE = "job.json"
# Fields of job specs written before pipelines had definitions (read, then dropped).
_RETIRED_FIELDS = ("window", "allowed_lateness", "dedup_horizon")


# The Airflow connection of a job on an object store that names none (``job define --storage-conn-id``).
DEFAULT_STORAGE_CONN_ID = "aws_default"
# What a rescale may change (the rescale DAG's params): the master to run on and the resources.
RESCALE_SETTINGS = ("spark_conn_id", "total_executor_cores", "executor_cores", "min_partitions",
                    "max_offsets_per_trigger", "gold_partitions")


@dataclass
class JobSpec:
    name: str
    root: str
    definition_file: str | None = None  # the pipeline definition (YAML); None: a bronze-only job
    topics: list[str] = field(default_factory=list)  # a bronze-only job's topics (else the definition's)
    stages: list[str] | None = None  # None: every stage the job has (bronze only without a definition)
    # bronze: Kafka source
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    starting_offsets: str = "earliest"
    kafka: dict[str, str] = field(default_factory=dict)
    # gold
    gold_partitions: int | None = None  # shuffle partitions of gold's aggregations (their parallelism)
    # running
    processing_time_s: float | None = None  # trigger interval when run continuously (None: 5 s)
    master: str | None = None  # for the CLI (None: local[*]); Airflow uses the spark connection below
    spark_conn_id: str | None = None  # None: spark_default
    total_executor_cores: int | None = None  # spark.cores.max on a standalone cluster
    executor_cores: int | None = None
    # an object-store root's storage options as given, never secrets (those stay in the environment)
    storage_options: dict[str, str] = field(default_factory=dict)
    # the Airflow connection (type aws) with the credentials and endpoint of an object-store
    # root, for the DAGs' tasks (None: DEFAULT_STORAGE_CONN_ID; the CLI reads the environment)
    storage_conn_id: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidOptionError(f"job name {self.name!r} may only contain letters, digits, _ . -")
        self.root = normalize(self.root)
        secrets = sorted(k for k in self.storage_options if is_secret(k))
        if secrets:
            raise InvalidOptionError(f"job {self.name}: a job spec is kept in the clear; give {secrets} in the "
                                     "environment (AWS_* variables for S3), not as recorded storage options")
        remember_options(self.root, self.storage_options)  # every table of the job opens with them
        if self.definition_file:
            self.definition_file = str(Path(self.definition_file).absolute())
        elif not self.topics:
            raise InvalidOptionError(f"job {self.name}: a definition (--definition FILE) or at least one topic is "
                                     "required")
        if self.executor_cores and self.total_executor_cores and self.executor_cores > self.total_executor_cores:
            raise InvalidOptionError(f"job {self.name}: {self.executor_cores} cores per executor but "
                                     f"{self.total_executor_cores} in total (spark.cores.max): no executor would start")
        stages = self.run_stages
        if not stages or tuple(stages) != STAGES[:len(stages)]:
            raise InvalidOptionError(f"job {self.name}: stages must be a prefix of {', '.join(STAGES)} (bronze "
                                     f"first), got {', '.join(stages) or 'none'}")
        if len(stages) > 1 and not self.definition_file:
            raise InvalidOptionError(f"job {self.name}: silver and gold need a pipeline definition "
                                     "(--definition FILE, e.g. pipelines/sensors.yaml); without one only bronze runs")

    # -- the definition ------------------------------------------------------------------

    @property
    def run_stages(self) -> list[str]:
        return list(self.stages) if self.stages else (list(STAGES) if self.definition_file else ["bronze"])

    @property
    def definition(self):
        """The definition the job's tables were built with (applied), else the file's.
        None for a bronze-only job."""
        from streamlake.pipeline.evolution import applied_definition
        from streamlake.pipeline.definition import load_definition

        if not self.definition_file:
            return None
        return applied_definition(self.root) or load_definition(self.definition_file)

    def file_definition(self):
        """The definition file as it is now (what the next run applies)."""
        from streamlake.pipeline.definition import load_definition

        return load_definition(self.definition_file) if self.definition_file else None

    @property
    def source_topics(self) -> list[str]:
        """The topics bronze ingests: the definition's, or (topic pattern) those bronze ingested."""
        definition = self.definition
        if definition is None:
            return list(self.topics)
        if definition.topics:
            return list(definition.topics)
        from streamlake.pipeline.bronze import ingested_topics

        try:
            return ingested_topics(self.table)
        except FileNotFoundError:
            return []

    # -- layout --------------------------------------------------------------------------

    def table_path(self, name: str) -> str:
        """Location of one of the job's tables (``bronze``, ``silver``, ``gold/<aggregate>``...)."""
        return join(self.root, name)

    def checkpoint_path(self, stage: str) -> str:
        return os.path.join(self.checkpoints_dir, stage)

    @property
    def checkpoints_dir(self) -> str:
        """Spark's checkpoints: under the root, or for a root on an object store on the driver's disk."""
        return os.path.join(state_dir(self.root), "_checkpoints")

    @property
    def control_dir(self) -> str:
        return os.path.join(state_dir(self.root), "_control")

    @property
    def control(self):
        from streamlake.pipeline.control import JobControl

        return JobControl(self.control_dir)

    @property
    def table(self) -> str:
        """The bronze table (the one the offset audit checks against Kafka)."""
        return self.table_path("bronze")

    def tables(self) -> dict[str, str]:
        """Every table the job's stages write, by name, in pipeline order."""
        out = {"bronze": self.table}
        definition = self.definition
        if definition is None:
            return out
        stages = self.run_stages
        if "silver" in stages:
            out.update(silver=self.table_path("silver"), quarantine=self.table_path("quarantine"))
        if "gold" in stages:
            for agg in definition.aggregates:
                out[agg.gold_table] = self.table_path(agg.gold_table)
                out[agg.late_table] = self.table_path(agg.late_table)
        return out

    def stage_of(self, table: str) -> str:
        """The stage (and checkpoint) that writes ``table``."""
        if table in ("silver", "quarantine"):
            return "silver"
        if table.startswith(("gold/", "late_events/")):
            return "gold/" + table.split("/", 1)[1]
        return "bronze"

    # -- as run configurations ------------------------------------------------------------

    def pipeline_config(self, continuous: bool = False):
        """The job as a PipelineConfig: the definition *file* (a run applies its changes),
        the settings as recorded (imported here: DAG files import this module)."""
        from streamlake.pipeline.config import PipelineConfig

        return PipelineConfig(
            root=self.root, definition=self.file_definition(),
            topics=() if self.definition_file else tuple(self.topics), stages=tuple(self.run_stages),
            starting_offsets=self.starting_offsets,
            processing_time_s=(self.processing_time_s or 5.0) if continuous else None,
            max_offsets_per_trigger=self.max_offsets_per_trigger, min_partitions=self.min_partitions,
            kafka=dict(self.kafka), gold_partitions=self.gold_partitions, query_name=self.name,
            storage_options=dict(self.storage_options),
        )

    def spark_conf(self) -> dict[str, str]:
        """Spark properties for the job's resources (what spark-submit flags would set)."""
        conf = {}
        if self.total_executor_cores:
            conf["spark.cores.max"] = str(self.total_executor_cores)
        if self.executor_cores:
            conf["spark.executor.cores"] = str(self.executor_cores)
        return conf

    def rescaled(self, settings: dict) -> "JobSpec":
        """This job with the rescale ``settings`` (keys of :data:`RESCALE_SETTINGS`) applied; a
        setting left empty (None, "" or 0) keeps the job's own. Raises InvalidOptionError for a
        key that is not a rescale setting."""
        from dataclasses import replace

        unknown = sorted(set(settings) - set(RESCALE_SETTINGS))
        if unknown:
            raise InvalidOptionError(f"not rescale settings: {', '.join(unknown)} "
                                     f"(known: {', '.join(RESCALE_SETTINGS)})")
        return replace(self, **{k: v for k, v in settings.items() if v not in (None, "", 0)})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        data = {k: v for k, v in data.items() if k not in _RETIRED_FIELDS}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidOptionError(f"unknown job field(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**data)


# -- where definitions and jobs live -----------------------------------------------------------

def pipelines_dir() -> Path:
    """The directory of pipeline definitions: ``$STREAMLAKE_PIPELINES`` or ``pipelines/`` in the checkout."""
    return Path(os.environ.get("STREAMLAKE_PIPELINES") or config.project_root() / "pipelines")


def definition_files() -> dict[str, Path]:
    """Pipeline name -> definition file, for every definition in :func:`pipelines_dir`
    that loads (the others: :func:`definition_errors`)."""
    return _scan_definitions()[0]


def definition_errors() -> dict[Path, str]:
    """Definition files of :func:`pipelines_dir` that do not load (or repeat a name), with
    why: they get no DAGs, and the Pipelines view lists them."""
    return _scan_definitions()[1]


def _scan_definitions() -> tuple[dict[str, Path], dict[Path, str]]:
    from streamlake.pipeline.definition import DefinitionError, load_definition

    found: dict[str, Path] = {}
    errors: dict[Path, str] = {}
    directory = pipelines_dir()
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        try:
            name = load_definition(path).name
        except DefinitionError as exc:
            log.warning("pipeline definition %s does not load: %s", path, exc)
            errors[path] = str(exc)
            continue
        if name in found:
            log.warning("pipeline %s is defined twice (%s and %s); using the first", name, found[name], path)
            errors[path] = f"pipeline {name} is already defined by {found[name].name}; this file is not used"
            continue
        found[name] = path
    return found, errors


def pipeline_names() -> list[str]:
    """The pipelines whose DAGs exist: every definition in :func:`pipelines_dir` that loads,
    and every job of a file there that no longer loads but whose tables were built with an
    earlier version of it. Such a job keeps running on that last good definition; its runs
    refuse to start, saying what is wrong with the file, until it is fixed."""
    from streamlake.pipeline.evolution import applied_definition

    names = dict(definition_files())
    broken = {p.resolve() for p in definition_errors()}
    for path in sorted(jobs_dir().glob("*.json")):
        try:
            spec = JobSpec.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, InvalidOptionError):
            continue
        if (spec.name not in names and spec.definition_file and Path(spec.definition_file).resolve() in broken
                and applied_definition(spec.root) is not None):
            names[spec.name] = Path(spec.definition_file)
    return sorted(names)


def jobs_dir() -> Path:
    path = config.home() / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_job(name: str, definition_file: str | Path) -> JobSpec:
    """The job of a definition in the pipelines directory: its root under the lake root
    (:func:`streamlake.storage.lake.lake_root`, with the lake's public options when that is
    an object store), the default read limit for scheduled available-now runs."""
    from streamlake.storage.lake import lake_options, lake_root

    root = join(lake_root(), name)
    return JobSpec(name=name, root=root, definition_file=str(definition_file),
                   max_offsets_per_trigger=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
                   storage_options=lake_options() if is_object_store(root) else {})


def identity_file(root: str | Path) -> Path:
    return Path(state_dir(root)) / "_control" / IDENTITY_FILE


def root_identity(root: str | Path) -> str | None:
    """The name of the job rooted at ``root`` (None: no command has reached it yet)."""
    try:
        return json.loads(identity_file(root).read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def save_job(spec: JobSpec) -> JobSpec:
    """Record ``spec`` (``$STREAMLAKE_HOME/jobs/<name>.json``) and its name in its root.

    Raises InvalidOptionError when the name belongs to a job of another root, or the
    root to a job of another name: a root is one job, a name one root."""
    owner = root_identity(spec.root)
    if owner is not None and owner != spec.name:
        raise InvalidOptionError(f"{spec.root} is the root of job {owner!r}; a root holds one job (use that name, "
                                 "or another root)")
    path = jobs_dir() / f"{spec.name}.json"
    if path.exists():
        try:
            other = json.loads(path.read_text()).get("root")
        except ValueError:
            other = None
        if other and normalize(other) != spec.root and root_identity(other) == spec.name:
            raise InvalidOptionError(f"a job named {spec.name!r} already lives at {other}; give this root another "
                                     "name (--name)")
    _write_json(path, spec.to_dict())
    if owner is None:
        _write_json(identity_file(spec.root), {"name": spec.name})
    return spec


def recorded_storage_options(root: str | Path) -> dict[str, str]:
    """The storage options the job rooted at ``root`` recorded (none: no such job here)."""
    owner = root_identity(root)
    if owner is None:
        return {}
    try:
        return dict(load_job(owner).storage_options)
    except KeyError:
        return {}


def load_job(name: str) -> JobSpec:
    """The job's spec. A definition in the pipelines directory is a job of its name even
    before it ran. Raises KeyError for an unknown job."""
    path = jobs_dir() / f"{name}.json"
    if path.exists():
        return JobSpec.from_dict(json.loads(path.read_text()))
    definitions = definition_files()
    if name in definitions:
        return save_job(default_job(name, definitions[name]))
    raise KeyError(f"no job named {name!r} (known: {', '.join(list_jobs()) or 'none'})")


def list_jobs() -> list[str]:
    names = {p.stem for p in jobs_dir().glob("*.json")}
    return sorted(names | set(definition_files()))


def _free_name(wanted: str, root: str) -> str:
    """``wanted`` unless a job of another root has it; then ``wanted-<hash of the root>``."""
    path = jobs_dir() / f"{wanted}.json"
    if not path.exists():
        return wanted
    try:
        other = json.loads(path.read_text()).get("root")
    except ValueError:
        other = None
    if not other or normalize(other) == root:
        return wanted
    return f"{wanted}-{hashlib.sha1(root.encode()).hexdigest()[:8]}"


def job_for_root(root: str | Path, *, definition_file: str | None = None, name: str | None = None,
                 topics: list[str] | None = None) -> JobSpec:
    """The job rooted at ``root``: the one whose name the root holds, else a new spec (not
    saved) named ``name``, else after the definition (or ``root-<dir>`` for a bronze-only
    job), made unique (see the module docstring). Raises InvalidOptionError when ``name``
    contradicts the root's job, and KeyError when the root has no job and nothing to make
    one from."""
    root = normalize(root)
    owner = root_identity(root)
    if owner is not None:
        if name and name != owner:
            raise InvalidOptionError(f"{root} is the root of job {owner!r}, not {name!r}")
        try:
            return load_job(owner)
        except KeyError:
            pass  # the root came from another STREAMLAKE_HOME: make the job again below
        name = owner
    if not definition_file and not topics:
        from streamlake.pipeline.evolution import applied_definition_file

        definition_file = applied_definition_file(root)
        if not definition_file:
            raise KeyError(f"no pipeline has run under {root}: start it with `streamlake pipeline run "
                           f"--definition FILE --root {root}`")
    if name is None:
        from streamlake.pipeline.definition import load_definition

        wanted = load_definition(definition_file).name if definition_file else f"root-{root.rsplit('/', 1)[-1]}"
        name = _free_name(wanted, root)
    return JobSpec(name=name, root=root, definition_file=definition_file, topics=list(topics or []))


def with_settings(spec: JobSpec, **settings) -> JobSpec:
    """``spec`` with the settings that were given (None values are not given)."""
    return replace(spec, **{k: v for k, v in settings.items() if v is not None})
