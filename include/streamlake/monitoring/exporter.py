"""Serving :class:`~streamlake.monitoring.collector.PlatformCollector` in Prometheus's text
format over HTTP (prometheus-client's server, one thread per request, one scrape computed
at a time). Nothing runs between scrapes."""

from __future__ import annotations

import errno

from streamlake.errors import StreamLakeError

DEFAULT_PORT = 9464  # OpenTelemetry's Prometheus exporter's port, free of the platform's others
DEFAULT_ADDRESS = "127.0.0.1"


class PortInUseError(StreamLakeError):
    """The exporter's port is taken by another process."""


def registry(collector=None):
    """A registry holding only the platform's collector (no process metrics of this Python)."""
    from prometheus_client import CollectorRegistry

    from streamlake.monitoring.collector import PlatformCollector

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector or PlatformCollector())
    return reg


def render(collector=None) -> bytes:
    """One scrape in the text format (what ``streamlake metrics show`` prints)."""
    from prometheus_client import generate_latest

    return generate_latest(registry(collector))


def serve(port: int = DEFAULT_PORT, address: str = DEFAULT_ADDRESS, collector=None):
    """Start serving ``/metrics`` on ``address:port`` in a background thread; returns
    (server, thread). Raises PortInUseError, naming the port, when it is taken."""
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=address, registry=registry(collector))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {address} is already in use: the metrics exporter cannot serve "
                                 f"there (another `streamlake metrics serve`? `ss -ltnp 'sport = :{port}'` names the "
                                 "process; --port chooses another)") from None
        raise
