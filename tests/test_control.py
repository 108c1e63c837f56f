"""Stop/pause at micro-batch boundaries (JobControl) and savepoints of a job that is finishing.

Issue 6 item 4: a savepoint that waits for a job to pause, while the job (an
available-now run) ends at a micro-batch boundary instead, is taken at that
boundary; it is not an error. The unit tests drive ``JobControl.quiesced``
with a thread that behaves like the job's driver (it holds the job lock and
obeys the control files as ``run_ingest`` does); the last test takes a real
savepoint of a real available-now ingest while it runs.
"""

from __future__ import annotations

import threading
import time

import pytest
from streamlake.pipeline.control import JobControl


class FakeJob:
    """A job driver in a thread: holds the job lock while it "runs micro-batches" and obeys
    PAUSE/STOP as ``run_ingest`` does; with ``finish_instead_of_pausing`` it ends at the
    boundary where it sees PAUSE (an available-now run whose last batch that was)."""

    def __init__(self, control: JobControl, finish_instead_of_pausing: bool = False, last_batch: int = 7):
        self.control = control
        self.finish_instead_of_pausing = finish_instead_of_pausing
        self.last_batch = last_batch
        self.started = threading.Event()
        self.outcome: str | None = None
        self.pauses = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeJob:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def _run(self) -> None:
        try:
            with self.control.running(timeout_s=10):
                self.started.set()
                while True:
                    while not (self.control.pause_requested() or self.control.stop_requested()):
                        time.sleep(0.01)  # micro-batches
                    if self.control.stop_requested():
                        self.outcome = "stopped"
                        break
                    if self.finish_instead_of_pausing:
                        self.outcome = "finished"  # at a boundary, without writing PAUSED
                        break
                    self.control.mark_paused({"paused_at": time.time(), "last_batch": self.last_batch})
                    self.pauses += 1
                    while self.control.pause_requested() and not self.control.stop_requested():
                        time.sleep(0.01)
                    self.control.clear_paused()
                    if self.control.stop_requested():
                        self.outcome = "stopped"
                        break
                    self.outcome = "resumed"
                self.control.clear_requests()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc
            self.started.set()

    def join(self, timeout: float = 10) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the fake job did not end"
        assert self.error is None, self.error


def lock_is_held_against_a_starting_job(control: JobControl) -> bool:
    """True if a job starting now would have to wait for the lock."""
    try:
        with control.running(timeout_s=0.3):
            return False
    except TimeoutError:
        return True


@pytest.fixture
def control(tmp_path):
    return JobControl(tmp_path / "checkpoint")


def test_a_job_that_finishes_instead_of_pausing_is_quiesced_at_that_boundary(control):
    job = FakeJob(control, finish_instead_of_pausing=True).start()
    assert control.is_running()
    with control.quiesced(timeout_s=10) as paused:
        assert paused is None, "the job ended at a boundary: nothing paused to report, and no error"
        assert job.outcome == "finished" and not job.thread.is_alive()
        assert not control.pause_requested(), "the pause request is withdrawn, the next run must not pause"
        assert lock_is_held_against_a_starting_job(control), "no run can start while the body runs"
    job.join()
    assert not control.is_running() and not lock_is_held_against_a_starting_job(control)
    assert not control.paused_file.exists()


def test_stop_with_savepoint_of_a_job_that_finishes_is_not_an_error(control):
    job = FakeJob(control, finish_instead_of_pausing=True).start()
    with control.quiesced(timeout_s=10, stop_after=True) as paused:
        assert paused is None
        assert lock_is_held_against_a_starting_job(control)
    job.join()
    assert job.outcome == "finished" and not control.is_running()
    assert not control.stop_file.exists(), "a finished job is not left a STOP for its next run"


def test_a_job_that_pauses_is_resumed_after_the_body(control):
    job = FakeJob(control, last_batch=12).start()
    with control.quiesced(timeout_s=10) as paused:
        assert paused is not None and paused["last_batch"] == 12
        assert control.is_running() and job.thread.is_alive(), "paused, not stopped"
        assert control.pause_requested() and control.paused_file.exists()
    deadline = time.monotonic() + 10
    while job.outcome != "resumed" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.outcome == "resumed" and job.pauses == 1 and control.is_running()
    assert not control.pause_requested() and not control.paused_file.exists()
    control.request_stop()
    job.join()
    assert job.outcome == "stopped"


