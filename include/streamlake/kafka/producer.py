"""Demo and test data: sensor readings produced to Kafka.

Each record: key = sensor id, value = JSON with a unique ``event_id``,
``sensor_id``, ``event_time`` (ISO-8601, UTC) and ``temperature``, padded with a
``pad`` field to about ``value_bytes`` bytes. The same seed gives the same
sensors, event ids and temperatures.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Mapping

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streamlake.errors import InvalidOptionError, KafkaUnavailableError
from streamlake.kafka.client import api_timeout_s, client_config, librdkafka_config

log = logging.getLogger(__name__)


def ensure_topic(conf: Mapping[str, str], topic: str, partitions: int) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists. True if created.

    An existing topic is used as is (a warning if its partition count differs).
    Raises KafkaUnavailableError if the cluster does not answer.
    """
    timeout = api_timeout_s(conf)
    admin = AdminClient(librdkafka_config(conf), logger=logging.getLogger("streamlake.librdkafka.admin"))
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise KafkaUnavailableError(f"Kafka at {conf.get('bootstrap.servers')} did not answer: {exc}") from None
    if topic in existing and existing[topic].error is None:
        have = len(existing[topic].partitions)
        if have != partitions:
            log.warning("topic %s exists with %d partitions (asked for %d); using it as is", topic, have, partitions)
        return False
    future = admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=timeout)[topic]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != exc.args[0].TOPIC_ALREADY_EXISTS:
            raise
        return False
    return True


class SensorReadings:
    """Deterministic generator of sensor readings (key, value) for a seed."""

    def __init__(self, seed: int | None = None, sensors: int = 64, value_bytes: int = 256):
        self.rng = random.Random(seed)
        self.sensors = [f"sensor-{i:04d}" for i in range(sensors)]
        self.base = {s: self.rng.uniform(15.0, 25.0) for s in self.sensors}
        self.value_bytes = value_bytes

    def next(self, now: dt.datetime | None = None) -> tuple[bytes, bytes]:
        sensor = self.rng.choice(self.sensors)
        event = {
            "event_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
            "sensor_id": sensor,
            "event_time": (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="milliseconds"),
            "temperature": round(self.base[sensor] + self.rng.gauss(0, 0.5), 2),
        }
        body = json.dumps(event, separators=(",", ":"))
        pad = self.value_bytes - len(body) - len(',"pad":""')
        if pad > 0:
            body = body[:-1] + ',"pad":"' + "x" * pad + '"}'
        return sensor.encode(), body.encode()


@dataclass
class ProduceSummary:
    topic: str
    records: int
    bytes: int
    partitions: int
    seconds: float
    records_per_second: float
    topic_created: bool


def produce_sensor_readings(topic: str, count: int, partitions: int = 3, rate: float | None = None,
                            value_bytes: int = 256, seed: int | None = None,
                            options: Mapping[str, str] | None = None, progress: bool = True,
                            should_stop=lambda: False) -> ProduceSummary:
    """Produce ``count`` readings (0 = until ``should_stop()``), at most ``rate`` per second.

    Delivery is confirmed (idempotent producer, acks=all) before returning.
    Raises KafkaUnavailableError if records could not be delivered.
    """
    if count < 0 or partitions < 1 or value_bytes < 1 or (rate is not None and rate <= 0):
        raise InvalidOptionError("count >= 0, partitions >= 1, value-bytes >= 1 and rate > 0 are required")
    conf = client_config({f"kafka.{k}": v for k, v in (options or {}).items()})
    created = ensure_topic(conf, topic, partitions)
    settings = librdkafka_config(conf)
    settings.setdefault("linger.ms", "20")
    settings.setdefault("enable.idempotence", "true")
    settings.setdefault("acks", "all")
    producer = Producer(settings, logger=logging.getLogger("streamlake.librdkafka.producer"))
    readings = SensorReadings(seed, value_bytes=value_bytes)
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=count or None, unit="rec", unit_scale=True, desc=f"produce {topic}", file=sys.stderr,
                   mininterval=0.5)
    started = time.monotonic()
    sent = size = 0
    try:
        while (count == 0 or sent < count) and not should_stop():
            if rate is not None:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(min(ahead, 0.5))
                    continue
            key, value = readings.next()
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            sent += 1
            size += len(value)
            if bar is not None and sent % 1000 == 0:
                bar.update(1000)
        left = producer.flush(api_timeout_s(conf))
    finally:
        if bar is not None:
            bar.update(sent % 1000)
            bar.close()
    if left or failures:
        raise KafkaUnavailableError(
            f"{left + len(failures)} of {sent} records to {topic} were not delivered "
            f"({failures[0] if failures else 'flush timed out'})"
        )
    seconds = time.monotonic() - started
    return ProduceSummary(topic, sent, size, partitions, round(seconds, 2),
                          round(sent / seconds, 1) if seconds else 0.0, created)


def summary_dict(summary: ProduceSummary) -> dict:
    return asdict(summary)
