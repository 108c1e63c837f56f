"""The platform as `make run` starts it, driven the way users drive it: Airflow's REST API.

:func:`start_platform` runs ``streamlake platform`` (the local Kafka broker, demo
producer, Spark standalone cluster, Airflow standalone) in a directory of its
own on free ports, exactly the command ``make run`` runs; :class:`AirflowREST`
triggers DAG runs and Airflow backfills and waits for them, as the UI's buttons
do (``POST /api/v2/dags/{dag}/dagRuns``, ``POST /api/v2/backfills``), with a
token from ``POST /auth/token``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

STREAMLAKE = str(Path(sys.executable).parent / "streamlake")
FINISHED = ("success", "failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirflowREST:
    """A logged-in client of Airflow 3's REST API (``/api/v2``) and the StreamLake plugin."""

    def __init__(self, base_url: str, user: str, password: str, server_log: Path | None = None):
        self.base = base_url.rstrip("/")
        self.user, self.password = user, password
        self.server_log = server_log  # the API server's output, quoted when it answers 5xx
        self.token = self._token()

    def _token(self) -> str:
        body = json.dumps({"username": self.user, "password": self.password}).encode()
        request = urllib.request.Request(f"{self.base}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.load(resp)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None, auth: bool = True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method, headers=headers)
        try:
            # The API server waits up to 60 s for SQLite's write lock (platform/airflow.py).
            with urllib.request.urlopen(request, timeout=120) as resp:
                text = resp.read().decode()
                return resp.status, (json.loads(text) if text and text.lstrip()[:1] in "[{" else text)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Trigger a run like the UI's trigger button; returns its run id.

        On SQLite (`make run`) Airflow may answer 500 "Database error" when two writers
        collide (README, known limits): a user clicks again, and so does this, up to three
        times. The run id is chosen here, in Airflow's own form, so a retry after an answer
        lost on the way cannot create a second run (Airflow answers 409 for it)."""
        run_id = f"manual__{dt.datetime.now(dt.timezone.utc).isoformat()}"
        collided = False
        for _attempt in range(3):
            status, run = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                                    {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}})
            if status == 200 or (status == 409 and collided):
                return run_id
            if not (status == 500 and "Database error" in str(run)):
                break
            collided = True
            time.sleep(5)
        raise AssertionError(f"triggering {dag_id} answered {status}: {run}{self.server_error(run)}")

    def run(self, dag_id: str, run_id: str) -> dict:
        status, run = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}")
        assert status == 200, f"{dag_id}/{run_id}: {status} {run}"
        return run

    def runs(self, dag_id: str, **query) -> list[dict]:
        params = "&".join(f"{k}={urllib.request.quote(str(v))}" for k, v in query.items())
        status, body = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=-start_date"
                                        + (f"&{params}" if params else ""))
        assert status == 200, body
        return body["dag_runs"]

    def wait(self, dag_id: str, run_id: str, timeout: float) -> dict:
        """Until the run finished; returns it with ``seconds`` (queued to end)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(dag_id, run_id)
            if run["state"] in FINISHED:
                return {**run, "seconds": _seconds(run)}
            time.sleep(1)  # a GET of one run: cheap; a test waits on a dozen runs one after the other
        raise AssertionError(f"{dag_id} run {run_id} did not finish within {timeout:g}s "
                             f"(state {self.run(dag_id, run_id)['state']}); {self.failed_tasks(dag_id, run_id)}")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The text of a task's log (Airflow 3 serves it as structured events)."""
        status, body = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}"
                                        f"/taskInstances/{task_id}/logs/{try_number}?full_content=true")
        assert status == 200, f"log of {dag_id}/{run_id}/{task_id}: {status} {body}"
        content = body.get("content") if isinstance(body, dict) else body
        return "\n".join(e.get("event", "") if isinstance(e, dict) else str(e) for e in (content or []))

    def task(self, dag_id: str, run_id: str, task_id: str) -> dict:
        """The task instance (state, start_date, end_date, try_number...)."""
        status, body = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}"
                                        f"/taskInstances/{task_id}")
        assert status == 200, f"task {dag_id}/{run_id}/{task_id}: {status} {body}"
        return body

    def tries(self, dag_id: str, run_id: str, task_id: str) -> int:
        """The number of the task's last try (its log is that of the try that ended the task)."""
        return self.task(dag_id, run_id, task_id)["try_number"]

    def failed_tasks(self, dag_id: str, run_id: str) -> list[str]:
        status, body = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}"
                                        "/taskInstances")
        if status != 200:
            return [f"(task instances: {status})"]
        return [f"{t['task_id']}: {t['state']}" for t in body["task_instances"]
                if t["state"] not in ("success", "skipped")]

    def backfill(self, dag_id: str, from_date: str, to_date: str, reprocess: str = "completed") -> dict:
        """Airflow's own backfill (the trigger dialog's Backfill, ``airflow backfill create``).
        ``reprocess``: which existing runs of the range run again (the dialog's "Reprocess
        behaviour"): ``completed`` (all; the hourly schedule may already have run them),
        ``failed`` or ``none``.

        On SQLite (what `make run` uses) Airflow may answer 503 "Database is locked" while
        the scheduler writes, and its clean-up of the half-made backfill is best effort: the
        next click then answers 409 "already a running backfill" for an orphan. A user
        cancels that one in the Backfills list and clicks again; so does this, a few times
        (README, known limits). A 409 without an earlier 503 is a real conflict and fails."""
        locked = False
        for _attempt in range(6):
            status, body = self.call("POST", "/api/v2/backfills", {
                "dag_id": dag_id, "from_date": from_date, "to_date": to_date, "reprocess_behavior": reprocess,
                "max_active_runs": 1})
            if status == 503 and "locked" in str(body):
                locked = True
            elif status == 409 and locked:
                for orphan in self._active_backfills(dag_id):
                    self.call("PUT", f"/api/v2/backfills/{orphan['id']}/cancel")
            else:
                break
            time.sleep(10)
        assert status == 200, f"creating a backfill answered {status}: {body}{self.server_error(body)}"
        return body

    def server_error(self, body) -> str:
        """The API server's log lines for an error it answered with 'look for ID …'."""
        found = re.search(r"look for ID (\w+)", str(body))
        if not (found and self.server_log and self.server_log.exists()):
            return ""
        lines = self.server_log.read_text(errors="replace").splitlines()
        hits = [i for i, line in enumerate(lines) if found.group(1) in line]
        return "\n--- API server log ---\n" + "\n".join(lines[hits[0]:hits[0] + 40]) if hits else ""

    def _active_backfills(self, dag_id: str) -> list[dict]:
        status, body = self.call("GET", f"/api/v2/backfills?dag_id={urllib.request.quote(dag_id)}")
        assert status == 200, body
        return [b for b in body["backfills"] if b["completed_at"] is None]