def test_a_job_that_pauses_is_stopped_after_the_body_with_stop_after(control):
    job = FakeJob(control).start()
    with control.quiesced(timeout_s=10, stop_after=True) as paused:
        assert paused is not None and paused["last_batch"] == 7
        assert job.thread.is_alive()
    # quiesced returned only once the job had stopped.
    assert not control.is_running()
    job.join(1)
    assert job.outcome == "stopped" and job.pauses == 1


def test_an_idle_job_is_kept_from_starting(control):
    with control.quiesced(timeout_s=5) as paused:
        assert paused is None
        assert lock_is_held_against_a_starting_job(control)
        assert control.lock_holder() == "savepoint" and not control.is_running(), \
            "a savepoint holding the lock of a stopped job is not the job running"
    assert not lock_is_held_against_a_starting_job(control)
    assert control.lock_holder() is None


@pytest.mark.parametrize("holder", ["job", "savepoint", "restore"])
def test_the_lock_names_its_holder_and_only_a_driver_is_the_job_running(control, holder):
    assert control.lock_holder() is None and not control.is_running()
    with control.running(timeout_s=1, holder=holder):
        assert control.lock_holder() == holder
        assert control.is_running() == (holder == "job")
        assert lock_is_held_against_a_starting_job(control), "whoever holds it, no job starts meanwhile"
    assert control.lock_holder() is None and not control.is_running()
    assert control.lock_file.read_text() == "", "a released lock names nobody for the next holder"
    with control.running(timeout_s=1):
        assert control.lock_holder() == "job" and control.is_running()


def test_a_savepoint_waits_for_a_restore_that_holds_the_lock_without_pausing_anything(control):
    """A restore of the stopped job holds the lock: the savepoint asks no pause (there is no
    driver to obey it) and waits for the lock instead; no STOP or PAUSE is left behind."""
    release, held = threading.Event(), threading.Event()
    asked_while_held = []

    def restore():
        with control.running(timeout_s=5, holder="restore"):
            held.set()
            release.wait(10)
            asked_while_held.append(control.pause_requested() or control.stop_requested())

    thread = threading.Thread(target=restore, daemon=True)
    thread.start()
    assert held.wait(5)
    threading.Timer(0.5, release.set).start()
    with control.quiesced(timeout_s=5, stop_after=True) as paused:
        assert paused is None and control.lock_holder() == "savepoint"
    thread.join(5)
    assert asked_while_held == [False], "no pause or stop was asked of a job that was not running"
    assert not control.pause_requested() and not control.stop_file.exists()


def test_a_supervised_job_stays_supervised_between_its_drivers_and_never_beside_a_scheduled_run(control):
    """A continuous job's supervisor marks it supervised for its whole life, also while its
    driver restarts (the job lock free for a moment); it starts its driver only once the
    scheduled run in progress has ended (that run holds the mark shared from before its
    driver starts, as the ingest DAG's task does); a scheduled run while it supervises is
    refused (JobSupervised: the DAG skips it); one supervisor at a time."""
    from types import SimpleNamespace

    from streamlake.pipeline.control import JobSupervised
    from streamlake.operations.runner import run_supervised
    from streamlake.operations.supervisor import JobFailed, RestartStrategy

    assert not control.is_supervised()
    started, scheduled_run_done = threading.Event(), threading.Event()

    def scheduled_run():  # its task, already in progress (its driver not yet holding the job lock)
        with control.scheduled_run():
            started.set()
            time.sleep(1.0)
            with control.running(timeout_s=1):
                time.sleep(0.5)
        scheduled_run_done.set()

    threading.Thread(target=scheduled_run, daemon=True).start()
    assert started.wait(5)
    assert not control.is_supervised(), "a scheduled run is not a supervisor"
    seen = []

    def driver():  # fails once (a restart), then runs until stopped
        seen.append({"after_the_scheduled_run": scheduled_run_done.is_set(), "supervised": control.is_supervised(),
                     "running": control.is_running()})
        if len(seen) == 1:
            raise JobFailed("killed")
        with pytest.raises(JobSupervised, match="runs continuously under its supervisor"):
            with control.scheduled_run():
                pass
        with control.running(timeout_s=1):
            assert control.is_supervised() and control.is_running()
            with pytest.raises(TimeoutError, match="another supervisor"):
                with control.supervising(timeout_s=0.5):
                    pass
        control.request_stop()

    result = run_supervised(SimpleNamespace(name="j", control=control),
                            RestartStrategy("fixed-delay", attempts=2, delay_s=0.2), driver)
    assert result.runs == 2 and result.restarts == 1
    assert seen == [{"after_the_scheduled_run": True, "supervised": True, "running": False}] * 2, \
        "the driver starts after the scheduled run, and between its starts the job stays supervised"
    assert not control.is_supervised()
    with control.scheduled_run():
        assert not control.is_supervised()


