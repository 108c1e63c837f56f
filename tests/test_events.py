"""Test and demo data: the labelled record generator of a definition, and the producer around it.

Both example definitions (pipelines/sensors.yaml and pipelines/orders.yaml, of
different shapes: ISO and epoch-millisecond times, doubles and exact decimals,
optional fields, different rules and windows). The generator alone first (no
Kafka): reproducibility, the mix of kinds, each malformed record breaking
exactly the check of its reason, judged by a validator written here from the
YAML files themselves (not from the pipeline's code), typed values matching the
bytes, duplicates, lateness. Then on the local Kafka broker: the manifest against
what a consumer reads back, one record per record batch (read from the broker's
own Fetch answers and from its log segments, with Kafka's DumpLogSegments), and
the ``streamlake produce`` command.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from streamlake.errors import InvalidOptionError
from streamlake.kafka import events
from streamlake.kafka.events import DUPLICATE_LOOKBACK, MALFORMED_VARIANTS, DefinitionEvents, EventMix
from streamlake.pipeline.definition import load_definition

ROOT = Path(__file__).resolve().parents[1]
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 11, 5, 10, 0, 0, 123456, tzinfo=UTC)
EXAMPLES = ("sensors", "orders")
ORDERS = ROOT / "pipelines" / "orders.yaml"
BASE = ("not_json", "not_object", "missing_field", "wrong_type", "invalid_timestamp", "far_future")


# -- an independent validator, read from the YAML file itself ------------------------

# The examples' rules, written again in Python from their SQL (the test's reading of them).
RULE_CHECKS = {
    "sensors": {"empty_field": lambda o: o["event_id"].strip() != "" and o["sensor_id"].strip() != "",
                "out_of_range": lambda o: -60 <= o["temperature"] <= 80},
    "orders": {"positive_amount": lambda o: o["amount"] > 0,
               "known_currency": lambda o: o["currency"] in ("EUR", "USD", "GBP")},
}


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([smhd])", text).groups()
    return int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


class Spec:
    """What the test reads from a definition's YAML: field types, required fields, rules."""

    def __init__(self, name: str):
        raw = yaml.safe_load((ROOT / "pipelines" / f"{name}.yaml").read_text())
        self.name, self.raw = name, raw
        self.types = dict(raw["schema"])
        self.required = [f for f in self.types if f not in (raw.get("optional") or [])]
        self.event_time, self.event_id = raw["event_time"], raw.get("event_id")
        self.max_future = _seconds(raw.get("max_future", "1h"))
        self.rules = [r["name"] for r in raw.get("rules") or []]
        windows = [_seconds(a["window"].split(":")[1]) for a in raw["aggregates"]]
        lateness = [_seconds(a.get("allowed_lateness", "0s")) for a in raw["aggregates"]]
        self.behind = max(windows) + max(lateness)  # a late event is further back than this
        self.reasons = BASE + tuple(r for r in self.rules if r in raw["datagen"].get("violations", {}))

    def typed(self, name: str, v):
        """The JSON value as the declared type; raises ValueError (wrong type) or LookupError (bad time)."""
        kind = self.types[name]
        number = isinstance(v, (int, decimal.Decimal)) and not isinstance(v, bool)
        if kind == "string" and isinstance(v, str):
            return v
        if kind == "double" and number and math.isfinite(v):
            return float(v)
        if kind.startswith("decimal") and number:
            scale = int(kind[:-1].split(",")[1])
            d = decimal.Decimal(v)
            if d == d.quantize(decimal.Decimal(1).scaleb(-scale)):
                return d
        if kind == "timestamp" and isinstance(v, int) and not isinstance(v, bool):
            return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=v)
        if kind == "timestamp" and isinstance(v, str):
            try:
                t = dt.datetime.fromisoformat(v)
            except ValueError:
                raise LookupError(v) from None
            if t.tzinfo is None:
                raise LookupError(v)
            return t
        raise ValueError(f"{name}: {v!r} is not {kind}")

    def violations(self, value: bytes | None, timestamp_ms: int) -> list[str]:
        """Every check the record fails, in the pipeline's order; a later stage only when the earlier passed."""
        try:
            obj = json.loads(value or b"", parse_float=decimal.Decimal, parse_constant=_reject_constant)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
            return ["not_json"]
        if not isinstance(obj, dict):
            return ["not_object"]
        if any(obj.get(f) is None for f in self.required):
            return ["missing_field"]
        typed, wrong, bad_time = {}, False, False
        for name in self.types:
            if obj.get(name) is None:
                typed[name] = None
                continue
            try:
                typed[name] = self.typed(name, obj[name])
            except LookupError:
                bad_time = True
            except ValueError:
                wrong = True
        if wrong or bad_time:
            return ["wrong_type"] if wrong else ["invalid_timestamp"]
        kafka_time = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=timestamp_ms)
        if (typed[self.event_time] - kafka_time).total_seconds() > self.max_future:
            return ["far_future"]
        return [rule for rule in self.rules if not RULE_CHECKS[self.name][rule](typed)]


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


