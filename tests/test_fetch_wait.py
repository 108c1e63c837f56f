"""The fetch-wait ladder and stall detection (streamlake.kafka.fetch_wait), without a broker.

The module keeps per-process state (the step each cluster and kind of read has
reached); every test starts from an empty ladder, and a fake clock drives the
stall detector's windows.
"""

from __future__ import annotations

import threading

import pytest
from streamlake.kafka import fetch_wait
from streamlake.kafka.fetch_wait import (
    MIN_RECORDS_PER_WINDOW,
    MIN_WINDOW_S,
    STEPS_MS,
    StallDetector,
)

CLUSTER = {"bootstrap.servers": "broker-a:9092"}
OTHER_CLUSTER = {"bootstrap.servers": "broker-b:9092"}


@pytest.fixture(autouse=True)
def fresh_ladder(monkeypatch):
    """Each test gets its own, empty step table (the module's is process-wide)."""
    steps: dict = {}
    monkeypatch.setattr(fetch_wait, "_step", steps)
    monkeypatch.setattr(fetch_wait, "_raised_at", {})
    return steps


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds + 1e-9  # a full window ends exactly, whatever the float rounding


# -- the ladder -------------------------------------------------------------------------------


def test_reads_and_probes_start_at_the_lowest_step():
    assert STEPS_MS == tuple(sorted(STEPS_MS)) and len(set(STEPS_MS)) == len(STEPS_MS)
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[0]
    assert fetch_wait.current_ms(CLUSTER, "read") == STEPS_MS[0]
    assert fetch_wait.current_ms(CLUSTER, "probe") == STEPS_MS[0]


def test_each_stall_moves_one_step_up_until_the_top():
    seen = []
    wait = fetch_wait.current_ms(CLUSTER)
    while True:
        longer = fetch_wait.raise_step(CLUSTER, wait)
        if longer is None:
            break
        assert longer > wait
        assert fetch_wait.current_ms(CLUSTER) == longer, "new readers start at the step reached"
        seen.append(longer)
        wait = longer
    assert seen == list(STEPS_MS[1:])
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[-1]
    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[-1]) is None, "the top step stays"
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[-1]


def test_a_wait_fixed_by_the_user_is_never_adapted(fresh_ladder):
    fixed = {**CLUSTER, "fetch.wait.max.ms": "25"}
    assert fetch_wait.is_fixed(fixed) and not fetch_wait.is_fixed(CLUSTER)
    for role in ("read", "probe"):
        assert fetch_wait.current_ms(fixed, role) == 25
        for _ in range(len(STEPS_MS) + 1):
            assert fetch_wait.raise_step(fixed, 25, role) is None
        assert fetch_wait.current_ms(fixed, role) == 25
    assert fresh_ladder == {}, "a fixed wait leaves no step behind"
    # The user's value wins even where the cluster's ladder has moved (same servers, no fixed value).
    fetch_wait.raise_step(CLUSTER, STEPS_MS[0])
    assert fetch_wait.current_ms(fixed) == 25
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1]


def test_a_stall_reported_by_several_readers_moves_the_step_once():
    first = STEPS_MS[0]
    # Four readers made with the lowest wait all stall and report it.
    answers = [fetch_wait.raise_step(CLUSTER, first) for _ in range(4)]
    assert answers == [STEPS_MS[1]] * 4
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1]
    # A reader still on the lowest wait that reports late does not skip a step either.
    assert fetch_wait.raise_step(CLUSTER, first) == STEPS_MS[1]
    # A stall at the new step moves it on.
    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[1]) == STEPS_MS[2]
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[2]


def test_concurrent_reports_of_one_stall_move_the_step_once():
    barrier = threading.Barrier(16)
    answers = []

    def report():
        barrier.wait()
        answers.append(fetch_wait.raise_step(CLUSTER, STEPS_MS[0]))

    threads = [threading.Thread(target=report) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers == [STEPS_MS[1]] * 16
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1]


def test_reads_and_probes_climb_independently():
    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[0], "read") == STEPS_MS[1]
    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[1], "read") == STEPS_MS[2]
    assert fetch_wait.current_ms(CLUSTER, "read") == STEPS_MS[2]
    assert fetch_wait.current_ms(CLUSTER, "probe") == STEPS_MS[0], "a read stall does not slow end probes"

    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[0], "probe") == STEPS_MS[1]
    assert fetch_wait.current_ms(CLUSTER, "probe") == STEPS_MS[1]
    assert fetch_wait.current_ms(CLUSTER, "read") == STEPS_MS[2], "a probe stall does not move reads"


def test_clusters_climb_independently():
    fetch_wait.raise_step(CLUSTER, STEPS_MS[0])
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1]
    assert fetch_wait.current_ms(OTHER_CLUSTER) == STEPS_MS[0]
    # Other client properties (TLS, client ids) do not make a separate ladder.
    assert fetch_wait.current_ms({**CLUSTER, "security.protocol": "SSL"}) == STEPS_MS[1]


