"""Helpers shared by the command groups."""

from __future__ import annotations

import json

from streamlake.errors import StreamLakeError


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def kafka_options(items) -> dict[str, str]:
    """``--kafka-option KEY=VALUE`` flags as client properties (``kafka.`` prefix optional)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise StreamLakeError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        out[key.removeprefix("kafka.")] = value
    return out


def add_job_arguments(parser, *, required: bool = True) -> None:
    """``--job NAME`` or ``--root DIR [--definition FILE]``: the job a command works on."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--job", help="a named job (`streamlake job list`; every definition in pipelines/ is one)")
    where.add_argument("--root", help="the root directory of a pipeline (`streamlake pipeline run --root DIR`)")
    parser.add_argument("--definition", metavar="FILE",
                        help="with --root: the pipeline's definition (the root's own is used when it has one)")


def resolve_job(args):
    """The job named by ``--job``, or rooted at ``--root`` (see
    :func:`streamlake.operations.jobs.job_for_root`), recorded so jobs started from here
    find it by name. Raises KeyError for an unknown job or a root nothing ran under, and
    InvalidOptionError when ``--definition`` names another pipeline than the root's."""
    from streamlake.operations.jobs import job_for_root, jobs_dir, load_job, save_job

    if getattr(args, "job", None):
        return load_job(args.job)
    given = None
    if getattr(args, "definition", None):  # checked whole before anything is recorded
        from streamlake.pipeline.definition_check import checked_definition

        given = checked_definition(args.definition, remote=getattr(args, "remote", None))
    job = job_for_root(args.root, definition_file=getattr(args, "definition", None))
    if given is not None and job.definition is not None:
        wanted = given.name
        if wanted != job.definition.name:
            raise StreamLakeError(f"{job.root} holds pipeline {job.definition.name}, not {wanted}")
    if not (jobs_dir() / f"{job.name}.json").exists():
        save_job(job)
    return job


def add_remote_argument(parser, what: str) -> None:
    """``--remote sc://host:port``: where a Spark Connect-capable job (check, backfill, an
    available-now pipeline run) runs."""
    parser.add_argument("--remote", help=f"sc://host:port of a Spark Connect server to run {what} on (default: the "
                                         "platform's, when it runs; else a spark-submit)")


def connect_or_submit_command(application: str, job_args: list[str], remote: str | None, *, master: str,
                              name: str, short_run: bool = False, root: str | None = None) -> list[str]:
    """argv running ``jobs/<application>`` as a client of the Spark Connect server ``remote``
    (``--remote``) or, without one, of the platform's running server; spark-submit on
    ``master`` when no server answers (``short_run``: see spark_submit_command). For a job
    ``root`` on an object store the platform's server is used only where it holds a store's
    credentials (``make run LAKE=s3``): this shell's ``AWS_*`` environment reaches a
    spark-submit, never a running server. Says on stderr which it is."""
    import sys

    from streamlake.platform import spark_connect
    from streamlake.spark.session import connect_client_command, spark_submit_command
    from streamlake.storage.location import is_object_store

    url = spark_connect.connect_url(remote)
    if url and not remote and root and is_object_store(root) and not spark_connect.holds_store_credentials():
        print(f"{name}: the platform's Spark Connect server {url} holds no store credentials and {root} is on a "
              f"store: spark-submit with this environment's", file=sys.stderr)
        url = None
    if url:
        print(f"{name} on the Spark Connect server {url}", file=sys.stderr)
        return connect_client_command(application, job_args, url)
    if remote:
        print(f"no Spark Connect server answers at {remote}: spark-submit", file=sys.stderr)
    return spark_submit_command(application, job_args, master=master, name=name, short_run=short_run)
