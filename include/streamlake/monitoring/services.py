"""The exporter and a Prometheus server as services of the local platform (`make run` starts
them after the rest, `make stop` stops them with the rest: :mod:`streamlake.procs`).

Prometheus is Debian's package that `make setup` unpacks into ``.venv/prometheus``
(scripts/setup.sh). Its configuration is ``monitoring/prometheus.yml`` with the exporter's
address and the rules' absolute paths filled in, written to ``$STREAMLAKE_HOME/prometheus/``
beside its data (``data/``). A port already in use or a server that does not start is one
line of :func:`start`'s answer; whatever else can start, starts.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

from streamlake import config

EXPORTER = "metrics-exporter"
PROMETHEUS = "prometheus"
PROMETHEUS_PORT = 9090
ADDRESS = "127.0.0.1"


def monitoring_dir() -> Path:
    return config.project_root() / "monitoring"


def prometheus_binary() -> Path:
    return config.project_root() / ".venv" / "prometheus" / "usr" / "bin" / "prometheus"


def _port_taken(port: int, address: str = ADDRESS) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return True
    return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _listening(port: int, address: str = ADDRESS) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((address, port)) == 0


def prometheus_config(exporter_port: int, prometheus_port: int, scrape_interval: str | None = None,
                      rules_dir: Path | None = None) -> str:
    """``monitoring/prometheus.yml`` for these ports, its rule files as absolute paths (the
    same files' names in ``rules_dir`` when given: a test's copies with shorter ``for:``)."""
    import yaml

    conf = yaml.safe_load((monitoring_dir() / "prometheus.yml").read_text())
    conf["rule_files"] = [str(rules_dir / Path(f).name if rules_dir else monitoring_dir() / f)
                          for f in conf.get("rule_files", [])]
    if scrape_interval:
        conf["global"].update(scrape_interval=scrape_interval, evaluation_interval=scrape_interval,
                              scrape_timeout=scrape_interval)
    targets = {"streamlake": f"{ADDRESS}:{exporter_port}", "prometheus": f"{ADDRESS}:{prometheus_port}"}
    for job in conf["scrape_configs"]:  # a job a user added (a collector of theirs) keeps its targets
        if job["job_name"] in targets:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    return yaml.safe_dump(conf, sort_keys=False)


def start(exporter_port: int = 9464, prometheus_port: int = PROMETHEUS_PORT,
          scrape_interval: str | None = None, timeout_s: float = 60.0,
          rules_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """Start the exporter and Prometheus unless they run; (what runs, what is missing and why).
    ``scrape_interval`` and ``rules_dir``: see :func:`prometheus_config`."""
    from streamlake import procs

    up, missing = [], []
    exporter_url = f"http://{ADDRESS}:{exporter_port}/metrics"
    if procs.status(EXPORTER) is not None:
        up.append(f"Metrics exporter:  {exporter_url} (running)")
    elif _port_taken(exporter_port):
        missing.append(f"Metrics exporter:  NOT STARTED: port {exporter_port} on {ADDRESS} is already in use "
                       f"(`ss -ltnp 'sport = :{exporter_port}'` names the process)")
    else:
        try:
            procs.start_until_ready(EXPORTER, [str(Path(sys.executable).parent / "streamlake"), "metrics", "serve",
                                               "--port", str(exporter_port), "--address", ADDRESS],
                                    lambda: _listening(exporter_port), timeout=timeout_s, what="the metrics exporter")
            up.append(f"Metrics exporter:  {exporter_url} (log: {config.log_dir() / (EXPORTER + '.log')})")
        except RuntimeError as exc:
            missing.append(f"Metrics exporter:  NOT STARTED: {exc}")
    url = f"http://{ADDRESS}:{prometheus_port}"
    binary = prometheus_binary()
    if procs.status(PROMETHEUS) is not None:
        up.append(f"Prometheus:        {url} (running)")
    elif not binary.exists():
        missing.append(f"Prometheus:        NOT STARTED: {binary} is not installed (`make setup` unpacks Debian's "
                       "prometheus package there; see its warning)")
    elif _port_taken(prometheus_port):
        missing.append(f"Prometheus:        NOT STARTED: port {prometheus_port} on {ADDRESS} is already in use "
                       f"(`ss -ltnp 'sport = :{prometheus_port}'` names the process)")
    else:
        home = config.home() / "prometheus"
        (home / "data").mkdir(parents=True, exist_ok=True)
        conf = home / "prometheus.yml"
        conf.write_text(prometheus_config(exporter_port, prometheus_port, scrape_interval, rules_dir))
        try:
            procs.start_until_ready(PROMETHEUS, [str(binary), f"--config.file={conf}",
                                                 f"--storage.tsdb.path={home / 'data'}",
                                                 f"--web.listen-address={ADDRESS}:{prometheus_port}",
                                                 f"--web.external-url={url}/"],
                                    lambda: _answers(f"{url}/-/ready"), timeout=timeout_s, what="Prometheus")
            up.append(f"Prometheus:        {url} (scrapes the exporter, rules in {monitoring_dir() / 'rules'}; "
                      f"alerts firing: {url}/alerts; log: {config.log_dir() / (PROMETHEUS + '.log')})")
        except RuntimeError as exc:
            missing.append(f"Prometheus:        NOT STARTED: {exc}")
    return up, missing


def stop() -> list[str]:
    """Stop both; the names of those that ran."""
    from streamlake import procs

    return [name for name in (PROMETHEUS, EXPORTER) if procs.stop(name)]
