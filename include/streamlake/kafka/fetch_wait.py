"""How long a fetch may wait at the broker (``fetch.wait.max.ms``), chosen per process.

The setting decides two costs that pull in opposite directions:

* **Reading data.** A broker answers a fetch as soon as it has records, so on
  Apache Kafka the setting does not slow reads at all. The embedded broker
  (Tansu 0.6) however lists *every record batch of the partition* for each
  fetch and answers with (almost) nothing when that takes longer than the
  wait. A live producer writes about one record per batch, so the cost grows
  with the topic: measured here, 30,000 one-record batches need more than 10 ms
  and 100,000 more than 50 ms; below that the reader gets a few records per
  second, above it 20,000-80,000.
* **Reaching the end.** A fetch at the end of the log is held for the whole
  wait before the broker reports "nothing more" (partition EOF), and a consumer
  reused after it waits for that fetch to come back.

No single value serves both on every broker and every topic size, so readers
start low (:data:`STEPS_MS`\\[0]) and move up a step when a read *stalls*:
records are known to be there (the read has not reached its end and the
broker did not report the end of what is readable) yet fewer than
:data:`MIN_RECORDS_PER_WINDOW` arrive in a window of ``max(0.3 s, 3 x wait)``.
The step reached is kept in the process (one Spark Python worker, one CLI
run, the driver), per cluster and per kind of read, so later reads start there;
a raised step comes down one step after :data:`DECAY_S` seconds, so a wait
raised by a passing slowdown (a busy broker) does not stay forever, and a
partition that still needs it raises it again within one stall window:
range reads (``"read"``) and end-of-partition probes (``"probe"``, which mostly
fetch at the end, where a short wait is what matters) move independently. A user who sets
``kafka.fetch.wait.max.ms`` gets exactly that value and no adaptation.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

log = logging.getLogger(__name__)

PROPERTY = "fetch.wait.max.ms"
STEPS_MS = (50, 250, 1000, 4000)
DECAY_S = 60.0
MIN_RECORDS_PER_WINDOW = 100
MIN_WINDOW_S = 0.3

_lock = threading.Lock()
_step: dict[tuple[str, str], int] = {}  # (bootstrap servers, kind of read) -> index into STEPS_MS
_raised_at: dict[tuple[str, str], float] = {}  # when the step last moved


def _key(conf: Mapping[str, str], role: str) -> tuple[str, str]:
    return str(conf.get("bootstrap.servers", "")), role


def is_fixed(conf: Mapping[str, str]) -> bool:
    """True when the user set ``fetch.wait.max.ms`` themselves (never adapted)."""
    return PROPERTY in conf


def current_ms(conf: Mapping[str, str], role: str = "read") -> int:
    """The wait new consumers of this cluster get in this process for ``role``."""
    if is_fixed(conf):
        return int(conf[PROPERTY])
    key = _key(conf, role)
    with _lock:
        index = _step.get(key, 0)
        if index and time.monotonic() - _raised_at.get(key, 0.0) > DECAY_S:
            index = _step[key] = index - 1
            _raised_at[key] = time.monotonic()
        return STEPS_MS[index]


def raise_step(conf: Mapping[str, str], from_ms: int, role: str = "read") -> int | None:
    """Move this cluster's wait one step above ``from_ms``; the new wait, or None
    when it is fixed by the user or already at the top. Several readers may
    report the same stall: the step moves once per ``from_ms``."""
    if is_fixed(conf):
        return None
    key = _key(conf, role)
    with _lock:
        index = _step.get(key, 0)
        if STEPS_MS[index] > from_ms:  # another reader already moved it
            return STEPS_MS[index]
        if index + 1 >= len(STEPS_MS):
            return None
        _step[key] = index + 1
        _raised_at[key] = time.monotonic()
        new = STEPS_MS[index + 1]
    log.info("Kafka %ss from %s stall with fetch.wait.max.ms=%d (the broker needs longer per fetch, "
             "as the embedded broker does on partitions of many small record batches); using %d ms",
             role, key[0], from_ms, new)
    return new


class StallDetector:
    """Decides, window by window, whether a read that should be receiving records stalls.

    Call :meth:`records` for every batch of records received and
    :meth:`end_reported` when the broker says nothing more is readable now
    (partition EOF at the read position); ask :meth:`stalled` on every loop.
    """

    def __init__(self, wait_ms: int, min_records: int = MIN_RECORDS_PER_WINDOW, clock=time.monotonic):
        self.clock = clock
        self.min_records = min_records
        self.window_s = max(MIN_WINDOW_S, 3 * wait_ms / 1000)
        self._start = clock()
        self._received = 0
        self._end_seen = False

    def records(self, n: int) -> None:
        self._received += n

    def end_reported(self) -> None:
        self._end_seen = True

    def stalled(self) -> bool:
        """True once per window in which too few records arrived although the
        broker never reported the end; starts a new window whenever one is over."""
        now = self.clock()
        if now - self._start < self.window_s:
            return False
        stalled = self._received < self.min_records and not self._end_seen
        self._start, self._received, self._end_seen = now, 0, False
        return stalled
