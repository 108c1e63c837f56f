"""The local platform: ``streamlake spark``, ``airflow``, ``platform`` (`make run`), ``demo`` and ``stop``."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from streamlake import config, procs
from streamlake.cli.common import print_json
from streamlake.operations.jobs import DEMO_JOB as DEMO_PIPELINE
from streamlake.platform import spark_connect


def cmd_spark(args) -> int:
    from streamlake.platform import spark_cluster

    if args.action == "start":
        print_json(spark_cluster.start(args.workers, args.cores_per_worker, args.memory))
    elif args.action == "stop":
        print("stopped: " + (", ".join(spark_cluster.stop()) or "nothing was running"))
    else:
        state = spark_cluster.status()
        print_json(state)
        return 0 if state["running"] else 1
    return 0


def cmd_airflow(args) -> int:
    from streamlake.platform import airflow as airflow_setup

    if args.action == "start":
        info = airflow_setup.start(args.port)
        print(f"Airflow UI: {info['url']}  (user {info['user']}, password {info['password']})")
    elif args.action == "stop":
        print("Airflow stopped" if airflow_setup.stop() else "Airflow was not running")
    else:
        running = procs.status(airflow_setup.SERVICE) is not None
        print_json({"running": running, "ui_ready": airflow_setup.ui_ready(args.port), "home": str(airflow_setup.airflow_home())})
        return 0 if running else 1
    return 0


def producer_service(pipeline: str) -> str:
    return f"producer-{pipeline}"


def _start_broker_and_producers(args, pipelines: dict) -> None:
    """The embedded Kafka (Apache Kafka, KRaft; its topics kept under the home from one start
    to the next) and a background demo producer per pipeline definition (all idempotent).
    Each producer writes its definition's records with the demo's realistic mix: some out of
    order, late, duplicated, malformed (every quarantine reason)."""
    from streamlake.platform import broker
    from streamlake.spark.session import job_environment

    state = broker.start(args.kafka_port)
    print(f"Kafka (embedded):  {state['bootstrap']} (Apache Kafka {state['kafka']}, KRaft; topics kept in "
          f"{state['data']}; logs {config.log_dir()}/kafka-<node>.log)")
    env = job_environment({config.ENV_BOOTSTRAP: config.bootstrap_servers()})
    for name, path in pipelines.items():
        rate = args.rate if name == DEMO_PIPELINE else args.other_rate
        if procs.status(producer_service(name)) is None:
            procs.start(producer_service(name), [
                str(Path(sys.executable).parent / "streamlake"), "produce", "--definition", str(path),
                "--count", "0", "--partitions", "3", "--rate", str(rate), "--quiet",
                "--late-fraction", str(args.late_fraction), "--out-of-order-seconds", str(args.out_of_order_seconds),
                "--malformed-fraction", str(args.malformed_fraction),
                "--duplicate-fraction", str(args.duplicate_fraction)], env=env)
        print(f"Demo producer:     {rate:g} records/s of pipeline {name!r} ({path.name}): "
              f"{args.late_fraction:.0%} late, {args.malformed_fraction:.0%} malformed, "
              f"{args.duplicate_fraction:.0%} duplicated, out of order by up to {args.out_of_order_seconds:g} s "
              f"(log: {config.log_dir() / (producer_service(name) + '.log')})")


def cmd_platform(args) -> int:
    """`make run`: broker, a demo producer per pipeline, Spark cluster, Airflow standalone with the DAGs.

    The Spark cluster starts in a thread of its own beside the Spark Connect server and
    Airflow (each start-up mostly waits on a JVM's or Airflow's imports): the platform is up
    when the slowest is. On a first start Airflow runs no task that starts a Spark application
    before its Spark pool exists, created once the cluster is up and the UI answers (the
    scheduler leaves a task of a pool that does not exist unscheduled); on a restart the pool
    exists already, and a job submitted to a master still starting waits for it (Spark's
    standalone client retries its registration for a minute). The jobs' specs are written
    before Airflow starts, with the master's URL known before it answers."""
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from streamlake.operations.jobs import default_job, definition_files, jobs_dir, save_job
    from streamlake.platform import airflow as airflow_setup, spark_cluster

    pipelines = definition_files()
    if args.lake == "s3":
        start_local_lake(args.s3_port)
    _start_broker_and_producers(args, pipelines)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-cluster") as pool:
        cluster = None
        if not args.no_spark_cluster:
            # two workers, each offering the machine's cores: a job starts on one core, and a
            # rescale's default executor holds two (spark_cluster.machine_cores)
            cluster = pool.submit(spark_cluster.start, workers=2, port=args.spark_port, ui_port=args.spark_ui_port)
            master = spark_cluster.planned_master(args.spark_port)
            for name, path in pipelines.items():
                if not (jobs_dir() / f"{name}.json").exists():  # each pipeline starts on one core of it
                    save_job(replace(default_job(name, path), spark_conn_id="spark_cluster", master=master,
                                     total_executor_cores=1, executor_cores=1))
        airflow_connections, connect_server = _lake_connections(args)
        print("Airflow:           starting (beside the Spark services; half a minute or more on 2 cores)...", flush=True)
        airflow_setup.launch(args.port, cluster_port=args.spark_port, connect_port=args.spark_connect_port,
                             extra_env=airflow_connections)
        if connect_server is not None:
            _await_connect_server(connect_server)
        if cluster is not None:
            started = cluster.result()
            cores = " and ".join(map(str, started["worker_cores"]))
            print(f"Spark cluster:     {started['master']} ({started['alive_workers']} workers of {cores} cores, "
                  f"UI {started['ui']})", flush=True)
    info = airflow_setup.wait_until_ready()
    print(f"Airflow UI:        {info['url']}")
    print(f"Log in:            user {info['user']}, password {info['password']} "
          f"(stored in {airflow_setup.airflow_home() / 'passwords.json'})")
    names = ", ".join(pipelines) or "none (add a definition to pipelines/)"
    print(f"Pipelines:         {names} (pipelines/*.yaml; `streamlake pipeline validate FILE` shows one)")
    print("DAGs:              ingest_<pipeline> (every few minutes), backfill_<pipeline> (hourly and by hand), "
          "savepoint, restore, rescale")
    print("StreamLake menu:   pipelines, late events, data quality, savepoints, consistency checks, operations, "
          "health")
    print(f"Logs:              {config.log_dir()}")
    print("Stop everything:   make stop")
    return 0


