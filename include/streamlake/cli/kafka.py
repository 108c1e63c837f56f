"""``streamlake kafka`` (the embedded Apache Kafka cluster) and ``streamlake produce`` (demo and test data of a definition)."""

from __future__ import annotations

import os
import signal

from streamlake import config
from streamlake.cli.common import kafka_options, print_json


def cmd_kafka(args) -> int:
    from streamlake.platform import broker

    if args.action == "start":
        port, brokers = args.port, args.brokers
        if args.reset:
            previous = _reset(broker)
            if previous:  # an empty cluster of the same layout unless told otherwise
                port = port or previous["nodes"][0]["port"]
                brokers = brokers or len(previous["nodes"])
        state = broker.start(port, brokers)
        word = "already running" if state.pop("already_running") else "started"
        nodes = state["brokers"]
        pids = ", ".join(str(b["pid"]) for b in nodes)
        what = "1 node" if len(nodes) == 1 else f"{len(nodes)} nodes"
        print(f"Apache Kafka {state['kafka']} ({what}, KRaft) {word} at {state['bootstrap']} (pid {pids}; "
              f"data {state['data']})")
        if os.environ.get(config.ENV_BOOTSTRAP) and os.environ[config.ENV_BOOTSTRAP] != state["bootstrap"]:
            print(f"note: {config.ENV_BOOTSTRAP}={os.environ[config.ENV_BOOTSTRAP]} overrides it for clients")
        return 0
    if args.reset:
        raise RuntimeError("--reset goes with start")
    if args.action == "stop":
        print("embedded Kafka stopped (its topics stay)" if broker.stop() else "embedded Kafka was not running")
        return 0
    state = broker.status()
    state["clients_use"] = config.bootstrap_servers()
    print_json(state)
    return 0 if state["running"] else 1


def _reset(broker) -> dict | None:
    """``kafka start --reset``: say what goes, then delete it; returns the deleted cluster's record."""
    if any(b["running"] for b in broker.status(probe=False)["brokers"]):
        raise RuntimeError("Kafka is running: stop it first (`streamlake kafka stop`), then start with --reset")
    try:
        record = broker.load_record()
    except RuntimeError:
        record = None
    if not broker.kafka_dir().exists():
        print(f"--reset: no Kafka data under {broker.kafka_dir()}: nothing to delete")
        return None
    what = f"cluster {record['cluster_id']}, {len(record['nodes'])} node(s)" if record else "no cluster record"
    print(f"--reset: deleting the embedded Kafka's data ({what}: every topic and offset) under {broker.kafka_dir()}; "
          f"tables and checkpoints written from those topics now refer to offsets no topic holds")
    broker.reset()
    return record


def cmd_produce(args) -> int:
    import sys

    from streamlake.kafka.producer import produce_records, summary_dict
    from streamlake.operations.jobs import DEMO_JOB, pipelines_dir
    from streamlake.pipeline.definition import load_definition

    definition_file = args.definition
    if definition_file is None:  # the earlier CLI's produce had no --definition: the demo's records
        definition_file = pipelines_dir() / f"{DEMO_JOB}.yaml"
        print(f"produce: no --definition given: records of the demo pipeline, {definition_file}", file=sys.stderr)
    stop = {"requested": False}

    def on_signal(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    summary = produce_records(
        load_definition(definition_file), args.topic, args.count, partitions=args.partitions, rate=args.rate, value_bytes=args.value_bytes,
        seed=args.seed, options=kafka_options(args.kafka_option), progress=not args.quiet,
        should_stop=lambda: stop["requested"], late_fraction=args.late_fraction,
        out_of_order_seconds=args.out_of_order_seconds, malformed_fraction=args.malformed_fraction,
        duplicate_fraction=args.duplicate_fraction, one_per_batch=args.one_per_batch, manifest_path=args.manifest,
    )
    print_json(summary_dict(summary))
    return 0


def add_parsers(sub) -> None:
    k = sub.add_parser("kafka", help="the embedded Apache Kafka cluster (KRaft, dev/test): start, stop, status")
    k.add_argument("action", choices=["start", "stop", "status"])
    k.add_argument("--port", type=int, metavar="P",
                   help=f"first client port (default: the cluster's recorded port, else {config.DEFAULT_BROKER_PORT}); "
                        f"node i (0-based) of N serves clients on P+i, its controller on P+N+i")
    k.add_argument("--brokers", type=int, metavar="N",
                   help="nodes, each a broker and a KRaft controller (default: as recorded, else 1); "
                        "with 3: replication factor 3 and min.insync.replicas 2")
    k.add_argument("--reset", action="store_true",
                   help="start: first delete this home's Kafka data (every topic) and start an empty cluster")
    k.set_defaults(func=cmd_kafka)

    p = sub.add_parser("produce", help="produce labelled records of a pipeline definition (demo and test data)")
    p.add_argument("--definition", metavar="FILE",
                   help="the pipeline whose records to make, e.g. pipelines/orders.yaml (its datagen hints; "
                        "default: the demo pipeline, pipelines/sensors.yaml)")
    p.add_argument("--topic", help="topic to write (default: the definition's first topic)")
    p.add_argument("--count", type=int, required=True, help="records to produce (0: until stopped)")
    p.add_argument("--partitions", type=int, default=3, help="partitions when the topic is created")
    p.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    p.add_argument("--value-bytes", type=int, help="pad every value to about this size (default: no padding)")
    p.add_argument("--seed", type=int, help="random seed (same seed, same records)")
    p.add_argument("--late-fraction", type=float, default=0.0, metavar="F",
                   help="share of late events: event times behind every aggregate's window and lateness "
                        "(default 0)")
    p.add_argument("--out-of-order-seconds", type=float, default=0.0, metavar="S",
                   help="on-time events get event time now - uniform(0, S), 0..60 (default 0: in order)")
    p.add_argument("--malformed-fraction", type=float, default=0.0, metavar="M",
                   help="share of records the pipeline must quarantine, spread over every reason code, rules "
                        "with a datagen.violations entry included (default 0)")
    p.add_argument("--duplicate-fraction", type=float, default=0.0, metavar="D",
                   help="share of exact re-sends of a recent valid record (default 0); "
                        "late + malformed + duplicate <= 1")
    p.add_argument("--one-per-batch", action="store_true",
                   help="every record its own record batch (batch.num.messages=1, linger.ms=0), "
                        "as a real-time producer writes")
    p.add_argument("--manifest", metavar="PATH",
                   help="write a JSON line per record: partition, offset, kind, reason, event_id, ...")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_produce)