@pytest.mark.parametrize("supervised", [True, False])
def test_stop_with_savepoint_between_two_starts_of_a_supervised_driver_stops_the_next(control, supervised):
    """A rescale's stop-with-savepoint that finds a continuous job between two starts of its
    driver (the supervisor waits to restart it): the savepoint is taken with the job lock held,
    and the job is asked to stop, so the next start stops instead of running on; an idle job
    without a supervisor is asked nothing."""
    import contextlib

    with control.supervising() if supervised else contextlib.nullcontext():
        with control.quiesced(timeout_s=5, stop_after=True) as paused:
            assert paused is None and control.lock_holder() == "savepoint"
            assert not control.stop_requested()
        assert control.stop_requested() == supervised


def test_a_job_that_reaches_no_boundary_times_out_and_the_pause_is_withdrawn(control):
    release = threading.Event()

    def busy_job():  # holds the lock, never looks at the control files (a long micro-batch)
        with control.running(timeout_s=10):
            started.set()
            release.wait(20)

    started = threading.Event()
    thread = threading.Thread(target=busy_job, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        with pytest.raises(TimeoutError, match="micro-batch boundary"):
            with control.quiesced(timeout_s=0.5):
                pytest.fail("the body must not run without a boundary")
        assert not control.pause_requested(), "a failed savepoint leaves no pause behind"
    finally:
        release.set()
        thread.join(10)


def test_proofs_of_one_job_run_one_at_a_time_per_part_and_a_stuck_one_only_delays_the_next(control):
    order, first_in = [], threading.Event()
    release = threading.Event()

    def first():
        with control.proving():
            order.append("first starts")
            first_in.set()
            release.wait(10)
            order.append("first ends")

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)

    def second_proof():
        with control.proving():
            order.append("second starts")

    second = threading.Thread(target=second_proof)
    second.start()
    time.sleep(1.0)
    assert order == ["first starts"], "the second proof waits for the first"
    release.set()
    thread.join(10)
    second.join(10)
    assert order == ["first starts", "first ends", "second starts"]

    # A run's checks do not wait for the previous run's quality validation, nor the other way round.
    with control.proving(part="quality"):
        started = time.monotonic()
        with control.proving(timeout_s=5.0):
            assert time.monotonic() - started < 1.0, "checks wait only for checks"
    with control.proving():
        started = time.monotonic()
        with control.proving(timeout_s=5.0, part="quality"):
            assert time.monotonic() - started < 1.0, "a validation waits only for a validation"
    with pytest.raises(ValueError):
        with control.proving(part="everything"):
            pass

    # A proof that holds the lock past the timeout delays the next one by that long, no more.
    with control.proving():
        started = time.monotonic()
        with control.proving(timeout_s=1.0):
            waited = time.monotonic() - started
    assert 1.0 <= waited < 10, waited


# -- a real savepoint of a real available-now run ----------------------------------------------


