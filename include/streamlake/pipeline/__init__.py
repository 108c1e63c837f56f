"""The pipeline's stages: Kafka -> bronze (``bronze``, ``ingest``)."""
