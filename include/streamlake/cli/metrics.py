"""``streamlake metrics serve [--port 9464] [--address 127.0.0.1]``, ``start``/``stop`` (the exporter and
Prometheus as services: `make run`, `make stop`) and ``streamlake metrics show``:
the platform's metrics for Prometheus (:mod:`streamlake.monitoring`). Every value is computed
on each scrape from the Delta logs, the platform's tables, Kafka's end offsets and the job
specs; ``show`` prints one scrape and how long it took."""

from __future__ import annotations

import logging
import sys


def _quiet_kafka_client() -> None:
    """librdkafka logs every refused connection; an unreachable Kafka is already one
    ``streamlake_scrape_errors`` series and one warning per scrape."""
    logging.getLogger("streamlake.librdkafka").setLevel(logging.CRITICAL)


def cmd_serve(args) -> int:
    import signal
    import threading

    from streamlake.monitoring.exporter import serve

    _quiet_kafka_client()
    server, _thread = serve(args.port, args.address)
    print(f"streamlake metrics on http://{args.address}:{args.port}/metrics", file=sys.stderr, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


def cmd_show(args) -> int:
    import time

    from streamlake.monitoring.collector import PlatformCollector
    from streamlake.monitoring.exporter import render

    _quiet_kafka_client()
    started = time.monotonic()
    text = render(PlatformCollector(jobs=(lambda: args.job) if args.job else None))
    sys.stdout.write(text.decode())
    print(f"one scrape: {time.monotonic() - started:.3f} s", file=sys.stderr)
    return 0


def cmd_start(args) -> int:
    from streamlake.monitoring import services

    up, missing = services.start(args.port, args.prometheus_port)
    for line in up + missing:
        print(line, flush=True)
    if missing:
        print("Monitoring:        the rest of the platform runs without what is missing above "
              "(`streamlake metrics start` again once it is fixed)", flush=True)
    return 1 if missing else 0


def cmd_stop(args) -> int:
    from streamlake.monitoring import services

    stopped = services.stop()
    print("stopped: " + (", ".join(stopped) or "nothing was running"))
    return 0


def add_parsers(sub) -> None:
    from streamlake.monitoring.exporter import DEFAULT_ADDRESS, DEFAULT_PORT

    p = sub.add_parser("metrics", help="the platform's metrics for Prometheus")
    msub = p.add_subparsers(dest="metrics_command", required=True)
    s = msub.add_parser("serve", help="serve /metrics (Prometheus text format) until stopped")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    s.add_argument("--address", default=DEFAULT_ADDRESS, help=f"address to bind (default {DEFAULT_ADDRESS})")
    s.set_defaults(func=cmd_serve)
    s = msub.add_parser("start", help="start the exporter and Prometheus as platform services (make run; make stop "
                                      "stops them)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the exporter's port (default {DEFAULT_PORT})")
    s.add_argument("--prometheus-port", type=int, default=9090, help="Prometheus's port (default 9090)")
    s.set_defaults(func=cmd_start)
    s = msub.add_parser("stop", help="stop the exporter and Prometheus")
    s.set_defaults(func=cmd_stop)
    s = msub.add_parser("show", help="print one scrape and, on stderr, the time it took")
    s.add_argument("--job", action="append", help="only this job (repeatable; default every job)")
    s.set_defaults(func=cmd_show)