def _lake_connections(args) -> tuple[dict[str, str], dict | None]:
    """Start the fork server of the Spark Connect server's clients
    (:mod:`streamlake.platform.fork_server`) and launch that server unless ``--no-spark-connect``
    (idempotent); return the Airflow connections (``AIRFLOW_CONN_*``) the platform defines
    beside the fixed ones, and the server launched (:func:`_await_connect_server` waits for it):
    with the lake on the local S3 server, ``aws_default`` (its account) and a
    ``spark_connect_default`` declaring that the server holds that connection's credentials,
    so the jobs' proofs and backfills go to it (streamlake.platform.spark_connect)."""
    from streamlake.operations.jobs import DEFAULT_STORAGE_CONN_ID
    from streamlake.platform import airflow as airflow_setup, object_store

    connections, store = {}, {}
    if args.lake == "s3":
        connections[f"AIRFLOW_CONN_{DEFAULT_STORAGE_CONN_ID.upper()}"] = object_store.airflow_connection(args.s3_port)
        store = {"store_environment": {k: v for k, v in object_store.local_options(args.s3_port).items()
                                       if k.startswith("AWS_")},
                 "storage_conn_id": DEFAULT_STORAGE_CONN_ID}
    if args.no_spark_connect:
        return connections, None
    from streamlake.platform import fork_server

    forks = fork_server.start()  # first: the Connect server's Python processes are forked by it too
    server = spark_connect.launch(args.spark_connect_port, **store)
    connections[f"AIRFLOW_CONN_{airflow_setup.SPARK_CONNECT_CONN.upper()}"] = \
        spark_connect.connection(args.spark_connect_port, server["storage_conn_id"])
    return connections, {**server, "fork_server": forks}


def _await_connect_server(server: dict) -> None:
    """Wait until the Spark Connect server :func:`_lake_connections` launched answers, then say
    what it and the fork server do. Raises TimeoutError."""
    spark_connect.wait_until_reachable(server["url"])
    forks = server["fork_server"]
    held = f"; it holds the lake's credentials, connection {server['storage_conn_id']}" \
        if server["storage_conn_id"] else ""
    print(f"Spark Connect:     {server['url']} ({server['master']}{held}): the checks after every operation and "
          f"the backfills run on it, no JVM start each")
    print(f"Fork server:       {forks['socket']}: each client of the Spark Connect server, and the Python processes "
          f"of Spark on this machine ({forks['spark_python']}), forked with their libraries (Great Expectations, "
          f"pyspark, pyarrow) already imported, no interpreter start each")
    _name_tables(server["url"])


def _name_tables(url: str) -> None:
    """Give every existing table its SQL name on the Connect server, in a client process of its
    own started in the background (this one starts no Spark session, and the platform's start
    does not wait for it; its output goes to the log); the proofs after each run name new tables."""
    import subprocess
    import sys

    log_path = config.log_dir() / "sql-names.log"
    with open(log_path, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "streamlake.operations.sql_catalog", "--remote", url],
                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"SQL:               <pipeline>.<table> and streamlake.<table> on {url} "
          f"(`streamlake sql \"SHOW TABLES IN sensors\"`; naming the existing tables: {log_path})")


