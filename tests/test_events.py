"""Test and demo data: the labelled sensor-event generator and the producer around it.

The generator alone first (no Kafka): reproducibility, the mix of kinds, each
malformed record breaking exactly the rule of its reason (checked by a small
validator written here from QUARANTINE_REASONS' wording, independent of the
generator), duplicates, lateness. Then on the embedded broker: the manifest
against what a consumer reads back, one record per record batch (read from the
broker's own Fetch answers), and the ``streamlake produce`` command.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from streamlake.errors import InvalidOptionError
from streamlake.kafka import events
from streamlake.kafka.events import DUPLICATE_LOOKBACK, MALFORMED_VARIANTS, EventMix, SensorEvents
from streamlake.pipeline.schemas import MAX_FUTURE_SECONDS, QUARANTINE_REASONS, TEMPERATURE_RANGE

STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 11, 5, 10, 0, 0, 123456, tzinfo=UTC)
FIELDS = ("event_id", "sensor_id", "event_time", "temperature")


# -- an independent validator, one rule per reason code ---------------------------


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _timestamp(v) -> dt.datetime | None:
    """An ISO-8601 timestamp with a UTC offset, else None."""
    try:
        t = dt.datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo is not None else None


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


RULES = {  # reason -> does the (parsed object, Kafka timestamp) break it?
    "missing_field": lambda o, ts: any(o.get(f) is None for f in FIELDS),
    "wrong_type": lambda o, ts: (
        any(o.get(f) is not None and not isinstance(o[f], str) for f in ("event_id", "sensor_id", "event_time"))
        or (o.get("temperature") is not None and not _number(o["temperature"]))),
    "empty_field": lambda o, ts: o.get("event_id") == "" or o.get("sensor_id") == "",
    "invalid_timestamp": lambda o, ts: isinstance(o.get("event_time"), str) and _timestamp(o["event_time"]) is None,
    "out_of_range": lambda o, ts: (_number(o.get("temperature"))
                                   and not TEMPERATURE_RANGE[0] <= o["temperature"] <= TEMPERATURE_RANGE[1]),
    "far_future": lambda o, ts: (isinstance(o.get("event_time"), str) and _timestamp(o["event_time"]) is not None
                                 and (_timestamp(o["event_time"]) - ts).total_seconds() > MAX_FUTURE_SECONDS),
}


def violations(value: bytes | None, timestamp_ms: int) -> list[str]:
    """Every rule the record breaks, in QUARANTINE_REASONS order (the first is its reason code)."""
    try:
        obj = json.loads(value or b"", parse_constant=_reject_constant)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
        return ["not_json"]
    if not isinstance(obj, dict):
        return ["not_object"]
    ts = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=timestamp_ms)
    return [reason for reason, broken in RULES.items() if broken(obj, ts)]


def test_the_generator_knows_every_reason_code_in_validation_order():
    assert list(events.REASONS) == list(QUARANTINE_REASONS)
    assert list(RULES) == list(QUARANTINE_REASONS)[2:]  # not_json, not_object: in violations() itself
    assert set(MALFORMED_VARIANTS) == set(QUARANTINE_REASONS)


# -- the generator alone ------------------------------------------------------------


def stepping_clock(start=T0, step_ms=7):
    state = {"now": start - dt.timedelta(milliseconds=step_ms)}

    def clock():
        state["now"] += dt.timedelta(milliseconds=step_ms)
        return state["now"]

    return clock


MIX = {"late_fraction": 0.1, "malformed_fraction": 0.2, "duplicate_fraction": 0.1, "out_of_order_seconds": 20}


def test_same_seed_and_clock_give_the_same_records():
    a = SensorEvents(7, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    b = SensorEvents(7, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    c = SensorEvents(8, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    assert a == b
    assert [r.value for r in a] != [r.value for r in c]
    assert [r.kind for r in a] != [r.kind for r in c]


def test_the_default_is_the_original_demo_data_byte_for_byte():
    """All fractions 0: the demo producer's records as before (the bench's seed=42 data is unchanged)."""
    import random
    import uuid

    def original(seed, value_bytes, now, n):  # the generator as it was before streamlake.kafka.events
        rng = random.Random(seed)
        sensors = [f"sensor-{i:04d}" for i in range(64)]
        base = {s: rng.uniform(15.0, 25.0) for s in sensors}
        for _ in range(n):
            sensor = rng.choice(sensors)
            event = {"event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "sensor_id": sensor,
                     "event_time": now.isoformat(timespec="milliseconds"),
                     "temperature": round(base[sensor] + rng.gauss(0, 0.5), 2)}
            body = json.dumps(event, separators=(",", ":"))
            pad = value_bytes - len(body) - len(',"pad":""')
            if pad > 0:
                body = body[:-1] + ',"pad":"' + "x" * pad + '"}'
            yield sensor.encode(), body.encode()

    records = SensorEvents(42, value_bytes=300, clock=lambda: T0).take(500)
    assert [(r.key, r.value) for r in records] == list(original(42, 300, T0, 500))
    assert {r.kind for r in records} == {"valid"}
    assert all(r.timestamp_ms == int(T0.timestamp() * 1000) and len(r.value) == 300 for r in records)
    assert all(json.loads(r.value)["event_time"] == "2026-11-05T10:00:00.123+00:00" for r in records)


def test_fractions_come_out_as_asked_and_every_reason_and_variant_occurs():
    n = 6000
    records = SensorEvents(3, value_bytes=120, clock=lambda: T0, **MIX).take(n)
    kinds, reasons = events.count_kinds(records)
    asked = {"late": 0.1, "malformed": 0.2, "duplicate": 0.1, "valid": 0.6}
    for kind, p in asked.items():
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(kinds[kind] / n - p) < 4.5 * sigma, (kind, kinds)
    m = kinds["malformed"]
    for reason in QUARANTINE_REASONS:
        p = 1 / len(QUARANTINE_REASONS)
        assert abs(reasons[reason] / m - p) < 4.5 * math.sqrt(p * (1 - p) / m), (reason, reasons)
    variants = {(r.reason, r.variant.split(":")[0]) for r in records if r.kind == "malformed"}
    assert variants == {(reason, v) for reason, vs in MALFORMED_VARIANTS.items() for v in vs}


def test_each_malformed_record_breaks_exactly_the_rule_of_its_reason_and_the_rest_break_none():
    records = SensorEvents(11, value_bytes=200, clock=stepping_clock(step_ms=3), malformed_fraction=0.5,
                           late_fraction=0.15, duplicate_fraction=0.15, out_of_order_seconds=30).take(4000)
    wrong = []
    for r in records:
        found = violations(r.value, r.timestamp_ms)
        want = [r.reason] if r.kind == "malformed" else []
        if found != want:
            wrong.append((r.kind, r.reason, r.variant, found, r.value[:120]))
    assert not wrong, wrong[:10]
    # What the record says about itself matches its value.
    for r in records:
        obj = None
        try:
            obj = json.loads(r.value)
        except ValueError:
            pass
        if isinstance(obj, dict) and isinstance(obj.get("event_id"), str):
            assert r.event_id == obj["event_id"]
        else:
            assert r.event_id is None
        if r.kind != "malformed":
            assert (r.sensor_id, r.temperature) == (obj["sensor_id"], obj["temperature"])
            assert r.event_time == dt.datetime.fromisoformat(obj["event_time"]) and r.key == r.sensor_id.encode()


def test_event_times_late_on_time_and_far_future():
    s = 25
    records = SensorEvents(5, clock=lambda: T0, late_fraction=0.3, duplicate_fraction=0.1,
                           malformed_fraction=0.2, malformed_reasons=["far_future"], out_of_order_seconds=s).take(3000)
    ages = {kind: [(r.timestamp - r.event_time).total_seconds() for r in records if r.kind == kind]
            for kind in ("valid", "late", "duplicate")}
    assert all(0 <= a <= s for a in ages["valid"])
    assert max(ages["valid"]) > 0.8 * s, "on-time events spread over the out-of-order range"
    assert all(120 <= a <= 900 for a in ages["late"])
    assert min(ages["late"]) < 240 and max(ages["late"]) > 780, "late events spread over 2 to 15 minutes"
    # A late event's 1-minute window ended at least a minute before now; on-time windows end after now - S.
    for r in records:
        if r.kind in ("valid", "late"):
            window_end = r.event_time.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
            assert (window_end <= T0 - dt.timedelta(seconds=60)) if r.kind == "late" else \
                (window_end > T0 - dt.timedelta(seconds=s))
    future = [r for r in records if r.kind == "malformed"]
    assert future and all(r.reason == "far_future" for r in future)
    assert all(json.loads(r.value)["event_time"] > "2026-11-05T12" for r in future)


def test_duplicates_are_exact_resends_of_a_recent_valid_record():
    records = SensorEvents(9, value_bytes=200, clock=stepping_clock(step_ms=2), **MIX).take(3000)
    dups = [r for r in records if r.kind == "duplicate"]
    assert len(dups) > 200
    for d in dups:
        original = records[d.duplicate_of]
        assert original.seq == d.duplicate_of < d.seq and original.kind in ("valid", "late")
        assert (d.key, d.value, d.event_id, d.event_time) == (original.key, original.value, original.event_id,
                                                              original.event_time)
        between = [r for r in records[original.seq:d.seq] if r.kind in ("valid", "late")]
        assert len(between) <= DUPLICATE_LOOKBACK, "chosen among recent records"
        assert d.timestamp_ms > original.timestamp_ms, "re-sent later"
        if original.kind == "valid":  # on time as far as event time goes
            assert (d.timestamp - d.event_time).total_seconds() <= MIX["out_of_order_seconds"] + \
                (d.seq - original.seq) * 0.002
    # Valid and late event ids are unique; duplicates are the only repeats.
    ids = [r.event_id for r in records if r.kind in ("valid", "late")]
    assert len(ids) == len(set(ids))
    malformed_ids = {r.event_id for r in records if r.kind == "malformed" and r.event_id}
    assert not malformed_ids & set(ids)
    expected = events.expected(records)
    assert expected.silver == set(ids) and expected.duplicates == len(dups)
    assert expected.late == {r.event_id for r in records if r.kind == "late"}
    assert sum(expected.quarantine.values()) == sum(r.kind == "malformed" for r in records)


@pytest.mark.parametrize("kwargs, words", [
    ({"late_fraction": 1.5}, "late-fraction must be between 0 and 1"),
    ({"malformed_fraction": -0.1}, "malformed-fraction must be between 0 and 1"),
    ({"late_fraction": 0.5, "malformed_fraction": 0.4, "duplicate_fraction": 0.2}, "must be at most 1"),
    ({"out_of_order_seconds": -1}, "out-of-order-seconds must be between 0 and 60"),
    ({"out_of_order_seconds": 600}, "out-of-order-seconds must be between 0 and 60"),
    ({"malformed_reasons": ["bad_json"]}, "bad_json"),
])
def test_bad_mixes_are_refused_with_the_option_named(kwargs, words):
    with pytest.raises(InvalidOptionError, match=words):
        EventMix(**kwargs)
    assert EventMix(late_fraction=0.5, malformed_fraction=0.3, duplicate_fraction=0.2).valid_fraction == 0


# -- on the embedded broker ---------------------------------------------------------


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], object]:
    """Every record of the topic by (partition, offset), read to the end of each partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, at_end = {}, set()
    try:
        while len(at_end) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "the consumer stalled"
            if msg.error():
                assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            out[(msg.partition(), msg.offset())] = msg
    finally:
        consumer.close()
    return out


