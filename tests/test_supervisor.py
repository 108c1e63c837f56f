"""Restart strategies (Flink's fixed-delay, failure-rate, none), on a fake clock."""

import pytest

from streamlake.errors import InvalidOptionError
from streamlake.operations.supervisor import GaveUp, JobFailed, RestartStrategy, supervise


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def _job(outcomes, fake, run_seconds=1.0):
    """A job whose runs fail (a cause string) or end normally (None), taking run_seconds each."""
    outcomes = list(outcomes)

    def run():
        fake.now += run_seconds
        cause = outcomes.pop(0)
        if cause is not None:
            raise JobFailed(cause)

    return run


def test_fixed_delay_restarts_up_to_its_attempts_then_gives_up():
    fake = FakeTime()
    strategy = RestartStrategy("fixed-delay", attempts=2, delay_s=5)
    with pytest.raises(GaveUp, match=r"fixed-delay: 2 restart attempts used up; last failure: boom 3"):
        supervise(_job(["boom 1", "boom 2", "boom 3"], fake), strategy, clock=fake.clock, sleep=fake.sleep)
    assert fake.sleeps == [5, 5]


def test_fixed_delay_counter_resets_after_a_healthy_run():
    fake = FakeTime()
    strategy = RestartStrategy("fixed-delay", attempts=1, delay_s=1)
    outcomes = ["crash", "crash-after-a-long-healthy-run", None]
    durations = iter([1, 120, 1])

    def run():
        fake.now += next(durations)
        cause = outcomes.pop(0)
        if cause:
            raise JobFailed(cause)

    result = supervise(run, strategy, clock=fake.clock, sleep=fake.sleep, healthy_after_s=60)
    assert result.restarts == 2 and result.causes == ["crash", "crash-after-a-long-healthy-run"]


def test_failure_rate_tolerates_spread_failures_but_not_a_burst():
    fake = FakeTime()
    strategy = RestartStrategy("failure-rate", max_failures=2, interval_s=100, delay_s=60)
    # failures at t=1, 62, 123, 184: never more than 2 within 100 s -> keeps restarting, then stops normally
    result = supervise(_job(["a", "b", "c", "d", None], fake), strategy, clock=fake.clock, sleep=fake.sleep)
    assert result.restarts == 4
    fake = FakeTime()
    burst = RestartStrategy("failure-rate", max_failures=2, interval_s=100, delay_s=1)
    with pytest.raises(GaveUp, match="3 failures within 100s exceeds the maximum of 2"):
        supervise(_job(["a", "b", "c"], fake), burst, clock=fake.clock, sleep=fake.sleep)


def test_none_never_restarts_and_stop_during_delay_ends_cleanly():
    fake = FakeTime()
    with pytest.raises(GaveUp, match="restart strategy is none; last failure: x"):
        supervise(_job(["x"], fake), RestartStrategy("none"), clock=fake.clock, sleep=fake.sleep)
    result = supervise(_job(["x"], fake), RestartStrategy("fixed-delay", attempts=3, delay_s=1),
                       stop_requested=lambda: True, clock=fake.clock, sleep=fake.sleep)
    assert result.runs == 1 and result.causes == ["x"]
    with pytest.raises(InvalidOptionError):
        RestartStrategy("exponential")