def start_local_lake(port: int) -> None:
    """``make run LAKE=s3``: the local S3 server with the bucket ``lake``, and this process's
    environment (which every service started after inherits) pointing the lake root and the
    platform's tables at it. The server keeps objects in memory: when it starts anew, the
    state that described the previous lake is archived (object_store.archive_for_new_lake).
    Writes ``$STREAMLAKE_HOME/lake.env`` for a shell's CLI."""
    import os

    from streamlake.platform import object_store

    state = object_store.start(port)
    settings = object_store.lake_settings(port)
    object_store.create_bucket(settings["STREAMLAKE_LAKE_ROOT"], object_store.local_options(port))
    if not state["already_running"]:
        archived = object_store.archive_for_new_lake()
        if archived:
            print(f"                   a new local S3 server starts empty (it keeps objects in memory): what "
                  f"described the previous lake moved to {archived}")
    os.environ.update(settings)
    env_file = config.home() / "lake.env"
    env_file.write_text("".join(f"export {k}='{v}'\n" for k, v in
                                {config.ENV_HOME: str(config.home()), **settings}.items()))
    env_file.chmod(0o600)
    print(f"Lake:              {settings['STREAMLAKE_LAKE_ROOT']} on the local S3 server {state['endpoint']} "
          f"(moto, memory only; log {state.get('log')}): every pipeline's tables and the platform's own; "
          f"the CLI on it: source {env_file}")


def cmd_demo(args) -> int:
    """The demo pipeline running continuously without Airflow, with its progress on the terminal."""
    from dataclasses import replace

    from streamlake.operations.jobs import definition_files, load_job
    from streamlake.pipeline.config import config_to_args
    from streamlake.pipeline.driver import format_line, read_progress
    from streamlake.spark.session import job_environment, spark_submit_command

    pipelines = definition_files()
    if DEMO_PIPELINE not in pipelines:
        raise FileNotFoundError(f"no definition of the demo pipeline {DEMO_PIPELINE!r} in the pipelines directory")
    _start_broker_and_producers(args, {DEMO_PIPELINE: pipelines[DEMO_PIPELINE]})
    job = load_job(DEMO_PIPELINE)
    cfg = replace(job.pipeline_config(continuous=True), processing_time_s=args.trigger_seconds,
                  max_offsets_per_trigger=args.max_offsets)
    env = job_environment({config.ENV_BOOTSTRAP: config.bootstrap_servers()})
    if procs.status("pipeline") is None:
        job.control.progress_file.unlink(missing_ok=True)
        procs.start("pipeline", spark_submit_command("pipeline.py", config_to_args(cfg), master=args.master,
                                                     name=f"pipeline:{job.name}"),
                    env=env, info={"control": job.control_dir, "root": job.root})
    print(f"pipeline: Spark {args.master}, {cfg.describe()}")
    print(f"          (log: {config.log_dir() / 'pipeline.log'}); Ctrl-C stops producer and pipeline, "
          "`make stop` stops everything\n")

    stop = {"requested": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(requested=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))
    seen = 0
    started = time.monotonic()
    while not stop["requested"]:
        if procs.status("pipeline") is None:
            print(f"pipeline exited; see {config.log_dir() / 'pipeline.log'}", file=sys.stderr)
            return 1
        lines = read_progress(job.control)
        for line in lines[seen:]:
            print(format_line(line), flush=True)
        seen = len(lines)
        if not seen and time.monotonic() - started > 5:
            print("waiting for the first micro-batch (Spark start-up takes ~15 s)...", flush=True)
            started = float("inf")
        time.sleep(1)
    print("\nstopping the pipeline at micro-batch boundaries and the producer...")
    job.control.request_stop()
    try:
        procs.wait_for(lambda: procs.status("pipeline") is None, timeout=60, what="the pipeline to stop")
    except TimeoutError:
        procs.stop("pipeline")
    procs.stop(producer_service(DEMO_PIPELINE))
    print("stopped; the broker keeps running (`make stop` stops it)")
    return 0


