"""What a pipeline's gold tables must hold, computed by the tests alone, in plain Python.

Independent of the platform's code: it reads the definition's YAML itself, assigns
windows and merges sessions with its own arithmetic, and aggregates the typed values
the data generator labelled each record with (the values it put into the JSON). The
tests compare every gold table with it, window by window.

Semantics, as the README states them: tumbling windows ``[k*size, (k+1)*size)`` from
the epoch; sliding windows of ``size`` every ``slide``; sessions per key
``[first event, last event + gap)``, where an event at or before the current session's
end joins it; ``count(*)``, ``count(f)`` (non-null), ``sum(f)`` exact (doubles rounded
half-up to 9 decimal places first, as ``CAST(d AS DECIMAL(38,9))``), ``min``/``max``,
``avg`` = exact sum / count.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections import defaultdict
from pathlib import Path

import yaml

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
NINE = decimal.Decimal("0.000000001")


def duration_ms(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text.strip()).groups()
    return int(number) * UNITS[unit]


def micros(t: dt.datetime) -> int:
    return (t - EPOCH) // dt.timedelta(microseconds=1)


def load(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def windows_of(t_us: int, window: str) -> list[tuple[int, int]]:
    """Fixed windows (µs) an event at ``t_us`` belongs to."""
    kind, spec = window.split(":", 1)
    if kind == "tumbling":
        size = duration_ms(spec) * 1000
        start = t_us - t_us % size
        return [(start, start + size)]
    size_text, slide_text = spec.split(",")
    size, slide = duration_ms(size_text) * 1000, duration_ms(slide_text) * 1000
    out, start = [], t_us - t_us % slide
    while start > t_us - size:
        out.append((start, start + size))
        start -= slide
    return sorted(out)


def _value_of(value, sql_type: str):
    """A typed value as the exact number its sums add (None stays None)."""
    if value is None:
        return None
    if sql_type == "double":
        return decimal.Decimal(repr(float(value))).quantize(NINE, rounding=decimal.ROUND_HALF_UP)
    return decimal.Decimal(value)


def measures(rows: list[dict], spec: dict, schema: dict) -> dict:
    """The measures of one window over its events' typed fields."""
    out = {"_events": len(rows)}
    for column, expression in spec.items():
        function, arg = re.fullmatch(r"(\w+)\((\*|\w+)\)", expression.replace(" ", "")).groups()
        values = [] if arg == "*" else [r.get(arg) for r in rows if r.get(arg) is not None]
        if function == "count":
            out[column] = len(rows) if arg == "*" else len(values)
        elif function == "sum":
            out[column] = sum((_value_of(v, schema[arg]) for v in values), decimal.Decimal(0)) if values else None
        elif function == "min":
            out[column] = min(values) if values else None
        elif function == "max":
            out[column] = max(values) if values else None
        elif function == "avg":
            total = sum((_value_of(v, schema[arg]) for v in values), decimal.Decimal(0))
            out[column] = float(total / len(values)) if values else None
        else:
            raise ValueError(expression)
    return out


def expected_gold(definition: dict, aggregate: str, events: list[dict]) -> dict[tuple, dict]:
    """``{(keys..., window_start µs, window_end µs): measures}`` for one aggregate over the
    valid, de-duplicated ``events`` (typed field values by name)."""
    agg = next(a for a in definition["aggregates"] if a["name"] == aggregate)
    keys = list(agg.get("keys") or [])
    schema = {name: str(t).lower().replace(" ", "") for name, t in definition["schema"].items()}
    event_time = definition["event_time"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    kind, spec = agg["window"].split(":", 1)
    if kind == "session":
        gap = duration_ms(spec) * 1000
        by_key: dict[tuple, list[dict]] = defaultdict(list)
        for e in events:
            by_key[tuple(e[k] for k in keys)].append(e)
        for key, rows in by_key.items():
            rows.sort(key=lambda e: micros(e[event_time]))
            session: list[dict] = []
            end = None
            for e in rows:
                t = micros(e[event_time])
                if session and t <= end:
                    session.append(e)
                    end = max(end, t + gap)
                else:
                    if session:
                        groups[(*key, micros(session[0][event_time]), end)] = session
                    session, end = [e], t + gap
            if session:
                groups[(*key, micros(session[0][event_time]), end)] = session
    else:
        for e in events:
            for start, end in windows_of(micros(e[event_time]), agg["window"]):
                groups[(*(e[k] for k in keys), start, end)].append(e)
    return {window: measures(rows, agg["measures"], schema) for window, rows in groups.items()}


def compare_gold(expected: dict[tuple, dict], gold_rows: list[dict], keys: list[str]) -> list[str]:
    """Differences between the expected windows and gold's rows (empty: equal). ``avg``
    measures (floats) within 1e-9, everything else exactly."""
    have = {}
    for row in gold_rows:
        have[(*(row[k] for k in keys), micros(row["window_start"]), micros(row["window_end"]))] = row
    problems = []
    for window in sorted(set(expected) - set(have), key=repr)[:5]:
        problems.append(f"missing in gold: {window}")
    for window in sorted(set(have) - set(expected), key=repr)[:5]:
        problems.append(f"extra in gold: {window} {have[window]}")
    for window in sorted(set(expected) & set(have), key=repr):
        for column, value in expected[window].items():
            got = have[window][column]
            same = (abs(got - value) <= 1e-9) if isinstance(value, float) and got is not None else got == value
            if not same:
                problems.append(f"{window} {column}: gold {got!r}, expected {value!r}")
    return problems