def epoch(timestamp: str) -> float:
    """An ISO timestamp as Airflow and Spark write it (``…Z`` or ``…+00:00``) in seconds since the epoch."""
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _seconds(run: dict) -> float | None:
    start = run.get("queued_at") or run.get("start_date")
    end = run.get("end_date")
    if not start or not end:
        return None
    return round(epoch(end) - epoch(start), 1)


@dataclass
class LivePlatform:
    home: Path
    env: dict
    airflow_url: str
    user: str
    password: str
    spark_ui: str
    output: str
    rest: AirflowREST = field(init=False)

    def __post_init__(self) -> None:
        self.rest = AirflowREST(self.airflow_url, self.user, self.password,
                                server_log=self.home / "logs" / "airflow.log")

    def streamlake(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([STREAMLAKE, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        self.streamlake("stop", timeout=180)


def platform_env(home: Path, extra: dict | None = None) -> dict:
    """The environment of a user's shell: no test-session Airflow or broker settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AIRFLOW") and k not in ("STREAMLAKE_KAFKA_BOOTSTRAP", "STREAMLAKE_CRASH_AT")}
    return {**env, "STREAMLAKE_HOME": str(home), **(extra or {})}


def start_platform(home: Path, *, rate: float = 200, other_rate: float | None = None,
                   every_minutes: int | None = None, schedules: bool = True,
                   timeout: float = 600) -> LivePlatform:
    """``streamlake platform`` (what ``make run`` runs) on free ports; returns when the UI answers.
    ``rate``/``other_rate``: records per second of the demo pipeline's producer and of the
    others' (default: the platform's); ``every_minutes``: the scheduled pipeline's interval
    (default: the demo's); ``schedules=False``: Airflow's scheduler creates no scheduled runs
    (``[scheduler] use_job_schedule``, an Airflow setting a user can set too): only the runs
    triggered (forms, REST, Backfill) run, so none queues behind the schedule's."""
    home.mkdir(parents=True, exist_ok=True)
    extra = {"STREAMLAKE_INGEST_EVERY_MINUTES": str(every_minutes)} if every_minutes else {}
    if not schedules:
        extra["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
    env = platform_env(home, extra)
    from streamlake.platform import broker

    # Kafka's node takes two ports: its clients' and its controller's, the next one
    kafka = broker.find_free_port()
    port, spark, spark_ui, connect = free_port(), free_port(), free_port(), free_port()
    done = subprocess.run([STREAMLAKE, "platform", "--port", str(port), "--kafka-port", str(kafka),
                           "--spark-port", str(spark), "--spark-ui-port", str(spark_ui),
                           "--spark-connect-port", str(connect), "--rate", str(rate),
                           *(["--other-rate", str(other_rate)] if other_rate is not None else [])],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"streamlake platform failed:\n{done.stdout}\n{done.stderr}"
    login = re.search(r"user (\S+), password (\S+)", done.stdout)
    assert login, done.stdout
    return LivePlatform(home, env, f"http://127.0.0.1:{port}", login.group(1), login.group(2),
                        f"http://127.0.0.1:{spark_ui}", done.stdout)