def test_savepoint_of_an_available_now_run_succeeds_whether_it_pauses_or_finishes(spark, produce, topic_name,
                                                                                  tmp_path):
    """A scheduled (available-now) run of a named job, several micro-batches, and a savepoint
    asked for while it is in its last ones: the job either pauses for it or finishes first;
    both ways the savepoint is taken at a boundary and matches the table."""
    from helpers import assert_exactly_once
    from streamlake.delta.table import open_table, table_exists
    from streamlake.delta.txn import committed_offsets
    from streamlake.kafka.offsets import TopicPartition as TP
    from streamlake.operations.jobs import JobSpec, save_job
    from streamlake.operations.savepoints import create_savepoint
    from streamlake.pipeline.driver import run_stages

    records, limit = 4_000, 500
    produce(topic_name, records, partitions=3, seed=21)
    job = save_job(JobSpec(name=f"sp_{topic_name}", topics=[topic_name], root=str(tmp_path / "job"),
                           stages=["bronze"], max_offsets_per_trigger=limit))
    cfg = job.pipeline_config(continuous=False)
    tps = [TP(topic_name, p) for p in range(3)]
    outcome: dict = {}

    def scheduled_run():  # what jobs/pipeline.py runs for the job, in this test's Spark session
        try:
            outcome["summary"] = run_stages(spark, cfg.build_stages(), job.control, available_now=True,
                                            report=lambda _: None, poll_s=0.2, mode="available-now",
                                            query_name=cfg.query_name)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    def committed() -> int:
        return sum(committed_offsets(open_table(job.table), tps).values()) if table_exists(job.table) else 0

    thread = threading.Thread(target=scheduled_run, daemon=True)
    thread.start()
    # Ask for the savepoint while the run is in its last micro-batches: it may pause, or finish first.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and thread.is_alive() and committed() < records - 2 * limit:
        time.sleep(0.02)
    assert "error" not in outcome, outcome.get("error")
    manifest = create_savepoint(job, timeout_s=120, note="while finishing")
    thread.join(180)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")

    bronze = manifest.table("bronze")
    way = "paused for it" if manifest.job_was_running else "finished first"
    print(f"\nsavepoint {manifest.id}: the job {way}; bronze version {bronze.version}, "
          f"offsets {manifest.kafka_offsets}")
    assert manifest.offsets() == committed_offsets(open_table(job.table, version=bronze.version), tps), \
        "the savepoint's offsets are the table's committed offsets at the savepoint's version"
    assert (manifest.path / "checkpoints" / "bronze" / "offsets").is_dir()
    assert not job.control.pause_requested() and not job.control.is_running()
    assert outcome["summary"]["rows"] == records and not outcome["summary"]["stopped"]
    assert_exactly_once({"table": job.table}, topic_name, expected_rows=records)

    # Restored from it, the job's savepoint cannot be disposed of while its driver runs (here:
    # holds the job lock, as a driver does); once it stops, it can.
    from streamlake.errors import StreamLakeError
    from streamlake.operations.savepoints import dispose_savepoint, list_savepoints, restore_savepoint

    restore_savepoint(manifest.id)
    with job.control.running(timeout_s=10):
        with pytest.raises(StreamLakeError, match=f"cannot be disposed: running job.*{job.name}"):
            dispose_savepoint(manifest.id)
    dispose_savepoint(manifest.id)
    assert manifest.id not in {m.id for m in list_savepoints(job.name)}


# -- the handover: a run started before the stop waits for the operation ------------------------


def test_a_handover_is_awaited_and_a_refusal_or_silence_ends_the_wait(control):
    """A rescale starts the job's run before it stops the job; the run's driver waits for the
    rescale's handover (JobControl.await_handover), and ends at once when the rescale refuses
    it (it failed), or after its timeout when nothing comes."""
    from streamlake.pipeline.control import HandoverRefused

    timer = threading.Timer(0.5, control.hand_over, ("manual__a",), {"savepoint": "sp-1"})
    timer.start()
    started = time.monotonic()
    lines: list[str] = []
    handed = control.await_handover("manual__a", timeout_s=30, poll_s=0.05, report=lines.append)
    assert handed["handed_over"] and handed["savepoint"] == "sp-1"
    assert 0.4 < time.monotonic() - started < 10 and lines and "manual__a" in lines[0]
    assert control.handover_refusal("manual__a") is None and control.handover_refusal("manual__b") is None
    control.refuse_handover("manual__b", "its task savepoint_and_stop failed: TimeoutError")
    with pytest.raises(HandoverRefused, match="savepoint_and_stop failed"):
        control.await_handover("manual__b", timeout_s=30)
    # what the run's task reads to fail for good (no retry: the refusal stays)
    assert control.handover_refusal("manual__b") == "its task savepoint_and_stop failed: TimeoutError"
    started = time.monotonic()
    with pytest.raises(HandoverRefused, match="within 0.3 s"):
        control.await_handover("manual__c", timeout_s=0.3, poll_s=0.05)
    assert time.monotonic() - started < 5
    # Ids are Airflow run ids ("manual__2026-...+00:00"): one file each, never a path outside.
    assert control.handover_file("manual__2026-12-04T16:06:39+00:00/x").parent == control.dir / "handovers"


