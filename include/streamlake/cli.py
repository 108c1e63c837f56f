"""``streamlake``: the platform's command line.

    streamlake kafka start|stop|status     embedded Kafka-protocol broker
    streamlake produce --topic T --count N demo sensor readings
    streamlake ingest --topic T --table D --checkpoint C [--available-now | --processing-time S]
    streamlake audit --topic T --table D   exactly-once proof (exit 0 only if clean)
    streamlake vacuum --table D            delete files of aborted commit attempts
    streamlake job list|show|define|status|run|stop NAME
    streamlake savepoint create|list|show|dispose|restore
    streamlake check --job NAME            consistency check (recorded); --list for history
    streamlake spark start|stop|status     Spark standalone cluster on 127.0.0.1
    streamlake airflow start|stop|status   Airflow standalone with the DAGs
    streamlake platform                    broker + producer + Airflow (`make run`)
    streamlake demo                        broker + producer + continuous ingest, no Airflow
    streamlake stop                        stop every service the platform started

Exit status: 0 success, 1 failure, 2 bad input or a platform error (the message
says which), 3 audit found a violation, 128+N job killed by signal N.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamlake import config, procs
from streamlake.errors import StreamLakeError


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


# -- kafka ------------------------------------------------------------------------------------

def cmd_kafka(args) -> int:
    from streamlake.kafka import broker

    if args.action == "start":
        state = broker.start(args.port)
        word = "already running" if state.pop("already_running") else "started"
        print(f"embedded Kafka broker {word} at {state['bootstrap']} (pid {state['pid']})")
        if os.environ.get(config.ENV_BOOTSTRAP) and os.environ[config.ENV_BOOTSTRAP] != state["bootstrap"]:
            print(f"note: {config.ENV_BOOTSTRAP}={os.environ[config.ENV_BOOTSTRAP]} overrides it for clients")
        return 0
    if args.action == "stop":
        print("embedded Kafka broker stopped" if broker.stop() else "embedded Kafka broker was not running")
        return 0
    state = broker.status()
    state["clients_use"] = config.bootstrap_servers()
    _print_json(state)
    return 0 if state["running"] else 1


# -- produce ----------------------------------------------------------------------------------

def cmd_produce(args) -> int:
    from streamlake.kafka.producer import produce_sensor_readings, summary_dict

    stop = {"requested": False}

    def on_signal(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    summary = produce_sensor_readings(
        args.topic, args.count, partitions=args.partitions, rate=args.rate, value_bytes=args.value_bytes,
        seed=args.seed, options=_kafka_options(args.kafka_option), progress=not args.quiet,
        should_stop=lambda: stop["requested"],
    )
    _print_json(summary_dict(summary))
    return 0


def _kafka_options(items) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise StreamLakeError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        out[key.removeprefix("kafka.")] = value
    return out


# -- ingest -----------------------------------------------------------------------------------

def ingest_command(cfg, master: str, conf: dict | None = None) -> list[str]:
    from streamlake.ingest import config_to_args
    from streamlake.spark import spark_submit_command

    return spark_submit_command("ingest_bronze.py", config_to_args(cfg), master=master, conf=conf,
                                name=f"ingest_bronze:{cfg.query_name}")


def run_job_foreground(cmd: list[str], checkpoint: str, env: dict | None = None) -> int:
    """Run a spark-submit job in its own process group; Ctrl-C/SIGTERM ask it to stop
    at a micro-batch boundary (second signal: kill it). Returns its exit status."""
    from streamlake.ingest import request_stop
    from streamlake.spark import job_environment

    proc = subprocess.Popen(cmd, env=job_environment(env), start_new_session=True)
    signals = {"count": 0}

    def on_signal(signum, _frame):
        signals["count"] += 1
        if signals["count"] == 1:
            print("\nstopping at the next micro-batch boundary (again to kill)...", file=sys.stderr)
            request_stop(checkpoint)
        else:
            procs.kill_tree(proc.pid, proc.pid, timeout=5)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        procs.kill_tree(proc.pid, proc.pid, timeout=5)  # leftovers of a killed driver
    if code < 0:
        print(f"ingest job killed by signal {-code}", file=sys.stderr)
        return 128 - code
    return code


def cmd_ingest(args) -> int:
    from streamlake.ingest import config_from_args

    cfg = config_from_args(args)
    return run_job_foreground(ingest_command(cfg, args.master), cfg.checkpoint)


# -- audit ------------------------------------------------------------------------------------

def cmd_audit(args) -> int:
    from streamlake.audit import audit_offsets

    topics = [t.strip() for t in args.topic.split(",") if t.strip()]
    report = audit_offsets(args.table, topics, _kafka_options(args.kafka_option), version=args.version)
    _print_json(report.to_dict() if args.verbose else {
        k: v for k, v in report.to_dict().items() if k != "partitions"
    } | {"violations": [p for p in report.to_dict()["partitions"] if not p["exactly_once"]]})
    print(report.summary(), file=sys.stderr)
    return 0 if report.exactly_once else 3


def cmd_vacuum(args) -> int:
    from streamlake.delta.table import vacuum_table

    files = vacuum_table(args.table, retention_hours=args.retention_hours, dry_run=args.dry_run)
    _print_json({"table": args.table, "dry_run": args.dry_run, "files": files})
    print(f"{'would delete' if args.dry_run else 'deleted'} {len(files)} files", file=sys.stderr)
    return 0


# -- jobs, savepoints, checks --------------------------------------------------------------

def cmd_job(args) -> int:
    from dataclasses import replace

    from streamlake.jobs import JobSpec, list_jobs, load_job, save_job

    if args.action == "list":
        _print_json(list_jobs())
    elif args.action == "show":
        _print_json(load_job(args.name).to_dict())
    elif args.action == "define":
        from streamlake import config

        data = config.home() / "data"
        try:
            spec = load_job(args.name)
        except KeyError:
            spec = JobSpec(name=args.name, topics=[args.topic or args.name], table=str(data / "bronze" / args.name),
                           checkpoint=str(data / "checkpoints" / args.name))
        changes = {k: v for k, v in {
            "topics": [t for t in (args.topic or "").split(",") if t] or None, "table": args.table,
            "checkpoint": args.checkpoint, "max_offsets_per_trigger": args.max_offsets_per_trigger,
            "min_partitions": args.min_partitions, "processing_time_s": args.processing_time,
            "master": args.master, "spark_conn_id": args.spark_conn_id,
            "total_executor_cores": args.total_executor_cores, "executor_cores": args.executor_cores,
        }.items() if v is not None}
        _print_json(save_job(replace(spec, **changes)).to_dict())
    elif args.action == "status":
        from streamlake.control import JobControl

        job = load_job(args.name)
        control = JobControl(job.checkpoint)
        _print_json({"job": job.name, "running": control.is_running(), **control.read_state()})
    elif args.action == "stop":
        from streamlake.control import JobControl

        control = JobControl(load_job(args.name).checkpoint)
        if not control.is_running():
            print(f"job {args.name} is not running")
            return 0
        control.request_stop()
        control.wait_stopped(args.timeout)
        print(f"job {args.name} stopped at a micro-batch boundary")
    elif args.action == "run":
        from streamlake.runner import run_supervised, submit_with_subprocess
        from streamlake.supervisor import RestartStrategy

        job = load_job(args.name)
        strategy = RestartStrategy(args.restart_strategy, attempts=args.restart_attempts,
                                   delay_s=args.restart_delay, max_failures=args.max_failures,
                                   interval_s=args.failure_interval)
        result = run_supervised(job, strategy, submit_with_subprocess(job, args.master or job.master))
        _print_json(result.__dict__)
    return 0


def cmd_savepoint(args) -> int:
    from streamlake import savepoints

    if args.action == "create":
        from streamlake.jobs import load_job

        manifest = savepoints.create_savepoint(load_job(args.job), stop=args.stop, note=args.note or "")
        print(manifest.id)
        print(f"savepoint {manifest.id} of job {manifest.job}: table version {manifest.tables[0].version}, "
              f"offsets {manifest.kafka_offsets}{'; job stopped' if args.stop else ''}", file=sys.stderr)
    elif args.action == "list":
        _print_json([{"id": m.id, "job": m.job, "created_at": m.created_at,
                      "versions": {t.name: t.version for t in m.tables}, "offsets": m.kafka_offsets}
                     for m in savepoints.list_savepoints(args.job)])
    elif args.action == "show":
        _print_json(savepoints.load_savepoint(args.id).to_dict())
    elif args.action == "dispose":
        savepoints.dispose_savepoint(args.id)
        print(f"savepoint {args.id} disposed")
    elif args.action == "restore":
        result = savepoints.restore_savepoint(args.id)
        _print_json(result)
        print(f"restored; start the job again (e.g. `streamlake job run {result['job']}` or the "
              f"streaming_ingest DAG)", file=sys.stderr)
    return 0


def cmd_check(args) -> int:
    from streamlake.consistency import check_consistency, recent_checks
    from streamlake.jobs import load_job

    if args.list:
        _print_json(recent_checks(args.limit, args.job))
        return 0
    result = check_consistency(load_job(args.job), args.operation)
    _print_json(result.to_dict())
    print(result.summary, file=sys.stderr)
    return 0 if result.passed else 3


def cmd_spark(args) -> int:
    from streamlake import spark_cluster

    if args.action == "start":
        _print_json(spark_cluster.start(args.workers, args.cores_per_worker, args.memory))
    elif args.action == "stop":
        print("stopped: " + (", ".join(spark_cluster.stop()) or "nothing was running"))
    else:
        state = spark_cluster.status()
        _print_json(state)
        return 0 if state["running"] else 1
    return 0


def cmd_airflow(args) -> int:
    from streamlake import airflow_setup

    if args.action == "start":
        info = airflow_setup.start(args.port)
        print(f"Airflow UI: {info['url']}  (user {info['user']}, password {info['password']})")
    elif args.action == "stop":
        print("Airflow stopped" if airflow_setup.stop() else "Airflow was not running")
    else:
        running = procs.status(airflow_setup.SERVICE) is not None
        _print_json({"running": running, "ui_ready": airflow_setup.ui_ready(args.port), "home": str(airflow_setup.airflow_home())})
        return 0 if running else 1
    return 0


def _start_broker_and_producer(topic: str, rate: float, kafka_port: int) -> None:
    """The embedded broker and a background demo producer (both idempotent)."""
    from streamlake.kafka import broker
    from streamlake.spark import job_environment

    state = broker.start(kafka_port)
    print(f"Kafka (embedded):  {state['bootstrap']}")
    if procs.status("producer") is None:
        env = job_environment({config.ENV_BOOTSTRAP: config.bootstrap_servers()})
        procs.start("producer", [str(Path(sys.executable).parent / "streamlake"), "produce", "--topic", topic,
                                 "--count", "0", "--partitions", "3", "--rate", str(rate), "--quiet"], env=env)
    print(f"Demo producer:     {rate:g} sensor readings/s into topic {topic!r} "
          f"(log: {config.log_dir() / 'producer.log'})")


def cmd_platform(args) -> int:
    """`make run`: broker, demo producer, Spark cluster, Airflow standalone with the DAGs."""
    from streamlake import airflow_setup

    _start_broker_and_producer(args.topic, args.rate, args.kafka_port)
    if not args.no_spark_cluster:
        from streamlake import spark_cluster
        from streamlake.jobs import DEMO_JOB, demo_job, jobs_dir, save_job

        cluster = spark_cluster.start(workers=2, cores_per_worker=1)
        print(f"Spark cluster:     {cluster['master']} ({cluster['alive_workers']} workers, UI {cluster['ui']})")
        if not (jobs_dir() / f"{DEMO_JOB}.json").exists():  # the demo job starts on one core of it
            from dataclasses import replace

            save_job(replace(demo_job(), spark_conn_id="spark_cluster", master=cluster["master"],
                             total_executor_cores=1, executor_cores=1))
    print("Airflow:           starting (about a minute on 2 cores)...", flush=True)
    info = airflow_setup.start(args.port)
    print(f"Airflow UI:        {info['url']}")
    print(f"Log in:            user {info['user']}, password {info['password']} "
          f"(stored in {airflow_setup.airflow_home() / 'passwords.json'})")
    print("DAGs:              streaming_ingest (every 5 minutes), savepoint, restore, rescale; "
          "StreamLake menu: savepoints, consistency checks")
    print(f"Logs:              {config.log_dir()}")
    print("Stop everything:   make stop")
    return 0


# -- demo / stop ------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    """The demo job running continuously without Airflow, with its progress on the terminal."""
    from dataclasses import replace

    from streamlake.ingest import format_progress, progress_file, request_stop
    from streamlake.jobs import DEMO_JOB, load_job
    from streamlake.spark import job_environment

    _start_broker_and_producer(args.topic, args.rate, args.port)
    job = load_job(DEMO_JOB)
    cfg = replace(job.ingest_config(continuous=True), topics=(args.topic,),
                  processing_time_s=args.trigger_seconds, max_offsets_per_trigger=args.max_offsets)
    env = job_environment({config.ENV_BOOTSTRAP: config.bootstrap_servers()})
    if procs.status("ingest") is None:
        progress_file(cfg.checkpoint).unlink(missing_ok=True)
        procs.start("ingest", ingest_command(cfg, args.master), env=env,
                    info={"checkpoint": cfg.checkpoint, "table": cfg.table})
    print(f"ingest: Spark {args.master}, micro-batch every {args.trigger_seconds:g}s -> Delta table {cfg.table}")
    print(f"        (log: {config.log_dir() / 'ingest.log'}); Ctrl-C stops producer and ingest, "
          "`make stop` stops everything\n")

    stop = {"requested": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(requested=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))
    seen = 0
    started = time.monotonic()
    while not stop["requested"]:
        if procs.status("ingest") is None:
            print(f"ingest job exited; see {config.log_dir() / 'ingest.log'}", file=sys.stderr)
            return 1
        lines = progress_file(cfg.checkpoint).read_text().splitlines() if progress_file(cfg.checkpoint).exists() else []
        for line in lines[seen:]:
            print(format_progress(json.loads(line)), flush=True)
        seen = len(lines)
        if not seen and time.monotonic() - started > 5:
            print("waiting for the first micro-batch (Spark start-up takes ~15 s)...", flush=True)
            started = float("inf")
        time.sleep(1)
    print("\nstopping ingest at a micro-batch boundary and the producer...")
    request_stop(cfg.checkpoint)
    try:
        procs.wait_for(lambda: procs.status("ingest") is None, timeout=60, what="the ingest job to stop")
    except TimeoutError:
        procs.stop("ingest")
    procs.stop("producer")
    print("stopped; the broker keeps running (`make stop` stops it)")
    return 0


def cmd_stop(args) -> int:
    from streamlake.ingest import request_stop

    running = procs.running_services()
    if not running:
        print("nothing running")
        return 0
    # Airflow first (its tasks run jobs), then jobs and producer, the Spark cluster, Kafka last.
    def rank(name: str) -> int:
        return {"airflow": 0, "ingest": 1, "producer": 1, "spark-master": 3, "kafka": 4}.get(
            name, 2 if name.startswith("spark-worker") else 1)

    for state in sorted(running, key=lambda s: rank(s.name)):
        if state.name == "ingest" and state.info.get("checkpoint"):
            request_stop(state.info["checkpoint"])
            try:
                procs.wait_for(lambda: procs.status("ingest") is None, timeout=30, what="ingest to stop")
            except TimeoutError:
                pass
        procs.stop(state.name)
        print(f"stopped {state.name} (pid {state.pid})")
    return 0


# -- parser -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from streamlake.ingest import add_ingest_arguments

    parser = argparse.ArgumentParser(prog="streamlake", description="Exactly-once Kafka -> Delta on Spark.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True)

    k = sub.add_parser("kafka", help="embedded Kafka-protocol broker (dev/test)")
    k.add_argument("action", choices=["start", "stop", "status"])
    k.add_argument("--port", type=int, default=config.DEFAULT_BROKER_PORT)
    k.set_defaults(func=cmd_kafka)

    p = sub.add_parser("produce", help="produce sensor readings")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, required=True, help="records to produce (0: until stopped)")
    p.add_argument("--partitions", type=int, default=3, help="partitions when the topic is created")
    p.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    p.add_argument("--value-bytes", type=int, default=256, help="approximate value size")
    p.add_argument("--seed", type=int, help="random seed (same seed, same records)")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_produce)

    i = sub.add_parser("ingest", help="run the bronze ingest job (spark-submit)")
    add_ingest_arguments(i)
    i.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    i.set_defaults(func=cmd_ingest)

    a = sub.add_parser("audit", help="check that the table holds its Kafka range exactly once")
    a.add_argument("--topic", required=True, help="topic(s), comma-separated")
    a.add_argument("--table", required=True)
    a.add_argument("--version", type=int, help="audit this Delta version (default latest)")
    a.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    a.set_defaults(func=cmd_audit)

    v = sub.add_parser("vacuum", help="delete files no snapshot references (aborted commit attempts, old files)")
    v.add_argument("--table", required=True)
    v.add_argument("--retention-hours", type=int, default=168,
                   help="keep files referenced in the last N hours (default 168); 0 only when no writer runs")
    v.add_argument("--dry-run", action="store_true", help="list, do not delete")
    v.set_defaults(func=cmd_vacuum)

    d = sub.add_parser("demo", help="broker + producer + continuous ingest with live progress")
    d.add_argument("--topic", default="sensors")
    d.add_argument("--rate", type=float, default=500.0, help="produced records per second")
    d.add_argument("--trigger-seconds", type=float, default=5.0)
    d.add_argument("--max-offsets", type=int, default=50_000, help="max records per micro-batch")
    d.add_argument("--master", default="local[2]")
    d.add_argument("--port", type=int, default=config.DEFAULT_BROKER_PORT)
    d.set_defaults(func=cmd_demo)

    j = sub.add_parser("job", help="named jobs: list, show, define, status, run (supervised), stop")
    j.add_argument("action", choices=["list", "show", "define", "status", "run", "stop"])
    j.add_argument("name", nargs="?", default="bronze_sensors")
    j.add_argument("--topic", help="define: topic(s), comma-separated")
    j.add_argument("--table", help="define: bronze table directory")
    j.add_argument("--checkpoint", help="define: checkpoint directory")
    j.add_argument("--max-offsets-per-trigger", type=int)
    j.add_argument("--min-partitions", type=int)
    j.add_argument("--processing-time", type=float, help="define: trigger interval when continuous")
    j.add_argument("--master", help="Spark master for `run` (default: the job's)")
    j.add_argument("--spark-conn-id", help="define: Airflow connection of the Spark master")
    j.add_argument("--total-executor-cores", type=int)
    j.add_argument("--executor-cores", type=int)
    j.add_argument("--restart-strategy", default="fixed-delay", choices=["fixed-delay", "failure-rate", "none"])
    j.add_argument("--restart-attempts", type=int, default=3)
    j.add_argument("--restart-delay", type=float, default=10.0)
    j.add_argument("--max-failures", type=int, default=3)
    j.add_argument("--failure-interval", type=float, default=300.0)
    j.add_argument("--timeout", type=float, default=120.0, help="stop: seconds to wait")
    j.set_defaults(func=cmd_job)

    sp = sub.add_parser("savepoint", help="savepoints: create, list, show, dispose, restore")
    sp.add_argument("action", choices=["create", "list", "show", "dispose", "restore"])
    sp.add_argument("id", nargs="?", help="savepoint id (show, dispose, restore)")
    sp.add_argument("--job", default=None, help="job (create: default bronze_sensors; list: filter)")
    sp.add_argument("--stop", action="store_true", help="create: stop the job after the savepoint")
    sp.add_argument("--note")
    sp.set_defaults(func=cmd_savepoint)

    c = sub.add_parser("check", help="consistency check of a job's table (recorded), or --list past checks")
    c.add_argument("--job", default="bronze_sensors")
    c.add_argument("--operation", default="manual")
    c.add_argument("--list", action="store_true")
    c.add_argument("--limit", type=int, default=20)
    c.set_defaults(func=cmd_check)

    sc = sub.add_parser("spark", help="Spark standalone cluster on 127.0.0.1: start, stop, status")
    sc.add_argument("action", choices=["start", "stop", "status"])
    sc.add_argument("--workers", type=int, default=2)
    sc.add_argument("--cores-per-worker", type=int, default=1)
    sc.add_argument("--memory", default="2g")
    sc.set_defaults(func=cmd_spark)

    af = sub.add_parser("airflow", help="Airflow standalone with the platform's DAGs: start, stop, status")
    af.add_argument("action", choices=["start", "stop", "status"])
    af.add_argument("--port", type=int, default=8080)
    af.set_defaults(func=cmd_airflow)

    pl = sub.add_parser("platform", help="broker + demo producer + Airflow (what `make run` runs)")
    pl.add_argument("--topic", default="sensors")
    pl.add_argument("--rate", type=float, default=200.0)
    pl.add_argument("--port", type=int, default=8080)
    pl.add_argument("--kafka-port", type=int, default=config.DEFAULT_BROKER_PORT)
    pl.add_argument("--no-spark-cluster", action="store_true", help="run jobs on local[*] only")
    pl.set_defaults(func=cmd_platform)

    s = sub.add_parser("stop", help="stop every service the platform started")
    s.set_defaults(func=cmd_stop)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        code = args.func(args)
    except BrokenPipeError:  # output piped into `head` etc.
        code = 0
    except StreamLakeError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 2
    except (FileNotFoundError, RuntimeError, TimeoutError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # deltalake/pyarrow native threads can abort the interpreter during shutdown
    # (delta-rs#2184); everything is flushed, so leave without running it.
    os._exit(code)
