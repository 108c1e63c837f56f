"""An aggregate's late_events table for people: pending and applied late events per hour of event time.

Gold keeps every event that arrived after its window closed in
``late_events/<aggregate>`` (:mod:`streamlake.pipeline.gold`); backfills apply
them (:mod:`streamlake.pipeline.backfill`). :func:`hourly_summary` is what the
UI's *Late events* view and ``streamlake backfill --dry-run`` users look at: per
hour, how many are waiting, how many were applied, and which gold windows the
waiting ones touch.
"""

from __future__ import annotations

import datetime as dt

from streamlake.delta.table import open_table, parquet_dataset, snapshot_files
from streamlake.pipeline.definition import Aggregate, PipelineDefinition


def hourly_summary(definition: PipelineDefinition, aggregate: Aggregate, late_path: str,
                   example_windows: int = 5) -> list[dict]:
    """Per hour of event time (newest first): ``pending``, ``applied``, the number of gold
    windows the pending ones touch and a few of them. Empty when there is no table."""
    from streamlake.pipeline.backfill import describe_key

    try:
        files = snapshot_files(open_table(late_path))
    except FileNotFoundError:
        return []
    if not files:
        return []
    columns = [*aggregate.keys, definition.event_time, "applied", "windows"]
    data = parquet_dataset(files).to_table(columns=columns).to_pylist()
    hours: dict[dt.datetime, dict] = {}
    for row in data:
        time = row[definition.event_time]
        hour = time.replace(minute=0, second=0, microsecond=0)
        entry = hours.setdefault(hour, {"hour": hour, "pending": 0, "applied": 0, "_windows": set()})
        if row["applied"]:
            entry["applied"] += 1
        else:
            entry["pending"] += 1
            key = describe_key(tuple(row[k] for k in aggregate.keys))
            entry["_windows"].update((key, w["start"], w["end"]) for w in row["windows"])
    out = []
    for hour in sorted(hours, reverse=True):
        entry = hours[hour]
        touched = sorted(entry.pop("_windows"), key=lambda w: (w[1], w[0]))
        out.append({**entry, "end": hour + dt.timedelta(hours=1), "windows": len(touched),
                    "example_windows": [f"{k} [{a:%H:%M:%S}, {b:%H:%M:%S})" for k, a, b in touched[:example_windows]]})
    return out


def pending_count(definition: PipelineDefinition, aggregate: Aggregate, late_path: str) -> int:
    return sum(h["pending"] for h in hourly_summary(definition, aggregate, late_path, 0))