def test_manifest_offsets_and_kinds_match_what_a_consumer_reads_back(broker, produce, topic_name, tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    mix = dict(MIX, malformed_fraction=0.25)
    summary = produce(topic_name, 600, partitions=3, seed=21, clock=stepping_clock(), manifest_path=manifest, **mix)
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    records = SensorEvents(21, value_bytes=200, clock=stepping_clock(), **mix).take(600)  # the same records again
    consumed = read_topic(broker, topic_name, 3)

    assert len(lines) == 600 and sorted(line["seq"] for line in lines) == list(range(600))
    assert {(line["partition"], line["offset"]) for line in lines} == set(consumed)
    kinds, reasons = events.count_kinds(records)
    assert (summary.records, summary.kinds, summary.reasons) == (600, kinds, reasons)
    assert Counter(line["kind"] for line in lines) == Counter({k: n for k, n in kinds.items() if n})
    first_seen: dict[tuple[int, bytes], int] = {}
    for line in sorted(lines, key=lambda item: (item["partition"], item["offset"])):
        msg, record = consumed[(line["partition"], line["offset"])], records[line["seq"]]
        value = msg.value()  # an empty value stays b"" (not null) on the broker
        assert (msg.key(), value, msg.timestamp()[1]) == (record.key, record.value, record.timestamp_ms)
        assert (line["kind"], line["reason"], line["event_id"], line["timestamp"]) == \
            (record.kind, record.reason, record.event_id, record.timestamp_ms)
        # What a consumer sees, judged by the independent validator with the record's Kafka timestamp.
        assert violations(value, msg.timestamp()[1]) == ([line["reason"]] if line["kind"] == "malformed" else [])
        if line["kind"] == "duplicate":  # the same bytes were already read, earlier in the same partition
            assert (line["partition"], value) in first_seen and first_seen[(line["partition"], value)] < line["offset"]
        elif line["kind"] in ("valid", "late"):
            first_seen.setdefault((line["partition"], value), line["offset"])


def record_batches(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """(base offset, record count) of every record batch of a partition, from raw Fetch v4 answers.

    librdkafka hides batch boundaries, so this speaks the protocol: a Fetch
    answer carries whole record batches (magic 2) whose headers give the base
    offset, the last offset delta and the number of records.
    """
    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def recv(sock, n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    batches: list[tuple[int, int]] = []
    offset, high_watermark, correlation = 0, None, 0
    name, client = topic.encode(), b"streamlake-tests"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        while high_watermark is None or offset < high_watermark:
            correlation += 1
            request = (struct.pack(">hhih", 1, 4, correlation, len(client)) + client  # Fetch v4 header
                       + struct.pack(">iiiib", -1, 200, 1, 1 << 20, 0)  # replica, wait, min, max bytes, isolation
                       + struct.pack(">ih", 1, len(name)) + name
                       + struct.pack(">iiqi", 1, partition, offset, 1 << 20))
            sock.sendall(struct.pack(">i", len(request)) + request)
            answer = recv(sock, struct.unpack(">i", recv(sock, 4))[0])
            pos = 8 + 4  # correlation id, throttle time, topic count
            pos += 2 + struct.unpack_from(">h", answer, pos)[0] + 4  # topic name, partition count
            _, error, high_watermark, _ = struct.unpack_from(">ihqq", answer, pos)
            assert error == 0, f"fetch error {error}"
            pos += 22
            aborted = struct.unpack_from(">i", answer, pos)[0]
            pos += 4 + 16 * max(aborted, 0)
            size = struct.unpack_from(">i", answer, pos)[0]
            pos += 4
            end = pos + max(size, 0)
            got = False
            while pos + 61 <= end:
                base, length = struct.unpack_from(">qi", answer, pos)
                if pos + 12 + length > end:
                    break  # a partial batch at the end of the answer
                magic = answer[pos + 16]
                last_delta, = struct.unpack_from(">i", answer, pos + 23)
                count, = struct.unpack_from(">i", answer, pos + 57)
                assert magic == 2
                batches.append((base, count))
                offset, got = base + last_delta + 1, True
                pos += 12 + length
            assert got or offset >= high_watermark, "no progress fetching record batches"
    return batches


def test_one_per_batch_writes_every_record_as_its_own_record_batch(broker, produce, topic_name):
    from confluent_kafka import Consumer, TopicPartition

    live, bulk = f"{topic_name}-live", f"{topic_name}-bulk"
    produce(live, 300, partitions=2, seed=4, one_per_batch=True, malformed_fraction=0.1, duplicate_fraction=0.1)
    produce(bulk, 300, partitions=2, seed=4)
    shapes = {t: [record_batches(broker, t, p) for p in range(2)] for t in (live, bulk)}
    for per_partition in shapes[live]:
        assert per_partition and all(count == 1 for _, count in per_partition)
        assert [base for base, _ in per_partition] == list(range(len(per_partition)))
    assert sum(len(b) for b in shapes[live]) == 300
    # The check can tell: the default (linger.ms=20) producer writes batches of many records.
    assert sum(count for b in shapes[bulk] for _, count in b) == 300
    assert max(count for b in shapes[bulk] for _, count in b) > 1
    # Corroborated by the broker's ListOffsets defect (newest batch's base + 1): right only for one-record batches.
    consumer = Consumer({"bootstrap.servers": broker, "group.id": "listoffsets"})
    try:
        for topic in (live, bulk):
            for p, per_partition in enumerate(shapes[topic]):
                base, _ = per_partition[-1]
                assert consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] == base + 1
    finally:
        consumer.close()


def test_streamlake_produce_prints_the_counts_and_refuses_bad_fractions(broker, topic_name, tmp_path):
    def run(*flags):
        return subprocess.run([STREAMLAKE, "produce", "--quiet", *flags], env=os.environ, capture_output=True,
                              text=True, timeout=60, check=False)

    flags = ["--count", "300", "--partitions", "2", "--malformed-fraction", "0.1", "--late-fraction", "0.05",
             "--duplicate-fraction", "0.05", "--out-of-order-seconds", "10", "--seed", "3", "--one-per-batch"]
    first = run("--topic", topic_name, "--manifest", str(tmp_path / "m1.jsonl"), *flags)
    second = run("--topic", f"{topic_name}-again", "--manifest", str(tmp_path / "m2.jsonl"), *flags)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    out = json.loads(first.stdout)
    assert out["records"] == 300 and sum(out["kinds"].values()) == 300 and out["one_per_batch"] is True
    assert 10 <= out["kinds"]["malformed"] <= 60 and sum(out["reasons"].values()) == out["kinds"]["malformed"]
    assert out["kinds"]["late"] > 0 and out["kinds"]["duplicate"] > 0
    # --seed: the same kinds, reasons and event ids again (only the clock differs).
    assert json.loads(second.stdout)["kinds"] == out["kinds"] and json.loads(second.stdout)["reasons"] == out["reasons"]
    ids = [sorted((line["seq"], line["kind"], line["reason"], line["event_id"])
                  for line in map(json.loads, (tmp_path / name).read_text().splitlines()))
           for name in ("m1.jsonl", "m2.jsonl")]
    assert ids[0] == ids[1] and len(ids[0]) == 300

    bad = run("--topic", topic_name, "--count", "10", "--late-fraction", "0.6", "--malformed-fraction", "0.6")
    assert bad.returncode == 2
    assert "late-fraction + malformed-fraction + duplicate-fraction must be at most 1" in bad.stderr
    bad = run("--topic", topic_name, "--count", "10", "--duplicate-fraction", "2")
    assert bad.returncode == 2 and "duplicate-fraction must be between 0 and 1" in bad.stderr
