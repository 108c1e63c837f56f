"""StreamLake: exactly-once Kafka -> Delta ingestion on Spark, operated from Airflow.

Modules, one home per idea:

- ``streamlake.kafka``: the Kafka side (client settings, offsets, the Spark
  streaming source, the embedded broker, the demo producer).
- ``streamlake.delta``: the Delta side (bronze table, the two-phase-commit sink,
  committed offsets stored as Delta ``txn`` actions).
- ``streamlake.audit``: proof that a table holds every Kafka record exactly once.
- ``streamlake.ingest``: the bronze ingest job wiring source -> sink.
"""

__version__ = "0.1.0"
