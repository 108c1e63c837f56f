"""Keeping a continuous job running: Flink's restart strategies around a Spark job.

``fixed-delay``
    restart after ``delay_s``, at most ``attempts`` times in a row;
``failure-rate``
    restart after ``delay_s`` as long as there were at most ``max_failures``
    failures within the last ``interval_s`` seconds;
``none``
    never restart.

Restarts are safe because the job is exactly-once (a killed micro-batch is
replayed from the checkpoint and committed once). :func:`supervise` runs the
job, logs every restart with its cause, and raises :class:`GaveUp` with the
strategy's reason when it stops restarting. A job that exits 0 was stopped on
request: supervision ends successfully.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable

from streamlake.errors import InvalidOptionError, StreamLakeError

log = logging.getLogger(__name__)


class GaveUp(StreamLakeError):
    """The restart strategy gave up; the message says which rule and the last failure."""


class JobFailed(Exception):
    """One run of the job failed; ``cause`` is a readable reason."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True)
class RestartStrategy:
    kind: str  # "fixed-delay" | "failure-rate" | "none"
    attempts: int = 3  # fixed-delay
    delay_s: float = 10.0
    max_failures: int = 3  # failure-rate
    interval_s: float = 300.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed-delay", "failure-rate", "none"):
            raise InvalidOptionError(f"restart strategy must be fixed-delay, failure-rate or none, got {self.kind!r}")
        if self.attempts < 0 or self.max_failures < 0 or self.delay_s < 0 or self.interval_s <= 0:
            raise InvalidOptionError("restart strategy numbers must be >= 0 (interval > 0)")

    def describe(self) -> str:
        if self.kind == "fixed-delay":
            return f"fixed-delay ({self.attempts} attempts, {self.delay_s:g}s delay)"
        if self.kind == "failure-rate":
            return f"failure-rate (at most {self.max_failures} failures per {self.interval_s:g}s, {self.delay_s:g}s delay)"
        return "none (no restarts)"


class RestartPolicy:
    """The decision part of a strategy: after a failure at time ``now``, restart or not."""

    def __init__(self, strategy: RestartStrategy):
        self.strategy = strategy
        self.consecutive = 0
        self.failures: collections.deque[float] = collections.deque()

    def on_success(self) -> None:
        self.consecutive = 0

    def on_failure(self, now: float) -> tuple[bool, str]:
        """(restart?, reason)."""
        s = self.strategy
        self.consecutive += 1
        self.failures.append(now)
        while self.failures and now - self.failures[0] > s.interval_s:
            self.failures.popleft()
        if s.kind == "none":
            return False, "restart strategy is none"
        if s.kind == "fixed-delay":
            if self.consecutive > s.attempts:
                return False, f"fixed-delay: {s.attempts} restart attempts used up"
            return True, f"fixed-delay: restart {self.consecutive} of {s.attempts}"
        if len(self.failures) > s.max_failures:
            return False, (f"failure-rate: {len(self.failures)} failures within {s.interval_s:g}s "
                           f"exceeds the maximum of {s.max_failures}")
        return True, f"failure-rate: {len(self.failures)} of at most {s.max_failures} failures in {s.interval_s:g}s"


@dataclass
class SupervisionResult:
    runs: int
    restarts: int
    causes: list[str]


def supervise(run_job: Callable[[], None], strategy: RestartStrategy, *, stop_requested: Callable[[], bool] = lambda: False,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              healthy_after_s: float = 60.0) -> SupervisionResult:
    """Run ``run_job`` until it returns (stopped on request), restarting it on JobFailed.

    A run that lasted ``healthy_after_s`` resets fixed-delay's attempt counter
    (as a successful checkpoint does in Flink). Raises GaveUp when the strategy
    says so; returns early if a stop is requested while waiting to restart.
    """
    policy = RestartPolicy(strategy)
    causes: list[str] = []
    runs = 0
    while True:
        runs += 1
        started = clock()
        try:
            run_job()
            log.info("job ended normally after %d run(s)", runs)
            return SupervisionResult(runs, runs - 1, causes)
        except JobFailed as failure:
            now = clock()
            if now - started >= healthy_after_s:
                policy.on_success()
            causes.append(failure.cause)
            restart, reason = policy.on_failure(now)
            if not restart:
                raise GaveUp(f"giving up after {runs} run(s): {reason}; last failure: {failure.cause}") from None
            log.warning("job failed (%s); %s; restarting in %gs", failure.cause, reason, strategy.delay_s)
            sleep(strategy.delay_s)
            if stop_requested():
                log.info("stop requested while waiting to restart")
                return SupervisionResult(runs, runs - 1, causes)