def test_an_announced_handover_keeps_every_other_run_off_the_job_until_its_run_takes_it(control):
    """From the rescale's announcement (before its stop) until the run it started holds the job,
    any other driver that takes the job lock leaves the job alone (claim raises HandoverPending)
    and the awaiting run goes on waiting; once that run claims it, other runs start again. A
    refused handover binds nothing, nor one announced longer than HANDOVER_BINDING_S ago (an
    operation killed without a word)."""
    import json

    from streamlake.pipeline import control as control_module
    from streamlake.pipeline.control import HandoverPending

    control.claim()  # nothing announced: any run may start the job
    assert control.pending_handover() is None
    control.announce_handover("manual__r")
    with pytest.raises(HandoverPending, match="manual__r is stopping the job for a run of its own"):
        control.claim()
    with pytest.raises(HandoverPending):
        control.check_no_handover_pending()
    with pytest.raises(control_module.HandoverRefused, match="announced only"):
        control.await_handover("manual__r", timeout_s=0.3, poll_s=0.05)  # announced is not handed over
    control.hand_over("manual__r", savepoint="sp-2")
    with pytest.raises(HandoverPending, match="manual__r has handed the stopped job over to a run of its own"):
        control.claim()  # handed over, not yet taken by its run
    assert control.await_handover("manual__r", timeout_s=5)["savepoint"] == "sp-2"
    control.claim("manual__r")  # its run, holding the job lock
    control.claim()
    assert control.pending_handover() is None

    # Its run restarted later (a continuous run's supervisor) claims like any other run: a later
    # rescale's binding keeps it off the job too. A retried hand_over or a late refusal of a
    # handover its run took binds nothing again.
    control.hand_over("manual__r", savepoint="sp-2")
    control.refuse_handover("manual__r", "its task record failed")
    assert control.handover_taken("manual__r") and control.pending_handover() is None
    control.announce_handover("manual__s")
    with pytest.raises(HandoverPending, match="manual__s is stopping the job"):
        control.claim("manual__r")
    control.refuse_handover("manual__s", "its task savepoint_and_stop failed")
    control.claim()
    control.claim("manual__r")

    # A later rescale supersedes one whose run has not taken the job yet: that run leaves it to the later one's.
    control.announce_handover("manual__u")
    control.hand_over("manual__u", savepoint="sp-3")
    control.announce_handover("manual__v")
    assert control.pending_handover()[0] == "manual__v"
    with pytest.raises(HandoverPending, match="manual__v is stopping the job"):
        control.claim("manual__u")
    control.hand_over("manual__v", savepoint="sp-4")
    control.claim("manual__v")
    control.claim()

    # Binding for HANDOVER_BINDING_S at most, from the announcement or, handed over, from then.
    for stale in ("announced_at", "at"):
        control.announce_handover(f"manual__t{stale}")
        if stale == "at":
            control.hand_over(f"manual__t{stale}")
        path = control.handover_file(f"manual__t{stale}")
        content = json.loads(path.read_text())
        assert control.pending_handover() == (path.stem, content)
        aged = {**content, stale: content[stale] - control_module.HANDOVER_BINDING_S - 1}
        path.write_text(json.dumps(aged))
        if stale == "at":  # announced long ago, handed over just now: still binding
            path.write_text(json.dumps({**content, "announced_at": content["announced_at"]
                                        - control_module.HANDOVER_BINDING_S - 1}))
            assert control.pending_handover() is not None
            path.write_text(json.dumps({**aged, "announced_at": aged["announced_at"]
                                        - control_module.HANDOVER_BINDING_S - 1}))
        control.claim()


def test_a_driver_that_takes_the_job_lock_during_a_binding_touches_nothing(control):
    """run_stages claims the job once it holds the job lock: during another operation's binding
    it raises HandoverPending before it writes its state or starts a stage (a driver that passed
    jobs/pipeline.py's earlier check before the announcement); the awaited run's first claim
    goes through."""
    from streamlake.pipeline.control import HandoverPending
    from streamlake.pipeline.driver import run_stages

    class Stage:
        name = "bronze"

        def start(self, spark, available_now):
            raise AssertionError("no stage starts during another operation's binding")

    control.announce_handover("manual__w")
    with pytest.raises(HandoverPending, match="manual__w is stopping the job"):
        run_stages(None, [Stage()], control, available_now=True, record=False)
    assert control.read_state() == {} and not control.is_running()
    control.hand_over("manual__w")
    assert run_stages(None, [], control, available_now=True, record=False, handover="manual__w")["stages"] == {}
    assert control.handover_taken("manual__w")


