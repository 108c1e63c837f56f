"""Definition changes against existing tables: what applies from now on, what is refused.

A pipeline's root keeps the definition its tables were built with (the
*applied* definition, ``_control/definition.json``). Each run compares the
definition file with it (:func:`plan_change`):

applies from the next micro-batch on
    an optional field added (silver and late events get the column; earlier
    rows read null), a field made optional or required, rules added, removed
    or changed, ``dedup_horizon`` and ``max_future``, topics added, an
    aggregate's ``allowed_lateness``, the description and ``datagen``;
built from silver
    an aggregate added: its gold stage starts at silver's beginning, so its
    table holds everything silver holds, proven like any gold;
no longer maintained
    an aggregate removed: its tables stay as they are (not updated, not
    checked); add it back under the same name only with the same window,
    keys and measures;
refused (:class:`IncompatibleDefinitionError`, nothing changes)
    anything that would make existing rows wrong: a field's type, the event
    time, the event id, a required field added, a field removed, the format,
    an aggregate's keys, window or measures. The message says what to do: run
    the pipeline under a new root (its tables are built again from Kafka), or
    give the changed aggregate a new name (a new gold table built from silver).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from streamlake.errors import StreamLakeError
from streamlake.pipeline.definition import PipelineDefinition, parse_definition

DEFINITION_FILE = "definition.json"


class IncompatibleDefinitionError(StreamLakeError):
    """A definition change would make existing tables wrong; nothing was changed."""


def _record_path(root: str | Path) -> Path:
    """The record of ``root`` (in its state directory: the driver's disk for an object-store root)."""
    from streamlake.storage.location import state_dir

    return Path(state_dir(root)) / "_control" / DEFINITION_FILE


def _record(root) -> dict | None:
    try:
        return json.loads(_record_path(root).read_text())
    except (OSError, ValueError):
        return None


def applied_definition(root: str | Path) -> PipelineDefinition | None:
    """The definition the tables under ``root`` were built with (None: nothing applied yet)."""
    from dataclasses import replace

    record = _record(root)
    if not record:
        return None
    return replace(parse_definition(record["definition"], str(_record_path(root))), source=record.get("file"))


def applied_definition_file(root: str | Path) -> str | None:
    """The file the applied definition was last read from."""
    return (_record(root) or {}).get("file")


def plan_change(applied: PipelineDefinition | None, new: PipelineDefinition) -> list[str]:
    """What changes when ``new`` replaces ``applied`` (readable lines; empty: nothing).
    Raises IncompatibleDefinitionError listing every change that would make existing
    rows wrong, with what to do instead."""
    if applied is None:
        return [f"new pipeline {new.name}"]
    refused: list[str] = []
    changes: list[str] = []
    if applied.name != new.name:
        refused.append(f"the pipeline's name changes from {applied.name} to {new.name}")
    if applied.format != new.format:
        refused.append(f"format changes from {applied.format} to {new.format}")
    if applied.event_time != new.event_time:
        refused.append(f"event_time changes from {applied.event_time} to {new.event_time}")
    if applied.event_id != new.event_id:
        refused.append(f"event_id changes from {applied.event_id} to {new.event_id}")
    old_fields = {f.name: f for f in applied.fields}
    new_fields = {f.name: f for f in new.fields}
    for name, f in old_fields.items():
        if name not in new_fields:
            refused.append(f"field {name} is removed (silver has it; keep it, optional if it may be missing)")
        elif new_fields[name].type != f.type:
            refused.append(f"field {name} changes type from {f.type} to {new_fields[name].type}")
        elif new_fields[name].required != f.required:
            changes.append(f"field {name} becomes {'required' if new_fields[name].required else 'optional'}")
    for name, f in new_fields.items():
        if name not in old_fields:
            if f.required:
                refused.append(f"required field {name} is added (earlier rows lack it; add it as optional)")
            else:
                changes.append(f"optional field {name} ({f.type}) is added")
    if [(r.name, r.check) for r in applied.rules] != [(r.name, r.check) for r in new.rules]:
        changes.append("rules change: " + ", ".join(r.name for r in new.rules) if new.rules else "rules removed")
    for what in ("dedup_horizon_ms", "max_future_ms"):
        if getattr(applied, what) != getattr(new, what):
            changes.append(f"{what.removesuffix('_ms')} changes")
    if set(applied.topics) != set(new.topics) or applied.topic_pattern != new.topic_pattern:
        if set(applied.topics) - set(new.topics) or applied.topic_pattern != new.topic_pattern:
            refused.append("topics are removed or the topic pattern changes (bronze holds their records)")
        else:
            changes.append(f"topics added: {', '.join(sorted(set(new.topics) - set(applied.topics)))}")
    old_aggs = {a.name: a for a in applied.aggregates}
    for agg in new.aggregates:
        old = old_aggs.get(agg.name)
        if old is None:
            changes.append(f"aggregate {agg.name} is added: gold/{agg.name} is built from silver")
            continue
        for what, a, b in (("keys", old.keys, agg.keys), ("window", old.window, agg.window),
                           ("measures", old.measures, agg.measures)):
            if a != b:
                refused.append(f"aggregate {agg.name}: its {what} change (gold/{agg.name} holds windows of the old "
                               f"ones; give the changed aggregate a new name and it is built from silver)")
        if old.allowed_lateness_ms != agg.allowed_lateness_ms:
            changes.append(f"aggregate {agg.name}: allowed lateness changes")
    for name in old_aggs:
        if name not in {a.name for a in new.aggregates}:
            changes.append(f"aggregate {name} is removed: gold/{name} and late_events/{name} stay as they are, "
                           "no longer maintained or checked")
    if refused:
        raise IncompatibleDefinitionError(
            f"definition {new.source or new.name} cannot replace the one pipeline {applied.name} was built with: "
            + "; ".join(refused) + ". Nothing was changed. Run it under a new --root (its tables are built again "
            "from Kafka), or undo these changes.")
    if applied.description != new.description or dict(applied.datagen) != dict(new.datagen):
        changes.append("description or datagen changes")
    return changes


def apply_definition(root: str | Path, definition: PipelineDefinition) -> list[str]:
    """Check ``definition`` against the root's applied one and record it (see the module
    docstring). Returns the changes; raises IncompatibleDefinitionError (nothing recorded)."""
    applied = applied_definition(root)
    changes = plan_change(applied, definition)
    if applied is not None and not changes:
        return []
    record = _record(root) or {}
    history = list(record.get("history", []))
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    history.append({"at": now, "file": definition.source, "changes": changes})
    path = _record_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"definition": definition.to_dict(), "file": definition.source, "applied_at": now,
                               "history": history[-50:]}, indent=2, default=str))
    os.replace(tmp, path)
    return changes
