"""Stopping process trees (``streamlake.procs``): every process of a tree ends, and waiting
for them survives psutil's pidfd wait failing on a pid another process's thread reused."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from streamlake import procs

TREE = ("import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")


def _tree() -> tuple[subprocess.Popen, list[psutil.Process]]:
    parent = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    deadline = time.monotonic() + 20
    while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    members = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children(recursive=True)]
    assert len(members) == 2
    return parent, members


@pytest.mark.parametrize("pidfd_wait", ["works", "raises FileNotFoundError"])
def test_kill_tree_ends_every_process_of_the_tree(monkeypatch, pidfd_wait):
    if pidfd_wait != "works":
        # what psutil 7.2's wait_procs raised on Linux 6.18 for an ended process whose pid
        # already named another process's thread (pidfd_open: ENOENT)
        def raising(*_args, **_kwargs):
            raise FileNotFoundError(2, "No such file or directory")
        monkeypatch.setattr(psutil, "wait_procs", raising)
    parent, members = _tree()
    procs.kill_tree(parent.pid, parent.pid, timeout=5)
    parent.wait(5)  # reaps the parent (this process's child); the grandchild is init's
    deadline = time.monotonic() + 10
    while any(procs._running(p) for p in members) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(procs._running(p) for p in members)


def test_wait_gone_returns_what_still_runs_after_the_timeout(monkeypatch):
    monkeypatch.setattr(psutil, "wait_procs", lambda *_a, **_k: (_ for _ in ()).throw(FileNotFoundError(2, "x")))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        alive = procs.wait_gone([psutil.Process(sleeper.pid)], 0.5)
        assert [p.pid for p in alive] == [sleeper.pid] and time.monotonic() - started >= 0.5
    finally:
        sleeper.kill()
        sleeper.wait(5)