def test_the_rescale_refuses_the_handover_when_its_task_fails(tmp_path, monkeypatch):
    """The rescale DAG's on_failure_callback (tasks.refuse_handover) names the failed task and
    its error in the refusal the waiting run reports."""
    from streamlake.pipeline.control import HandoverRefused
    from streamlake.operations.jobs import JobSpec, load_job, save_job
    from streamlake.orchestration.tasks import refuse_handover

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="handover-job", topics=["t"], root=str(tmp_path / "root"), stages=["bronze"]))

    class TaskInstance:
        task_id = "savepoint_and_stop"

    refuse_handover({"params": {"job": "handover-job"}, "run_id": "manual__9", "task_instance": TaskInstance(),
                     "exception": TimeoutError("the job did not reach a micro-batch boundary within 180s")})
    with pytest.raises(HandoverRefused, match="savepoint_and_stop failed: the job did not reach"):
        load_job("handover-job").control.await_handover("manual__9", timeout_s=5)


@pytest.mark.parametrize("outcome", ["handed over", "refused"])
def test_a_run_started_before_the_stop_touches_nothing_until_the_handover(spark, produce, topic_name, tmp_path,
                                                                         outcome):
    """The run a rescale starts while it stops the job (jobs/pipeline.py --await-handover, here
    on the test session's Spark Connect server): its driver has its session, but writes no
    table and holds no job lock until the operation hands the job over; then it runs, exactly
    once, and another run started after the announcement and before then leaves the job alone.
    Refused (the rescale failed), it ends with exit status 2 and the reason, having written
    nothing."""
    import subprocess
    import sys

    from conftest import SPARK_CONNECT_PORT
    from helpers import assert_exactly_once
    from streamlake.config import project_root

    produce(topic_name, 300, partitions=2, seed=5)
    root = tmp_path / "job"
    proc = subprocess.Popen([sys.executable, str(project_root() / "jobs" / "pipeline.py"), "--topic", topic_name,
                             "--root", str(root), "--available-now", "--remote", f"sc://127.0.0.1:{SPARK_CONNECT_PORT}",
                             "--await-handover", "manual__r1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("waiting for manual__r1" in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # and still waiting a while later, having touched nothing
    control = JobControl(root / "_control")
    assert proc.poll() is None and not control.is_running(), "".join(lines)[-3000:]
    assert not (root / "bronze").exists()
    if outcome == "handed over":
        # The rescale announces the handover before its stop; a scheduled run's driver that takes
        # the job lock meanwhile (it got its slot first) leaves the job alone: exit status 3,
        # nothing written, while the awaiting run goes on waiting.
        control.announce_handover("manual__r1")
        other = subprocess.run([sys.executable, str(project_root() / "jobs" / "pipeline.py"), "--topic", topic_name,
                                "--root", str(root), "--available-now", "--remote",
                                f"sc://127.0.0.1:{SPARK_CONNECT_PORT}"], capture_output=True, text=True, timeout=180)
        assert other.returncode == 3, other.stdout[-3000:] + other.stderr[-3000:]
        assert "not started: operation manual__r1 is stopping the job for a run of its own" in other.stdout
        assert not (root / "bronze").exists() and proc.poll() is None
        control.hand_over("manual__r1", savepoint="sp-test")
        assert proc.wait(120) == 0, "".join(lines)[-3000:]
        reader.join(10)
        assert any("manual__r1 handed the job over" in line for line in lines)
        assert_exactly_once({"table": str(root / "bronze")}, topic_name, expected_rows=300)
        assert control.pending_handover() is None  # taken by its run: scheduled runs start the job again
    else:
        control.refuse_handover("manual__r1", "its task savepoint_and_stop failed: TimeoutError")
        assert proc.wait(60) == 2, "".join(lines)[-3000:]
        reader.join(10)
        assert "savepoint_and_stop failed" in "".join(lines)
        assert not (root / "bronze").exists()
