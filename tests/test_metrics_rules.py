"""monitoring/: Prometheus's own tool checks the configuration and the rules, and runs the
rules' unit tests (monitoring/tests/alerts.test.yml: each alert fires on series shaped like
the exporter's and stays quiet on healthy ones). promtool is Debian's, which `make setup`
unpacks into .venv/prometheus (scripts/setup.sh); one on PATH serves too."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"
LOCAL_PROMTOOL = ROOT / ".venv" / "prometheus" / "usr" / "bin" / "promtool"


def promtool() -> str:
    if LOCAL_PROMTOOL.exists():
        return str(LOCAL_PROMTOOL)
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed: `make setup` unpacks Debian's prometheus package into "
                    ".venv/prometheus (it could not fetch it here; see its warning)")
    return found


def run(*args: str) -> str:
    done = subprocess.run([promtool(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_rules_and_the_configuration():
    rules = sorted(str(p.relative_to(MONITORING)) for p in (MONITORING / "rules").glob("*.yml"))
    assert rules == ["rules/alerts.yml", "rules/recording.yml"]
    out = run("check", "rules", *rules)
    assert out.count("SUCCESS: 7 rules found") == 2, out  # 7 alerts, 7 recording rules
    assert "SUCCESS" in run("check", "config", "prometheus.yml")


def test_every_alert_fires_in_promtools_unit_tests():
    assert "SUCCESS" in run("test", "rules", "tests/alerts.test.yml")
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "tests" / "alerts.test.yml").read_text()))
    alerts = {r["alert"] for g in yaml.safe_load((MONITORING / "rules" / "alerts.yml").read_text())["groups"]
              for r in g["rules"]}
    assert tested == alerts


def test_the_rules_read_only_series_the_exporter_serves():
    from streamlake.monitoring.collector import LABELS

    served = set(LABELS) | {"streamlake_batch_input_rows_total", "streamlake_batch_duration_seconds_bucket",
                            "streamlake_batch_duration_seconds_sum", "streamlake_batch_duration_seconds_count"}
    for path in (MONITORING / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                used = set(re.findall(r"(?<![:\w])(streamlake_\w+)", rule["expr"]))
                assert used <= served, f"{path.name} {rule.get('alert') or rule.get('record')}: {used - served}"
