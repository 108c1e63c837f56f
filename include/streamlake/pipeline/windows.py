"""Event-time windows: which windows an event belongs to, and when a window is closed.

Three kinds, written as a CLI/job setting:

``tumbling:1m``
    fixed, non-overlapping windows of the given size, aligned to the epoch;
``sliding:5m,1m``
    windows of 5 minutes starting every minute (an event is in size/slide of them);
``session:30s``
    per sensor, events at most the gap apart belong to one session
    ``[first event, last event + gap)``; sessions grow and merge as events arrive.

Durations are ``<number><unit>`` with unit ``ms``, ``s``, ``m``, ``h`` or ``d``.
A window is *closed* when its end is at or before the watermark; an event is
late for a window that was closed when the event arrived.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamlake.errors import InvalidOptionError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(text: str, what: str = "duration") -> int:
    """``"30s"`` -> 30000. Raises InvalidOptionError for anything else, or zero."""
    match = _DURATION.match(str(text))
    if not match:
        raise InvalidOptionError(f"{what} must look like 500ms, 30s, 1m, 2h or 1d, got {text!r}")
    value = int(match.group(1)) * _UNITS_MS[match.group(2)]
    if value <= 0:
        raise InvalidOptionError(f"{what} must be positive, got {text!r}")
    return value


def format_duration_ms(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class WindowSpec:
    """A window definition; all times are epoch milliseconds (UTC)."""

    kind: str  # "tumbling" | "sliding" | "session"
    size_ms: int  # window length; for sessions, the gap
    slide_ms: int | None = None

    @classmethod
    def parse(cls, text: str) -> "WindowSpec":
        """``tumbling:1m`` | ``sliding:5m,1m`` | ``session:30s``. Raises InvalidOptionError."""
        kind, _, rest = str(text).partition(":")
        kind = kind.strip().lower()
        if kind == "tumbling" and rest:
            return cls("tumbling", parse_duration_ms(rest, "tumbling window size"))
        if kind == "sliding" and rest:
            size, _, slide = rest.partition(",")
            spec = cls("sliding", parse_duration_ms(size, "sliding window size"),
                       parse_duration_ms(slide, "sliding window slide") if slide else None)
            if spec.slide_ms is None or spec.slide_ms > spec.size_ms or spec.size_ms % spec.slide_ms:
                raise InvalidOptionError(f"sliding windows need a slide that divides the size, like "
                                         f"sliding:5m,1m; got {text!r}")
            return spec
        if kind == "session" and rest:
            return cls("session", parse_duration_ms(rest, "session gap"))
        raise InvalidOptionError(f"window must be tumbling:SIZE, sliding:SIZE,SLIDE or session:GAP "
                                 f"(e.g. tumbling:1m), got {text!r}")

    def __str__(self) -> str:
        if self.kind == "sliding":
            return f"sliding:{format_duration_ms(self.size_ms)},{format_duration_ms(self.slide_ms)}"
        return f"{self.kind}:{format_duration_ms(self.size_ms)}"

    @property
    def is_session(self) -> bool:
        return self.kind == "session"

    def windows_of(self, event_ms: int) -> list[tuple[int, int]]:
        """The fixed windows ``(start, end)`` an event belongs to, oldest first.

        For sessions this is the event's own proto-session ``[t, t + gap)``,
        which is what decides whether the event is late.
        """
        if self.kind == "tumbling":
            start = event_ms - event_ms % self.size_ms
            return [(start, start + self.size_ms)]
        if self.kind == "sliding":
            last = event_ms - event_ms % self.slide_ms
            starts = range(last - self.size_ms + self.slide_ms, last + 1, self.slide_ms)
            return [(s, s + self.size_ms) for s in starts]
        return [(event_ms, event_ms + self.size_ms)]

    def windows_overlapping(self, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
        """Fixed windows that contain any instant of ``[start_ms, end_ms)`` (not for sessions)."""
        if self.is_session:
            raise ValueError("session windows are not fixed")
        step = self.size_ms if self.kind == "tumbling" else self.slide_ms
        first = self.windows_of(start_ms)[0][0]
        out = []
        s = first
        while s < end_ms:
            out.append((s, s + self.size_ms))
            s += step
        return out


def merge_sessions(sessions: list[tuple[int, int]], gap_ms: int) -> list[list[int]]:
    """Group intervals ``[start, end)`` (ends already include the gap) into merged
    sessions: two intervals belong together when they overlap or touch.
    Returns the indexes of ``sessions`` per merged session, in time order."""
    order = sorted(range(len(sessions)), key=lambda i: sessions[i])
    groups: list[list[int]] = []
    current_end = None
    for i in order:
        start, end = sessions[i]
        if current_end is not None and start <= current_end:
            groups[-1].append(i)
            current_end = max(current_end, end)
        else:
            groups.append([i])
            current_end = end
    return groups