# -- stall detection --------------------------------------------------------------------------


@pytest.mark.parametrize("wait_ms, window_s", [(10, MIN_WINDOW_S), (50, MIN_WINDOW_S), (250, 0.75), (1000, 3.0),
                                               (4000, 12.0)])
def test_the_window_is_three_fetch_waits_and_at_least_the_minimum(wait_ms, window_s):
    assert StallDetector(wait_ms, clock=FakeClock()).window_s == pytest.approx(window_s)


def test_too_few_records_in_a_window_is_a_stall():
    clock = FakeClock()
    stall = StallDetector(10, clock=clock)
    stall.records(MIN_RECORDS_PER_WINDOW - 1)
    clock.advance(MIN_WINDOW_S / 2)
    assert not stall.stalled(), "the window is not over yet"
    clock.advance(MIN_WINDOW_S / 2)
    assert stall.stalled()


def test_enough_records_in_a_window_is_no_stall():
    clock = FakeClock()
    stall = StallDetector(10, clock=clock)
    for _ in range(MIN_RECORDS_PER_WINDOW // 10):
        stall.records(10)
        clock.advance(MIN_WINDOW_S / (MIN_RECORDS_PER_WINDOW // 10))
    assert not stall.stalled()


def test_a_read_at_the_end_of_the_log_is_no_stall():
    """No records because there are none yet (the broker reported the end): waiting longer would not help."""
    clock = FakeClock()
    stall = StallDetector(10, clock=clock)
    stall.end_reported()
    clock.advance(MIN_WINDOW_S)
    assert not stall.stalled()
    # The next window starts afresh: without an end report, silence is a stall again.
    clock.advance(MIN_WINDOW_S)
    assert stall.stalled()


def test_a_stall_is_reported_once_per_window():
    clock = FakeClock()
    stall = StallDetector(250, clock=clock)  # window 0.75 s
    clock.advance(0.75)
    assert stall.stalled()
    # Asked again in the same (new) window: no second report.
    for _ in range(5):
        clock.advance(0.1)
        assert not stall.stalled()
    clock.advance(0.3)
    assert stall.stalled()


def test_records_of_an_earlier_window_do_not_count_in_the_next():
    clock = FakeClock()
    stall = StallDetector(10, clock=clock)
    stall.records(10 * MIN_RECORDS_PER_WINDOW)
    clock.advance(MIN_WINDOW_S)
    assert not stall.stalled()
    stall.records(MIN_RECORDS_PER_WINDOW - 1)
    clock.advance(MIN_WINDOW_S)
    assert stall.stalled()


def test_min_records_one_is_what_end_probes_use():
    clock = FakeClock()
    stall = StallDetector(10, min_records=1, clock=clock)
    stall.records(1)
    clock.advance(MIN_WINDOW_S)
    assert not stall.stalled(), "one answer per window is enough for a probe"
    clock.advance(MIN_WINDOW_S)
    assert stall.stalled()


def test_a_reader_climbs_the_ladder_as_its_windows_stall():
    """The reader's loop, as read_range runs it: stalled window -> next step -> new detector."""
    clock = FakeClock()
    wait = fetch_wait.current_ms(CLUSTER)
    stall = StallDetector(wait, clock=clock)
    climbed = []
    for _ in range(3):
        clock.advance(stall.window_s)
        assert stall.stalled()
        wait = fetch_wait.raise_step(CLUSTER, wait)
        climbed.append(wait)
        stall = StallDetector(wait, clock=clock)
    assert climbed == list(STEPS_MS[1:4])
    # Now records flow: the step stays where it is.
    stall.records(MIN_RECORDS_PER_WINDOW)
    clock.advance(stall.window_s)
    assert not stall.stalled()
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[3]


def test_a_raised_step_comes_down_one_step_after_the_decay_time(monkeypatch):
    """A wait raised by a passing slowdown does not stay: after DECAY_S it is one step
    lower, and a partition that still needs it raises it again on its next stall."""
    clock = FakeClock()
    monkeypatch.setattr(fetch_wait.time, "monotonic", clock)
    fetch_wait.raise_step(CLUSTER, STEPS_MS[0])
    fetch_wait.raise_step(CLUSTER, STEPS_MS[1])
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[2]
    clock.advance(fetch_wait.DECAY_S / 2)
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[2], "not before the decay time"
    clock.advance(fetch_wait.DECAY_S)
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1]
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[1], "one step per decay time, not per call"
    clock.advance(fetch_wait.DECAY_S + 1)
    assert fetch_wait.current_ms(CLUSTER) == STEPS_MS[0]
    assert fetch_wait.raise_step(CLUSTER, STEPS_MS[0]) == STEPS_MS[1], "a stall raises it again"
