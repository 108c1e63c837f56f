"""The local platform: ``streamlake spark``, ``airflow``, ``platform`` (`make run`), ``demo`` and ``stop``."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from streamlake import config
from streamlake.cli.common import print_json
from streamlake.cli.ingest import ingest_command
from streamlake.platform import procs


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


def _start_broker_and_producer(topic: str, rate: float, kafka_port: int) -> None:
    """The embedded broker and a background demo producer (both idempotent)."""
    from streamlake.platform import broker
    from streamlake.spark.session import job_environment

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
    from streamlake.platform import airflow as airflow_setup

    _start_broker_and_producer(args.topic, args.rate, args.kafka_port)
    if not args.no_spark_cluster:
        from streamlake.platform import spark_cluster
        from streamlake.operations.jobs import DEMO_JOB, demo_job, jobs_dir, save_job

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


def cmd_demo(args) -> int:
    """The demo job running continuously without Airflow, with its progress on the terminal."""
    from dataclasses import replace

    from streamlake.pipeline.ingest import format_progress, progress_file, request_stop
    from streamlake.operations.jobs import DEMO_JOB, load_job
    from streamlake.spark.session import job_environment

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
    from streamlake.pipeline.ingest import request_stop

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


def add_parsers(sub) -> None:
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

    d = sub.add_parser("demo", help="broker + producer + continuous ingest with live progress")
    d.add_argument("--topic", default="sensors")
    d.add_argument("--rate", type=float, default=500.0, help="produced records per second")
    d.add_argument("--trigger-seconds", type=float, default=5.0)
    d.add_argument("--max-offsets", type=int, default=50_000, help="max records per micro-batch")
    d.add_argument("--master", default="local[2]")
    d.add_argument("--port", type=int, default=config.DEFAULT_BROKER_PORT)
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("stop", help="stop every service the platform started")
    s.set_defaults(func=cmd_stop)
