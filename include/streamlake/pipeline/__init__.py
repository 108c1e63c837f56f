"""The pipeline's stages: Kafka -> bronze (``bronze``, ``ingest``) -> silver -> gold, run by
the driver (``driver``) under the job's control files (``control``)."""
