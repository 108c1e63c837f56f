"""The CLI and Airflow hand an IngestConfig to the Spark job as flags: nothing may get lost."""

import argparse

import pytest

from streamlake.errors import InvalidOptionError
from streamlake.pipeline.ingest import IngestConfig, add_ingest_arguments, config_from_args, config_to_args


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_ingest_arguments(parser)
    return config_from_args(parser.parse_args(argv))


@pytest.mark.parametrize("cfg", [
    IngestConfig(table="/t", checkpoint="/c", topics=("a", "b")),
    IngestConfig(table="/t", checkpoint="/c", pattern="sensors-.*", processing_time_s=2.5,
                 max_offsets_per_trigger=1000, min_partitions=8, fail_on_data_loss=False,
                 kafka={"security.protocol": "SSL", "client.id": "x=y"}, query_name="q"),
    IngestConfig(table="/t", checkpoint="/c", topics=("a",), starting_timestamp=1700000000000),
    IngestConfig(table="/t", checkpoint="/c", topics=("a",), starting_offsets='{"a": {"0": 5}}'),
])
def test_config_survives_the_round_trip_through_flags(cfg):
    assert _parse(config_to_args(cfg)) == cfg


def test_flag_errors_are_clear():
    with pytest.raises(InvalidOptionError, match="exactly one of --topic or --topic-pattern"):
        _parse(["--table", "/t", "--checkpoint", "/c"])
    with pytest.raises(InvalidOptionError, match="KEY=VALUE"):
        _parse(["--table", "/t", "--checkpoint", "/c", "--topic", "a", "--kafka-option", "novalue"])


def test_only_an_available_now_pipeline_run_goes_to_a_spark_connect_server(tmp_path):
    """A continuous run owns its JVM (resources, rescale, supervisor): jobs/pipeline.py refuses
    --remote with a processing-time trigger, before any session or table exists."""
    import subprocess
    import sys

    from streamlake.config import project_root

    done = subprocess.run([sys.executable, str(project_root() / "jobs" / "pipeline.py"), "--definition",
                           str(project_root() / "pipelines" / "sensors.yaml"), "--root", str(tmp_path / "r"),
                           "--processing-time", "5", "--remote", "sc://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "available-now run only" in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("processing_time, downstream, on_s3", [(5.0, 0.25, True), (1.0, 0.25, True),
                                                             (0.1, 0.1, True), (5.0, 0.0, False), (None, None, False)])
def test_silver_and_gold_start_on_their_upstream_commit(tmp_path, processing_time, downstream, on_s3):
    """`--processing-time S` is bronze's trigger. On a local root silver and gold run on a trigger
    of 0 and their sources wait up to 500 ms for the upstream's next commit (``waitForCommitMs``);
    on an object store they look every 0.25 s (at most S). Either way a record does not wait a
    trigger per stage on its way to gold. Available-now runs have no trigger interval and no wait."""
    from streamlake.config import project_root
    from streamlake.pipeline.config import UPSTREAM_WAIT_MS, PipelineConfig
    from streamlake.pipeline.definition import load_definition

    definition = load_definition(project_root() / "pipelines" / "orders.yaml")
    cfg = PipelineConfig(root="s3://lake/orders" if on_s3 else str(tmp_path / "lake"), definition=definition,
                         processing_time_s=processing_time)
    assert cfg.downstream_trigger_s == downstream
    assert cfg.upstream_wait_ms == (UPSTREAM_WAIT_MS if downstream == 0.0 else None)
    if on_s3:
        return
    stages = cfg.build_stages()
    assert stages[0].cfg.processing_time_s == processing_time
    assert [s.processing_time_s for s in stages[1:]] == [downstream] * (len(stages) - 1) and len(stages) == 4
    waits = [s.source_options().get("waitForCommitMs") for s in stages[1:]]
    assert waits == [None if processing_time is None else str(UPSTREAM_WAIT_MS)] * 3
