"""Exceptions with messages meant for the person running the job."""

from __future__ import annotations


class StreamLakeError(Exception):
    """Base class: a problem the user can act on, described in the message."""


class InvalidOptionError(StreamLakeError, ValueError):
    """An option has a value that cannot be used (named in the message)."""


class KafkaUnavailableError(StreamLakeError):
    """The Kafka cluster did not answer within the configured timeout."""


class UnknownTopicError(StreamLakeError):
    """A subscribed topic does not exist (topics are never auto-created by reads)."""


class DataLossError(StreamLakeError):
    """Offsets the job must read are no longer held by Kafka (``failOnDataLoss=true``)."""


class OffsetGapError(StreamLakeError):
    """The Delta table and the query checkpoint disagree so that records would be skipped."""


class CommitConflictError(StreamLakeError):
    """The Delta commit kept losing to concurrent writers of the same offsets."""


class PositionGapError(StreamLakeError):
    """A pipeline stage's table is behind its query checkpoint: committing would skip rows."""


class UnsafeStoreError(StreamLakeError):
    """A table on an object store without a safe commit (no atomic put-if-absent):
    two writers could both commit the same Delta version."""


class StorageOptionError(InvalidOptionError):
    """A storage option that is malformed or does not fit the lake's URI."""


class UnreadableTableError(StreamLakeError):
    """A table would have a protocol feature Delta's Spark connector (the pinned delta-spark)
    cannot read: refused before the table is created."""