@pytest.fixture(params=EXAMPLES)
def example(request):
    return Spec(request.param), load_definition(ROOT / "pipelines" / f"{request.param}.yaml")


def test_the_generator_makes_every_base_reason_and_each_rule_with_a_violation_hint():
    assert events.BASE_REASONS == BASE and set(MALFORMED_VARIANTS) == set(BASE)
    for name in EXAMPLES:
        spec, definition = Spec(name), load_definition(ROOT / "pipelines" / f"{name}.yaml")
        assert events.generatable_reasons(definition) == spec.reasons and set(spec.rules) <= set(spec.reasons)


# -- the generator alone ------------------------------------------------------------


def stepping_clock(start=T0, step_ms=7):
    state = {"now": start - dt.timedelta(milliseconds=step_ms)}

    def clock():
        state["now"] += dt.timedelta(milliseconds=step_ms)
        return state["now"]

    return clock


MIX = {"late_fraction": 0.1, "malformed_fraction": 0.2, "duplicate_fraction": 0.1, "out_of_order_seconds": 20}


def test_same_seed_and_clock_give_the_same_records(example):
    _, definition = example
    a = DefinitionEvents(definition, 7, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    b = DefinitionEvents(definition, 7, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    c = DefinitionEvents(definition, 8, value_bytes=200, clock=stepping_clock(), **MIX).take(2000)
    assert a == b
    assert [r.value for r in a] != [r.value for r in c]
    assert [r.kind for r in a] != [r.kind for r in c]


def test_fractions_come_out_as_asked_and_every_reason_and_variant_occurs(example):
    spec, definition = example
    n = 6000
    records = DefinitionEvents(definition, 3, value_bytes=120, clock=lambda: T0, **MIX).take(n)
    kinds, reasons = events.count_kinds(records, spec.reasons)
    asked = {"late": 0.1, "malformed": 0.2, "duplicate": 0.1, "valid": 0.6}
    for kind, p in asked.items():
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(kinds[kind] / n - p) < 4.5 * sigma, (kind, kinds)
    m = kinds["malformed"]
    assert set(reasons) == set(spec.reasons)
    for reason in spec.reasons:
        p = 1 / len(spec.reasons)
        assert abs(reasons[reason] / m - p) < 4.5 * math.sqrt(p * (1 - p) / m), (reason, reasons)
    variants = {(r.reason, r.variant.split(":")[0]) for r in records if r.kind == "malformed"}
    assert variants == {(reason, v) for reason in spec.reasons
                        for v in MALFORMED_VARIANTS.get(reason, ("violation",))}


def test_each_malformed_record_breaks_exactly_the_check_of_its_reason_and_the_rest_break_none(example):
    spec, definition = example
    records = DefinitionEvents(definition, 11, value_bytes=200, clock=stepping_clock(step_ms=3),
                               malformed_fraction=0.5, late_fraction=0.15, duplicate_fraction=0.15,
                               out_of_order_seconds=30).take(4000)
    wrong = []
    for r in records:
        found = spec.violations(r.value, r.timestamp_ms)
        want = [r.reason] if r.kind == "malformed" else []
        if found != want:
            wrong.append((r.kind, r.reason, r.variant, found, r.value[:160]))
    assert not wrong, wrong[:10]
    # What the record says about itself matches its bytes, read by the test.
    optional_seen = Counter()
    for r in records:
        try:
            obj = json.loads(r.value, parse_float=decimal.Decimal)
        except ValueError:
            obj = None
        if r.kind == "malformed":
            if r.reason in ("not_json", "not_object"):
                assert r.event_id is None
            continue
        assert r.event_id == obj[spec.event_id]
        typed = {name: spec.typed(name, obj[name]) if obj.get(name) is not None else None for name in spec.types}
        assert typed == r.fields and r.event_time == typed[spec.event_time]
        key_field = spec.raw["datagen"]["key"]
        assert r.key == str(typed[key_field]).encode()
        for name in set(spec.types) - set(spec.required):
            optional_seen[name in obj] += 1
    if spec.required != list(spec.types):  # orders: coupon left out about 70 % of the time
        assert 0.6 < optional_seen[False] / sum(optional_seen.values()) < 0.8


def test_event_times_late_on_time_and_far_future(example):
    spec, definition = example
    s = 25
    records = DefinitionEvents(definition, 5, clock=lambda: T0, late_fraction=0.3, duplicate_fraction=0.1,
                               malformed_fraction=0.2, malformed_reasons=["far_future"],
                               out_of_order_seconds=s).take(3000)
    ages = {kind: [(r.timestamp - r.event_time).total_seconds() for r in records if r.kind == kind]
            for kind in ("valid", "late", "duplicate")}
    assert all(0 <= a <= s for a in ages["valid"])
    assert max(ages["valid"]) > 0.8 * s, "on-time events spread over the out-of-order range"
    low, high = spec.behind + 60, spec.behind + 900
    assert all(low <= a <= high for a in ages["late"])
    assert min(ages["late"]) < low + 120 and max(ages["late"]) > high - 120, "late events spread over the range"
    future = [r for r in records if r.kind == "malformed"]
    assert future and all(r.reason == "far_future" for r in future)
    for r in future:
        when = spec.typed(spec.event_time, json.loads(r.value)[spec.event_time])
        assert (when - T0).total_seconds() > spec.max_future + 3000


def test_duplicates_are_exact_resends_of_a_recent_valid_record(example):
    _, definition = example
    records = DefinitionEvents(definition, 9, value_bytes=200, clock=stepping_clock(step_ms=2), **MIX).take(3000)
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
])
def test_bad_mixes_are_refused_with_the_option_named(kwargs, words):
    with pytest.raises(InvalidOptionError, match=words):
        EventMix(**kwargs)
    assert EventMix(late_fraction=0.5, malformed_fraction=0.3, duplicate_fraction=0.2).valid_fraction == 0