def cmd_stop(args) -> int:
    from concurrent.futures import ThreadPoolExecutor
    from itertools import groupby

    from streamlake.pipeline.control import JobControl
    from streamlake.platform import broker

    running = procs.running_services()
    if not running:
        print("nothing running")
        return 0
    # Airflow first (its tasks run jobs), then jobs and producers, the Spark cluster, Kafka's
    # nodes and the S3 server last; the services of one rank side by side (each JVM takes a
    # second or two to shut down; a Kafka node left without its quorum would not stop at all).
    def rank(name: str) -> int:
        if broker.is_node_service(name):
            return 4
        return {"airflow": 0, "pipeline": 1, "spark-connect": 2, "spark-master": 3, "s3": 4}.get(
            name, 2 if name.startswith("spark-worker") else 1)

    def stop(state) -> str:
        if state.name == "pipeline" and state.info.get("control"):
            JobControl(state.info["control"]).request_stop()
            try:
                procs.wait_for(lambda: procs.status("pipeline") is None, timeout=30, what="the pipeline to stop")
            except TimeoutError:
                pass
        procs.stop(state.name, timeout=broker.STOP_TIMEOUT_S if broker.is_node_service(state.name) else 10.0)
        return f"stopped {state.name} (pid {state.pid})"

    ordered = sorted(running, key=lambda s: rank(s.name))
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _rank, group in groupby(ordered, key=lambda s: rank(s.name)):
            for line in pool.map(stop, list(group)):
                print(line, flush=True)
    broker.stop()  # its run state (the nodes are stopped above; its topics stay)
    return 0


def add_parsers(sub) -> None:
    sc = sub.add_parser("spark", help="Spark standalone cluster on 127.0.0.1: start, stop, status")
    sc.add_argument("action", choices=["start", "stop", "status"])
    sc.add_argument("--workers", type=int, default=2)
    sc.add_argument("--cores-per-worker", type=int,
                    help="cores each worker offers (default: all of the machine's, as Spark's worker)")
    sc.add_argument("--memory", default="2g")
    sc.set_defaults(func=cmd_spark)

    af = sub.add_parser("airflow", help="Airflow standalone with the platform's DAGs: start, stop, status")
    af.add_argument("action", choices=["start", "stop", "status"])
    af.add_argument("--port", type=int, default=8080)
    af.set_defaults(func=cmd_airflow)

    pl = sub.add_parser("platform", help="broker + demo producer + Spark cluster + Airflow (what `make run` runs)")
    pl.add_argument("--port", type=int, default=8080, help="Airflow UI port")
    pl.add_argument("--no-spark-cluster", action="store_true", help="run jobs on local[*] only")
    pl.add_argument("--spark-port", type=int, default=7077, help="Spark master port")
    pl.add_argument("--spark-ui-port", type=int, default=8081, help="Spark master UI port")
    pl.add_argument("--spark-connect-port", type=int, default=spark_connect.DEFAULT_PORT,
                    help="Spark Connect server port (the checks after operations run on it)")
    pl.add_argument("--no-spark-connect", action="store_true",
                    help="no Spark Connect server: every check is a spark-submit of its own")
    pl.add_argument("--lake", choices=["local", "s3"], default="local",
                    help="where the lake is: local (under STREAMLAKE_HOME) or s3 (a local S3 server, "
                         "s3://lake; `make run LAKE=s3`)")
    from streamlake.platform.object_store import DEFAULT_PORT as S3_PORT

    pl.add_argument("--s3-port", type=int, default=S3_PORT, help="port of the local S3 server (--lake s3)")
    _demo_data_arguments(pl, rate=200.0)
    pl.set_defaults(func=cmd_platform)

    d = sub.add_parser("demo", help="broker + producer + the pipeline running continuously, with live progress")
    d.add_argument("--trigger-seconds", type=float, default=5.0)
    d.add_argument("--max-offsets", type=int, default=50_000, help="max records per micro-batch")
    d.add_argument("--master", default="local[2]")
    _demo_data_arguments(d, rate=500.0)
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("stop", help="stop every service the platform started")
    s.set_defaults(func=cmd_stop)


def _demo_data_arguments(parser, rate: float) -> None:
    """The demo producers: rates and how much of the data arrives late, broken or twice."""
    parser.add_argument("--kafka-port", type=int, metavar="P",
                        help=f"the embedded Kafka's first client port (default: as recorded under the home, "
                             f"else {config.DEFAULT_BROKER_PORT}; `streamlake kafka start` for more)")
    parser.add_argument("--rate", type=float, default=rate,
                        help=f"records per second of the demo pipeline ({DEMO_PIPELINE})")
    parser.add_argument("--other-rate", type=float, default=20.0,
                        help="records per second of every other pipeline in pipelines/")
    parser.add_argument("--late-fraction", type=float, default=0.02,
                        help="records behind every aggregate's window and allowed lateness")
    parser.add_argument("--out-of-order-seconds", type=float, default=10.0,
                        help="on-time records out of order by up to this many seconds")
    parser.add_argument("--malformed-fraction", type=float, default=0.01, help="records the pipeline quarantines")
    parser.add_argument("--duplicate-fraction", type=float, default=0.01, help="records sent twice")
