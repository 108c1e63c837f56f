"""What the Health view shows: per pipeline, Kafka lag, gold's freshness and bronze's
throughput over the last hour, and the alerts firing now.

The series come from Prometheus's HTTP API when the platform's Prometheus answers (the one
``make run`` started for this ``STREAMLAKE_HOME``; ``STREAMLAKE_PROMETHEUS_URL`` names another). Without one, each
figure is the exporter's current value, computed here as a scrape would
(:class:`streamlake.monitoring.collector.PlatformCollector`): a single point, and no alerts,
since only Prometheus evaluates the rules. :func:`health` says which source it used.
"""

from __future__ import annotations

import html
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

ENV_PROMETHEUS_URL = "STREAMLAKE_PROMETHEUS_URL"
#: The figures, each as Prometheus computes it per pipeline (the rules' own series names).
FIGURES = {
    "lag": ("Kafka lag (records)", "sum by (pipeline) (streamlake_kafka_lag_records)"),
    "freshness": ("gold behind Kafka (s)", "max by (pipeline) (streamlake_freshness_seconds)"),
    "throughput": ("bronze rows/s", 'sum by (pipeline) (rate(streamlake_batch_input_rows_total{stage="bronze"}[5m]))'),
}
WINDOW_S, STEP_S = 3600, 60
TIMEOUT_S = 3.0


@dataclass
class PipelineHealth:
    name: str
    series: dict = field(default_factory=dict)  # figure -> [(epoch s, value)], oldest first


@dataclass
class Health:
    source: str  # "prometheus URL" or "exporter (current values)"
    pipelines: dict  # name -> PipelineHealth
    alerts: list  # firing alerts: {"name", "pipeline", "severity", "summary", "since"}
    error: str | None = None  # why Prometheus was not used, if it was not


def prometheus_url() -> str | None:
    """Where this platform's Prometheus answers: ``STREAMLAKE_PROMETHEUS_URL``, else the one
    ``make run`` started for this ``STREAMLAKE_HOME`` (None: none runs)."""
    from streamlake import procs
    from streamlake.monitoring.services import PROMETHEUS

    if os.environ.get(ENV_PROMETHEUS_URL):
        return os.environ[ENV_PROMETHEUS_URL]
    state = procs.status(PROMETHEUS)
    listen = [a.split("=", 1)[1] for a in (state.cmd if state else []) if a.startswith("--web.listen-address=")]
    return f"http://{listen[0]}" if listen else None


def _get(url: str, path: str, **params) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url.rstrip('/')}{path}{query}", timeout=TIMEOUT_S) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus {path}: {body.get('error') or body}")
    return body["data"]


def from_prometheus(url: str, now: float | None = None) -> Health:
    """The last hour's series and the firing alerts from Prometheus at ``url``. Raises
    OSError (urllib's errors) when it does not answer, RuntimeError when it refuses a query."""
    end = time.time() if now is None else now
    pipelines: dict[str, PipelineHealth] = {}
    for figure, (_title, query) in FIGURES.items():
        data = _get(url, "/api/v1/query_range", query=query, start=end - WINDOW_S, end=end, step=STEP_S)
        for result in data["result"]:
            name = result["metric"].get("pipeline", "")
            pipelines.setdefault(name, PipelineHealth(name)).series[figure] = [
                (float(t), float(v)) for t, v in result["values"]]
    alerts = [{"name": a["labels"].get("alertname", ""), "pipeline": a["labels"].get("pipeline", ""),
               "severity": a["labels"].get("severity", ""),
               "summary": a.get("annotations", {}).get("summary", ""), "since": a.get("activeAt", "")}
              for a in _get(url, "/api/v1/alerts")["alerts"] if a.get("state") == "firing"]
    return Health(f"Prometheus {url}", pipelines, alerts)