def test_a_reason_the_definition_cannot_make_is_refused_naming_what_it_can():
    definition = load_definition(ROOT / "pipelines" / "orders.yaml")
    with pytest.raises(InvalidOptionError, match="cannot generate malformed records of bad_json.*known_currency"):
        DefinitionEvents(definition, 1, malformed_reasons=["bad_json"])


# -- on the local Kafka broker ------------------------------------------------------


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], object]:
    """Every record of the topic by (partition, offset), read to the end of each partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": 100,
                         "auto.offset.reset": "error"})  # offsets that are gone fail, never skip to the end
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


def test_manifest_offsets_and_kinds_match_what_a_consumer_reads_back(broker, produce, topic_name, tmp_path,
                                                                      example):
    from confluent_kafka.admin import AdminClient, NewTopic

    spec, definition = example
    manifest = tmp_path / "manifest.jsonl"
    mix = dict(MIX, malformed_fraction=0.25)
    # The records carry the stepping clock's timestamps, a month before today: under Kafka's default
    # retention (7 days) the broker deletes them within seconds (its retention check runs every 2 s).
    admin = AdminClient({"bootstrap.servers": broker})
    admin.create_topics([NewTopic(topic_name, 3, config={"retention.ms": "-1"})])[topic_name].result(30)
    summary = produce(topic_name, 600, partitions=3, definition=definition, seed=21, clock=stepping_clock(),
                      manifest_path=manifest, **mix)
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    records = DefinitionEvents(definition, 21, value_bytes=200, clock=stepping_clock(), **mix).take(600)  # again
    consumed = read_topic(broker, topic_name, 3)

    assert len(lines) == 600 and sorted(line["seq"] for line in lines) == list(range(600))
    assert {(line["partition"], line["offset"]) for line in lines} == set(consumed)
    kinds, reasons = events.count_kinds(records, spec.reasons)
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
        assert spec.violations(value, msg.timestamp()[1]) == ([line["reason"]] if line["kind"] == "malformed" else [])
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


def logged_batches(topic: str, partitions: int) -> list[list[tuple[int, int]]]:
    """(base offset, record count) of every record batch the broker wrote to each partition's
    log segments, as Kafka's own ``kafka.tools.DumpLogSegments`` reads them (one JVM for all)."""
    from streamlake.platform import broker as embedded
    from streamlake import jars

    segments = {p: sorted((embedded.data_dir(1) / f"{topic}-{p}").glob("*.log")) for p in range(partitions)}
    assert all(segments.values()), f"no log segments of {topic} under {embedded.data_dir(1)}"
    out = subprocess.run([embedded.java_executable(), "-cp", jars.classpath(embedded.JAR_SET),
                          "kafka.tools.DumpLogSegments", "--files",
                          ",".join(str(f) for p in range(partitions) for f in segments[p])],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    batches: dict[str, list[tuple[int, int]]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("Dumping "):
            current = batches.setdefault(Path(line.split(" ", 1)[1]).parent.name, [])
        elif (m := re.match(r"baseOffset: (\d+) lastOffset: (\d+) count: (\d+) ", line)):
            current.append((int(m[1]), int(m[3])))
    return [batches.get(f"{topic}-{p}", []) for p in range(partitions)]


def test_one_per_batch_writes_every_record_as_its_own_record_batch(broker, produce, topic_name):
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
    # The broker's own log segments hold the same batches (what it stored, not only what a Fetch answered).
    for topic in (live, bulk):
        assert logged_batches(topic, 2) == shapes[topic]


def test_streamlake_produce_prints_the_counts_and_refuses_bad_fractions(broker, topic_name, tmp_path):
    def run(*flags):
        return subprocess.run([STREAMLAKE, "produce", "--quiet", "--definition", str(ORDERS), *flags], env=os.environ, capture_output=True,
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


def test_produce_without_a_definition_makes_the_demo_pipelines_records_and_says_so(broker, topic_name):
    """A script written for the earlier CLI (no --definition; its flags: --topic, --count,
    --partitions, --value-bytes, --seed) keeps working: the demo's records, and one line on
    stderr that says so."""
    import time

    from confluent_kafka import Consumer

    done = subprocess.run([STREAMLAKE, "produce", "--quiet", "--topic", topic_name, "--count", "20", "--partitions", "2",
                           "--value-bytes", "256", "--seed", "1"],
                          env=os.environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    demo = ROOT / "pipelines" / "sensors.yaml"
    said = [line for line in done.stderr.splitlines() if "--definition" in line]
    assert said == [f"produce: no --definition given: records of the demo pipeline, {demo}"], done.stderr
    assert json.loads(done.stdout)["records"] == 20
    sensors = load_definition(demo)
    fields = set(sensors.field_names)
    consumer = Consumer({"bootstrap.servers": os.environ["STREAMLAKE_KAFKA_BOOTSTRAP"], "group.id": topic_name,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic_name])
    values = []
    deadline = time.monotonic() + 30
    while len(values) < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(json.loads(msg.value()))
    consumer.close()
    assert len(values) == 20
    # --value-bytes pads each value with an undeclared "pad" field (DefinitionEvents)
    assert all(isinstance(v, dict) and set(v) <= fields | {"pad"} and sensors.event_time in v for v in values), values[:3]
