"""docker-compose.yaml cannot run here (no Docker engine): check it against the project instead.

Every service it names exists and is wired (depends_on, volumes), images are
pinned, ports are the ones the platform uses, and every environment variable
is one the project or Airflow actually reads, with the Airflow settings of
`make run` all present.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def _env(service: dict) -> dict:
    env = service.get("environment") or {}
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_services_images_and_builds(compose):
    services = compose["services"]
    expected = {"kafka", "postgres", "spark-master", "spark-worker", "airflow-init", "airflow-apiserver",
                "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
    assert expected <= set(services)
    for name, svc in services.items():
        image = svc["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), f"{name}: unpinned {image}"
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    kafka = _env(services["kafka"])
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"] and not any("ZOOKEEPER" in k for k in kafka), "KRaft mode"
    commands = {" ".join(s.get("command", [])) for s in services.values()}
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert f"airflow {component}" in commands


def test_dependencies_volumes_and_ports(compose):
    from streamlake.platform import airflow as airflow_setup, spark_cluster

    services = compose["services"]
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for dep in svc.get("depends_on") or []:
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in svc.get("volumes") or []:
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: bind mount {source} missing"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
    ports = {p.split(":")[1] for s in services.values() for p in s.get("ports") or []}
    assert {str(airflow_setup.DEFAULT_PORT), "9092", str(spark_cluster.DEFAULT_PORT),
            str(spark_cluster.DEFAULT_UI_PORT)} <= ports
    env = _env(services["airflow-scheduler"])
    assert env["STREAMLAKE_KAFKA_BOOTSTRAP"].split(":")[0] in services
    cluster = yaml.safe_load(env[f"AIRFLOW_CONN_{airflow_setup.SPARK_CLUSTER_CONN.upper()}"])
    assert cluster["host"].split("//")[1] in services and cluster["port"] == spark_cluster.DEFAULT_PORT
    connect = yaml.safe_load(env[f"AIRFLOW_CONN_{airflow_setup.SPARK_CONNECT_CONN.upper()}"])
    assert connect["conn_type"] == "spark_connect" and connect["host"].split("//")[1] in services
    assert f"spark.connect.grpc.binding.port={connect['port']}" in services["spark-connect"]["command"]
    assert "postgres:5432" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


def test_every_variable_is_one_the_project_or_airflow_reads(compose):
    from airflow.configuration import conf

    from streamlake.platform import airflow as airflow_setup

    known = {section: set(desc.get("options", {})) for section, desc in conf.configuration_description.items()}
    sources = "\n".join(p.read_text() for d in ("include", "dags", "jobs", "plugins") for p in (ROOT / d).rglob("*.py"))
    run_env = airflow_setup.airflow_env()
    for name, svc in compose["services"].items():
        if name in ("kafka", "postgres", "minio", "minio-init"):
            continue  # the images' own settings
        for var in _env(svc):
            if var.startswith("AIRFLOW__"):
                section, key = var[len("AIRFLOW__"):].lower().split("__", 1)
                assert key in known.get(section, ()), f"{name}: {var} is not an Airflow setting"
            elif var.startswith("AIRFLOW_CONN_"):
                conn_id = var[len("AIRFLOW_CONN_"):].lower()
                assert conn_id in (airflow_setup.SPARK_LOCAL_CONN, airflow_setup.SPARK_CLUSTER_CONN,
                                   airflow_setup.SPARK_CONNECT_CONN)
            else:
                assert var in sources or var in ("AIRFLOW_HOME",), f"{name}: {var} is read nowhere in the project"
    for var in run_env:  # and `make run` itself sets only real Airflow options
        if var.startswith("AIRFLOW__"):
            section, key = var[len("AIRFLOW__"):].lower().split("__", 1)
            assert key in known.get(section, ()), f"airflow_env(): {var} is not an Airflow setting"
    # `make run` and compose configure Airflow with the same settings (but SQLite's).
    compose_env = _env(compose["services"]["airflow-scheduler"])
    missing = [k for k in run_env if k.startswith(("AIRFLOW__", "AIRFLOW_CONN_")) and k not in compose_env
               and k not in airflow_setup.SQLITE_SETTINGS]
    assert not missing, f"settings of `make run` missing from compose: {missing}"


def test_the_lake_is_on_the_composes_minio(compose, monkeypatch):
    """Every container that runs StreamLake code (Airflow's, Spark's: their executors write the
    tables) reaches the lake on the MinIO service with its credentials; the bucket the lake
    root names is the one minio-init creates; commits are conditional puts; and the settings
    mean to the project what the comment says (pipelines at s3://lake/<name>, the platform's
    tables at s3://lake/_platform)."""
    from urllib.parse import urlsplit

    from streamlake.storage.lake import lake_options, lake_root, platform_root

    services = compose["services"]
    minio = _env(services["minio"])
    assert "server" in services["minio"]["command"]
    for name, svc in services.items():
        if name.startswith(("airflow", "spark")):
            env = _env(svc)
            assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"], name
            assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"], name
            for key in ("STREAMLAKE_LAKE_ROOT", "STREAMLAKE_STORAGE_OPTIONS"):
                monkeypatch.setenv(key, env[key])
            monkeypatch.delenv("STREAMLAKE_PLATFORM_ROOT", raising=False)
            options = lake_options()
            endpoint = urlsplit(options["AWS_ENDPOINT_URL"])
            assert endpoint.hostname == "minio" and f"{endpoint.port}:{endpoint.port}" in services["minio"]["ports"]
            assert options["conditional_put"] == "etag", "MinIO honours If-None-Match: commits are put-if-absent"
            assert lake_root() == "s3://lake" and platform_root() == "s3://lake/_platform"
    bucket = urlsplit(_env(services["airflow-scheduler"])["STREAMLAKE_LAKE_ROOT"]).netloc
    init = services["minio-init"]
    assert f"mc mb --ignore-existing lake/{bucket}" in " ".join(init["entrypoint"])
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["airflow-scheduler"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert "minio-data:/data" in services["minio"]["volumes"]


def test_prometheus_scrapes_the_exporter_with_the_platforms_rules(compose):
    """As on `make run`: the exporter serves, Prometheus scrapes it with monitoring/prometheus.yml's
    settings and the same rule files, and the Health view (the API server) reads Prometheus."""
    services = compose["services"]
    command = services["metrics-exporter"]["command"]
    assert command[:3] == ["streamlake", "metrics", "serve"]
    port = command[command.index("--port") + 1]
    ours = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    local = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    assert ours["global"] == local["global"] and ours["rule_files"] == local["rule_files"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in ours["scrape_configs"]}
    assert targets["streamlake"] == [f"metrics-exporter:{port}"]
    assert set(targets) == {job["job_name"] for job in local["scrape_configs"]}
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./docker/prometheus.yml"
    assert mounts["/etc/prometheus/rules"] == "./monitoring/rules"
    assert all((ROOT / "monitoring" / f).exists() for f in ours["rule_files"])
    assert _env(services["airflow-apiserver"])["STREAMLAKE_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
