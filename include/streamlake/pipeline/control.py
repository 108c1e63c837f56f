"""Controlling a running job from outside: stop, pause, resume, is it running.

A job's control files live in its control directory (``<root>/_control`` for a
pipeline job, ``<checkpoint>/streamlake`` for a bare ``streamlake ingest``):

``job.lock``
    held (``flock``) by the job's driver for as long as it runs, so "running"
    is a fact the OS maintains, not a pid file that can go stale; a savepoint or
    restore of a stopped job holds it too, to keep the job from starting, and the
    holder names itself in the file (``job``, ``savepoint``, ``restore``);
``supervisor.lock``
    held exclusively by the supervisor of a continuous job for its whole life, also
    between two starts of its driver, and shared by each scheduled run of the job
    from before its driver starts: neither starts beside the other;
``STOP``
    finish the current micro-batch, stop the query, exit;
``PAUSE`` / ``PAUSED``
    finish the current micro-batch and stop the query but keep the driver; the
    job writes ``PAUSED`` (its state at that boundary) and starts the query again
    when ``PAUSE`` is removed. Savepoints use this to copy a checkpoint that
    sits exactly on a micro-batch boundary;
``state.json``
    how the job was started (mode, pid, savepoint it was restored from);
``progress.jsonl``
    one JSON line per micro-batch of every stage;
``handovers/<operation>.json``
    written by an operation that stops the job and starts it again with a run it
    triggered before the stop (a rescale): announced before the stop
    (:meth:`JobControl.announce_handover`), then handed over or refused. That run
    waits for it (:meth:`JobControl.await_handover`) before it touches the tables
    and marks it taken once it holds ``job.lock``; from the announcement until then
    every other driver that takes ``job.lock`` yields (:meth:`JobControl.claim`), so
    nothing runs the job on the old settings between the stop and the handover.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable

from streamlake.errors import StreamLakeError

log = logging.getLogger(__name__)

JOB_HOLDER = "job"  # what a job's driver writes into the lock file it holds (JobControl.running)
HANDOVERS_KEPT_S = 7 * 24 * 3600  # an unused handover file older than this goes when the next one is written
# An announced handover binds other runs for this long at most: an operation killed without a
# word (no handover, no refusal) or a run that never took its job must not keep the job from
# every scheduled run for good. The run that awaits the handover gives up after as long
# (jobs/pipeline.py HANDOVER_TIMEOUT_S).
HANDOVER_BINDING_S = 900.0


class JobSupervised(StreamLakeError):
    """A scheduled run found the job kept running continuously by its supervisor."""


class HandoverRefused(StreamLakeError):
    """The operation a run waits for failed, or did not hand the job over in time: the run
    must not start the job (the operation's log says why)."""


class HandoverPending(StreamLakeError):
    """Another operation is handing the stopped job over to a run it started (a rescale, to its
    run on the new settings): this run must not start the job. A driver that meets it exits
    with :attr:`exit_status`: a scheduled run's task or a continuous run's supervisor is then
    skipped, saying why; a run that completes a restore or rescale fails."""

    exit_status = 3


def _flock(fh, timeout_s: float, poll_s: float = 0.5, shared: bool = False) -> bool:
    """Take an exclusive (or ``shared``) ``flock`` on the open file ``fh``, waiting up to
    ``timeout_s`` (0: one try); False if another process still holds it against that then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


class JobControl:
    """Control files of a job, in ``directory``."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)

    @classmethod
    def for_checkpoint(cls, checkpoint: str | os.PathLike) -> "JobControl":
        """The control files of a single-query job kept inside its checkpoint."""
        return cls(Path(checkpoint) / "streamlake")

    @property
    def progress_file(self) -> Path:
        return self.dir / "progress.jsonl"

    @property
    def lock_file(self) -> Path:
        return self.dir / "job.lock"

    @property
    def supervisor_lock_file(self) -> Path:
        return self.dir / "supervisor.lock"

    @property
    def stop_file(self) -> Path:
        return self.dir / "STOP"

    @property
    def pause_file(self) -> Path:
        return self.dir / "PAUSE"

    @property
    def paused_file(self) -> Path:
        return self.dir / "PAUSED"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def _touch(self, path: Path) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path.touch()

    # -- the job's side --------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, timeout_s: float = 60.0, holder: str = JOB_HOLDER):
        """Hold the job lock while the body runs, as ``holder``: ``"job"`` (the job's driver) or
        the operation that keeps a stopped job from starting (``"savepoint"``, ``"restore"``),
        which :meth:`lock_holder` reads. Waits up to ``timeout_s`` for a job, savepoint or
        restore that holds it; raises TimeoutError if it stays taken."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.lock_file, "a+")
        if not _flock(fh, timeout_s):
            fh.close()
            raise TimeoutError(f"another process holds {self.lock_file} (a running job, savepoint or restore)")
        fh.truncate(0)
        fh.write(f"{holder}\n")
        fh.flush()
        try:
            yield self
        finally:
            fh.truncate(0)  # before the lock is free: the next holder's file never names this one
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    @contextlib.contextmanager
    def proving(self, timeout_s: float = 900.0, part: str = "checks"):
        """One proof (``streamlake.operations.verify.verify_job``) of the job at a time, per
        ``part``: ``checks`` (the consistency checks) or ``quality`` (the validation), which
        read and record different things, so a run's checks need not wait for the previous
        run's validation. A second proof waits for the first and then covers only what the
        first did not (two proofs of the same tables side by side each did the whole work, e.g.
        a stop-with-savepoint's and the stopped run's). Waits up to ``timeout_s``, then proves
        without the lock (a warning: the proofs are then only slower, never wrong: each reads
        committed versions)."""
        if part not in ("checks", "quality"):
            raise ValueError(f"a proof's part is checks or quality, not {part!r}")
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / ("proof.lock" if part == "checks" else "quality.lock"), "a+")
        held = False
        try:
            held = _flock(fh, timeout_s)
            if not held:
                log.warning("another proof of %s has run for over %.0f s; proving beside it", self.dir, timeout_s)
            yield self
        finally:
            if held:
                fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    @contextlib.contextmanager
    def supervising(self, timeout_s: float = 120.0, report: Callable[[str], None] | None = None):
        """Mark the job as kept running by a supervisor: ``supervisor.lock`` held exclusively
        for the supervisor's whole life, across the restarts of its driver (when ``job.lock``
        is free for a moment), so :meth:`is_supervised` is true meanwhile and a scheduled run
        leaves the job to it (:meth:`scheduled_run`). Waits up to ``timeout_s`` for the
        scheduled runs in progress and another supervisor to end (``report`` gets a line when it
        has to wait); raises TimeoutError if they do not."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.supervisor_lock_file, "a+")
        if not _flock(fh, 0):
            if report:
                report("waiting for the job's scheduled run or another supervisor to end")
            if not _flock(fh, timeout_s):
                fh.close()
                raise TimeoutError(f"a scheduled run or another supervisor of this job held "
                                   f"{self.supervisor_lock_file} for over {timeout_s:g} s")
        try:
            yield self
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    @contextlib.contextmanager
    def scheduled_run(self):
        """A scheduled (available-now) run of the job for the duration of the body, from before
        its driver starts until it ends: ``supervisor.lock`` held shared, so a supervisor waits
        for it (:meth:`supervising`) and it never starts beside one. Raises JobSupervised when a
        supervisor keeps the job running continuously."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.supervisor_lock_file, "a+")
        if not _flock(fh, 0, shared=True):
            fh.close()
            raise JobSupervised("the job runs continuously under its supervisor, which keeps every stage up to date")
        try:
            yield self
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def pause_requested(self) -> bool:
        return self.pause_file.exists()

    def mark_paused(self, info: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.paused_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.paused_file)

    def clear_paused(self) -> None:
        self.paused_file.unlink(missing_ok=True)

    def clear_requests(self, older_than: float | None = None) -> None:
        """Remove STOP, PAUSE and PAUSED; with ``older_than`` (epoch seconds) only the
        files written before it, so a request made while the job starts survives."""
        for path in (self.stop_file, self.pause_file, self.paused_file):
            try:
                if older_than is None or path.stat().st_mtime < older_than:
                    path.unlink(missing_ok=True)
            except FileNotFoundError:
                pass

    def write_state(self, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {**self.read_state(), **fields}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    # -- handing a stopped job over to a run started before the stop -----------------------

    def handover_file(self, operation: str) -> Path:
        """Where the operation ``operation`` (an id, e.g. a rescale's Airflow run id) hands the job over."""
        return self.dir / "handovers" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', operation)}.json"

    def announce_handover(self, operation: str) -> None:
        """The operation ``operation`` is about to stop the job and hand it over to the run it
        started (before its stop): from now on every other driver that takes the job lock yields
        (:meth:`claim`) until that run has taken the job, the operation refuses, or
        :data:`HANDOVER_BINDING_S` passes. The awaiting run goes on waiting. An earlier
        operation's handover its run has not taken yet is superseded: that run then leaves the
        job to this one. Call it before the stop."""
        for other, content in self._bindings():
            if other != self.handover_file(operation).stem:
                self._write_handover(other, {**content, "superseded_by": operation})
        self._write_handover(operation, {"pending": True, "announced_at": time.time()})

    def hand_over(self, operation: str, **info) -> None:
        """The operation ``operation`` is done with the job (stopped at a savepoint, new settings
        in place): the run waiting in :meth:`await_handover` may take the job lock and start.
        ``info`` (JSON-able) goes into the file. Handing over again (a retried task) keeps what
        the run or a later operation did with it (taken, superseded). Removes handover files
        older than :data:`HANDOVERS_KEPT_S` no run took (a taken one tells a restart of the run
        that took it not to wait again: :func:`streamlake.operations.runner.submit_with_airflow_hook`)."""
        now = time.time()
        prior = self._read_handover(self.handover_file(operation)) or {}
        kept = {k: prior[k] for k in ("taken_at", "taken_by", "superseded_by") if k in prior}
        self._write_handover(operation, {"handed_over": True, "at": now,
                                         "announced_at": prior.get("announced_at", now), **info, **kept})

    def refuse_handover(self, operation: str, reason: str) -> None:
        """The operation ``operation`` failed: the run waiting for it ends with ``reason``. Nothing
        once its run has taken the job (a task failing after the handover)."""
        if (self._read_handover(self.handover_file(operation)) or {}).get("taken_at"):
            return
        self._write_handover(operation, {"handed_over": False, "at": time.time(), "reason": reason})

    def _bindings(self) -> list[tuple[str, dict]]:
        """The handovers that bind the job now (see :meth:`pending_handover`), as (file's id, content)."""
        folder = self.dir / "handovers"
        if not folder.is_dir():
            return []
        now, found = time.time(), []
        for path in sorted(folder.glob("*.json")):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime >= HANDOVER_BINDING_S:  # written before the window: binds nothing
                    continue
            content = self._read_handover(path)
            if (not content or content.get("taken_at") or content.get("superseded_by")
                    or not (content.get("pending") or content.get("handed_over"))):
                continue
            since = max(content.get("announced_at", 0), content.get("at", 0) if content.get("handed_over") else 0)
            if now - since < HANDOVER_BINDING_S:
                found.append((path.stem, content))
        return found

    def pending_handover(self, exclude: str | None = None) -> tuple[str, dict] | None:
        """The handover that binds the job now, as (its file's operation id, its content): announced
        (:meth:`announce_handover`) or handed over, not refused, not yet taken by its run
        (:meth:`claim`), not superseded by a later one, announced (or, handed over, handed over)
        less than :data:`HANDOVER_BINDING_S` ago; ``exclude``: an operation's own. None when
        none does."""
        skip = self.handover_file(exclude).stem if exclude else None
        return next(((op, content) for op, content in self._bindings() if op != skip), None)

    def handover_refusal(self, operation: str) -> str | None:
        """Why the operation ``operation`` refused its handover (:meth:`refuse_handover`); None
        when it did not (yet)."""
        content = self._read_handover(self.handover_file(operation)) or {}
        return content.get("reason") if content.get("handed_over") is False else None

    def handover_taken(self, operation: str) -> bool:
        """Whether the run that awaited the operation's handover has taken the job (:meth:`claim`)."""
        return bool((self._read_handover(self.handover_file(operation)) or {}).get("taken_at"))

    def claim(self, handover: str | None = None) -> None:
        """Called by a driver that has just taken the job lock, before it touches a table.
        ``handover``: the operation whose handover this driver awaited (:meth:`await_handover`):
        the first claim marks it taken (from then on any run may start the job again). Any other
        claim (a restart of a run that took its handover long ago, or whose operation a later
        one superseded, or a run without one) is :meth:`check_no_handover_pending`, which raises
        HandoverPending while another operation's handover binds the job."""
        if handover:
            content = self._read_handover(self.handover_file(handover)) or {}
            if content.get("handed_over") and not content.get("taken_at") and not content.get("superseded_by"):
                self._write_handover(handover, {**content, "taken_at": time.time(), "taken_by": os.getpid()})
                return
        self.check_no_handover_pending(exclude=handover)

    def check_no_handover_pending(self, exclude: str | None = None) -> None:
        """Raises HandoverPending while another operation's handover binds the job
        (:meth:`pending_handover`; ``exclude``: this run's own operation): that operation stopped
        the job for a run of its own. A scheduled run checks before it starts its driver, and its
        driver again once it holds the job lock (:meth:`claim`), the check that counts."""
        pending = self.pending_handover(exclude)
        if pending:
            operation, content = pending
            state = "has handed the stopped job over to" if content.get("handed_over") else "is stopping the job for"
            raise HandoverPending(f"operation {operation} {state} a run of its own (a rescale's, on the new "
                                  f"settings), which starts the job next: this run leaves the job to it")

    @staticmethod
    def _read_handover(path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _write_handover(self, operation: str, content: dict) -> None:
        path = self.handover_file(operation)
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("*.json"):
            with contextlib.suppress(OSError):
                # a taken one stays: the supervisor of the run that took it may still restart it
                if time.time() - old.stat().st_mtime > HANDOVERS_KEPT_S and not self.handover_taken(old.stem):
                    old.unlink()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(content))
        os.replace(tmp, path)

    def await_handover(self, operation: str, timeout_s: float, poll_s: float = 0.2,
                       report: Callable[[str], None] | None = None) -> dict:
        """Wait until the operation ``operation`` hands the job over (:meth:`hand_over`); returns
        what it wrote. Raises HandoverRefused when it refused (:meth:`refuse_handover`: it failed)
        or wrote nothing within ``timeout_s``. ``report`` gets a line when the wait begins and
        every 30 s of it."""
        path = self.handover_file(operation)
        started = time.monotonic()
        reported = None
        while True:
            content = self._read_handover(path)
            if content is not None and not content.get("pending"):
                if not content.get("handed_over"):
                    raise HandoverRefused(f"{operation} did not hand the job over: {content.get('reason')}")
                return content
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise HandoverRefused(f"{operation} did not hand the job over within {timeout_s:g} s "
                                      f"({'announced only' if content else 'nothing'} at {path})")
            if report and (reported is None or waited - reported >= 30):
                report(f"waiting for {operation} to hand the job over ({waited:.0f} s so far)")
                reported = waited
            time.sleep(poll_s)

    # -- the operator's side ---------------------------------------------------------------

    def lock_holder(self) -> str | None:
        """Who holds the job lock now: ``"job"`` (a driver), ``"savepoint"`` or ``"restore"``
        (keeping the stopped job from starting), or None when nobody does. A lock taken an
        instant ago that names nobody yet counts as the job's (callers then wait for it as
        for a driver, the cautious side)."""
        if not self.lock_file.exists():
            return None
        with open(self.lock_file, "a+") as fh:
            if not _flock(fh, 0):
                fh.seek(0)
                return fh.read().strip() or JOB_HOLDER
            fcntl.flock(fh, fcntl.LOCK_UN)
            return None

    def is_running(self) -> bool:
        """True while the job's driver holds the lock; False while nobody does, or a savepoint
        or restore holds it to keep the stopped job from starting."""
        return self.lock_holder() == JOB_HOLDER

    def is_supervised(self) -> bool:
        """True while a supervisor keeps the job running continuously (:meth:`supervising`),
        also between two of its driver's starts."""
        if not self.supervisor_lock_file.exists():
            return False
        with open(self.supervisor_lock_file, "a+") as fh:
            if not _flock(fh, 0, shared=True):
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    def request_stop(self) -> None:
        self._touch(self.stop_file)

    def request_pause(self) -> None:
        self._touch(self.pause_file)

    def resume(self) -> None:
        self.pause_file.unlink(missing_ok=True)

    def wait_paused(self, timeout_s: float) -> dict | None:
        """Wait until the job reports it is paused at a micro-batch boundary.

        Returns what the paused job reported, or None if the job exited instead
        (an available-now run that finished, or a stop). Raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.paused_file.exists():
                try:
                    return json.loads(self.paused_file.read_text())
                except ValueError:
                    pass
            if not self.is_running():
                return None
            time.sleep(0.2)
        raise TimeoutError(f"the job did not reach a micro-batch boundary within {timeout_s:g}s")

    def wait_stopped(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_running():
                return
            time.sleep(0.2)
        raise TimeoutError(f"the job did not stop within {timeout_s:g}s")

    @contextlib.contextmanager
    def quiesced(self, timeout_s: float = 120.0, stop_after: bool = False):
        """The job at a micro-batch boundary for the duration of the body.

        A running job is paused (and resumed, or stopped if ``stop_after``);
        an idle job is kept from starting by holding its lock (and, if ``stop_after`` and its
        supervisor is between two starts of its driver, asked to stop: the next start stops). A job that ends
        while the pause is awaited (an available-now run finishing) ended at a
        boundary too: it is then treated as idle. Yields what the paused job
        reported, or None if it was not running by then. Raises TimeoutError if
        a running job reaches no boundary within ``timeout_s``.
        """
        paused = None
        if self.is_running():
            self.request_pause()
            try:
                paused = self.wait_paused(timeout_s)
            except BaseException:
                self.resume()
                raise
        if paused is None:
            self.resume()  # the job ended instead of pausing, or never ran
            with self.running(timeout_s, holder="savepoint"):
                yield None
                if stop_after and self.is_supervised():
                    self.request_stop()  # its supervisor, between two starts of its driver, starts none
            return
        try:
            yield paused
        finally:
            if stop_after:
                self.request_stop()
            self.resume()
            if stop_after:
                self.wait_stopped(timeout_s)
