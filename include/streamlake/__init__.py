"""StreamLake: exactly-once Kafka -> Delta on Spark, an event-time pipeline on top,
operated from Airflow with a proof after every operation.

Subpackages, one home per idea:

- ``streamlake.kafka``: the Kafka side (client settings, offsets, the Spark
  streaming source, range reads, the demo producer).
- ``streamlake.delta``: the Delta side (tables on delta-rs, the two-phase-commit
  sink, committed offsets and consumed versions as ``txn`` actions).
- ``streamlake.spark``: the Spark side (session settings, spark-submit command
  lines, reading a query checkpoint).
- ``streamlake.pipeline``: the stages (bronze ingest, and what builds on it).
- ``streamlake.operations``: named jobs and what is done to them (control,
  savepoints, supervisor, runner, consistency checks, the audit).
- ``streamlake.platform``: the local services (the local Kafka broker, Spark
  standalone cluster, Airflow standalone, process management).
- ``streamlake.orchestration``: the Airflow-facing operator and task functions.
- ``streamlake.cli``: the ``streamlake`` command, one module per command group.

Top-level modules: ``config`` (settings), ``errors`` (exceptions meant for the
user), ``faults`` (crash injection for the exactly-once tests).
"""

__version__ = "0.2.0"
