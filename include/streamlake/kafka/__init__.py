"""Kafka side of the platform: client settings, offsets, source, broker, producer."""