def from_exporter(now: float | None = None) -> Health:
    """Each figure's current value, computed as the exporter's scrape computes it; throughput
    is bronze's last micro-batch's input rows over its micro-batches' mean duration (busy
    throughput: Prometheus's figure, a five-minute rate, also counts the idle time)."""
    from streamlake.monitoring.collector import PlatformCollector

    at = time.time() if now is None else now
    values: dict[str, dict[str, float]] = {figure: {} for figure in FIGURES}
    last_rows: dict[str, float] = {}
    durations: dict[str, tuple[float, float]] = {}
    for family in PlatformCollector().collect():
        for sample in family.samples:
            pipeline = sample.labels.get("pipeline")
            if pipeline is None:
                continue
            if sample.name == "streamlake_kafka_lag_records":
                values["lag"][pipeline] = values["lag"].get(pipeline, 0.0) + sample.value
            elif sample.name == "streamlake_freshness_seconds":
                values["freshness"][pipeline] = max(values["freshness"].get(pipeline, 0.0), sample.value)
            elif sample.name == "streamlake_batch_last_input_rows" and sample.labels.get("stage") == "bronze":
                last_rows[pipeline] = sample.value
            elif sample.labels.get("stage") == "bronze" and sample.name in (
                    "streamlake_batch_duration_seconds_sum", "streamlake_batch_duration_seconds_count"):
                total, count = durations.get(pipeline, (0.0, 0.0))
                durations[pipeline] = (total + sample.value, count) if sample.name.endswith("_sum") \
                    else (total, count + sample.value)
    for pipeline, rows in last_rows.items():
        total, count = durations.get(pipeline, (0.0, 0.0))
        if count and total:
            values["throughput"][pipeline] = rows / (total / count)
    pipelines: dict[str, PipelineHealth] = {}
    for figure, by_pipeline in values.items():
        for pipeline, value in by_pipeline.items():
            pipelines.setdefault(pipeline, PipelineHealth(pipeline)).series[figure] = [(at, value)]
    return Health("exporter (current values; Prometheus keeps the history and evaluates the alerts)",
                  pipelines, [])


def health(url: str | None = None) -> Health:
    """From Prometheus when one runs for this platform and answers, else from the exporter's
    current values (why, in ``error``)."""
    url = url or prometheus_url()
    if url is None:
        fallback = from_exporter()
        fallback.error = "no Prometheus runs for this platform"
        return fallback
    try:
        return from_prometheus(url)
    except (OSError, RuntimeError, ValueError) as exc:
        fallback = from_exporter()
        fallback.error = f"Prometheus at {url} did not answer ({exc})"
        return fallback


def _compact(value: float) -> str:
    """A value in at most five characters for an axis label (22,540 -> 22.5k)."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def series_svg(points: list[tuple[float, float]], title: str, width: int = 420, height: int = 140) -> str:
    """A line plot of ``points`` (epoch seconds, value) as an inline ``<svg>``; a single point
    is drawn as a dot with its value. Every point has a ``<title>`` shown on hover."""
    esc = html.escape
    left, right, top, bottom = 52, 10, 20, 22
    w, h = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="series" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
           '<style>text{font:11px system-ui,sans-serif;fill:#44505c}.axis{stroke:#9aa5b1}'
           '.line{fill:none;stroke:#1a73e8;stroke-width:1.5}.dot{fill:#1a73e8}</style>',
           f'<text x="{left}" y="13" style="font-weight:600">{esc(title)}</text>',
           f'<line class="axis" x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}"/>']
    if not points:
        out.append(f'<text x="{left + 8}" y="{top + h / 2}">no data</text></svg>')
        return "".join(out)
    t0, t1 = points[0][0], points[-1][0]
    top_value = max(max(v for _, v in points), 1e-9)
    x = (lambda t: left + (w * (t - t0) / (t1 - t0) if t1 > t0 else w))  # noqa: E731
    y = (lambda v: top + h - h * v / top_value)  # noqa: E731
    out.append(f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_compact(top_value)}</text>'
               f'<text x="{left - 4}" y="{top + h}" text-anchor="end">0</text>')
    if len(points) > 1:
        out.append('<polyline class="line" points="' + " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points) + '"/>')
        out.append(f'<text x="{left}" y="{height - 6}">{time.strftime("%H:%M", time.gmtime(t0))} UTC</text>'
                   f'<text x="{left + w}" y="{height - 6}" text-anchor="end">'
                   f'{time.strftime("%H:%M", time.gmtime(t1))} UTC</text>')
    for t, v in points if len(points) <= 120 else points[-1:]:
        out.append(f'<circle class="dot" cx="{x(t):.1f}" cy="{y(v):.1f}" r="{2 if len(points) > 1 else 4}">'
                   f'<title>{time.strftime("%H:%M:%S", time.gmtime(t))} UTC: {v:.4g}</title></circle>')
    if len(points) == 1:
        out.append(f'<text x="{left + w - 8}" y="{y(points[0][1]) - 8:.1f}" text-anchor="end">'
                   f'now: {points[0][1]:.4g}</text>')
    return "".join(out) + "</svg>"
