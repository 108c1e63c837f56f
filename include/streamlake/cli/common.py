"""Helpers shared by the command groups."""

from __future__ import annotations

import json

from streamlake.errors import StreamLakeError


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def kafka_options(items) -> dict[str, str]:
    """``--kafka-option KEY=VALUE`` flags as client properties (``kafka.`` prefix optional)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise StreamLakeError(f"--kafka-option expects KEY=VALUE, got {item!r}")
        out[key.removeprefix("kafka.")] = value
    return out
