"""Headless Chromium driven by Playwright, the way a user drives Airflow's UI.

Debian's ``chromium`` (``scripts/setup.sh`` installs it; Playwright downloads no
browser here) with the flags it needs to run headless on this machine (see
shared/DESIGN.md). :func:`log_in` goes through Airflow's own login page;
:func:`trigger_from_form` opens a DAG's Trigger dialog, types only the fields it
is given and clicks Trigger, and returns the run id Airflow navigated to.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--no-zygote", "--disable-crash-reporter", "--disable-breakpad", "--disable-gpu"]
INSTALL_HINT = ("install Debian's chromium: `bash scripts/setup.sh` does it (CI runs it), or "
                "`sudo apt-get update && sudo apt-get install -y chromium`")


def chromium() -> str:
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    pytest.fail(f"headless Chromium is required for the UI tests and was not found at "
                f"{' or '.join(CHROMIUM_PATHS)}: {INSTALL_HINT}", pytrace=False)


# How long an assertion on the page (playwright's `expect`) waits: its default, 5 s, was too
# short for an iframe's view to load on 2 cores shared with Spark (a fresh-clone CI run).
EXPECT_TIMEOUT_MS = 30_000


def launch(pw):
    """Headless Chromium; page assertions wait up to EXPECT_TIMEOUT_MS."""
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    return pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)


def only_local(base: str):
    """A route handler that lets the page load from Airflow only (Data Docs pull styles
    from public CDNs: no internet here, so the page must not wait for them)."""

    def handler(route):
        if route.request.url.startswith(base) or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            route.abort()

    return handler


def log_in(page, base: str, user: str, password: str, screenshot: Path | None = None) -> None:
    page.goto(base + "/")
    page.wait_for_selector("input[name=username]")
    assert "login" in page.url
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    if screenshot:
        page.screenshot(path=str(screenshot))
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "login" not in url)


def trigger_from_form(page, base: str, dag_id: str, fields: dict[str, str] | None = None,
                      screenshot: Path | None = None, rest=None, retries: int = 1) -> str:
    """Open ``dag_id``'s page, click Trigger, type ``fields`` (param name -> text; nothing
    else is touched), click the dialog's Trigger and return the new run's id (Airflow
    opens the run's page). Fails if the dialog's Trigger button is disabled.

    On SQLite (`make run`) the trigger may answer 500 "Database error" when two writers
    collide (README, known limits); Airflow's UI then stays on the dialog even when its
    own retry created the run. With ``rest`` (a platform_harness.AirflowREST), a run of the
    DAG created since the click counts, as a user sees it appear in the grid; when no run
    was created (the trigger's write timed out on SQLite's lock: a 500 after 60 s), the
    form is submitted again, up to ``retries`` times, as a user would after the error.
    The page is left on about:blank."""
    import datetime as dt

    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    page.goto(f"{base}/dags/{dag_id}")
    page.get_by_role("button", name=re.compile("^Trigger")).first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"Trigger Dag - {dag_id}")
    for name, text in (fields or {}).items():
        dialog.locator(f"#element_{name}").fill(text)
    submit = dialog.get_by_role("button", name=re.compile("^Trigger")).last
    if screenshot:
        page.screenshot(path=str(screenshot))
    expect(submit).to_be_enabled(timeout=10_000)
    clicked = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    submit.click()
    try:
        page.wait_for_url(re.compile(rf".*/dags/{re.escape(dag_id)}/runs/.+"), timeout=60_000)
    except PlaywrightTimeout:
        if rest is None:
            raise
        # The UI's own retry may still create the run after the 500 (seen: 7 s later), so wait
        # for it as long as one more lock timeout before submitting again (two runs otherwise).
        deadline = time.monotonic() + 75
        while True:
            created = [r for r in rest.runs(dag_id) if r["run_type"] == "manual"
                       and dt.datetime.fromisoformat(r["run_after"].replace("Z", "+00:00")) >= clicked]
            if created:
                page.goto("about:blank")
                return created[0]["dag_run_id"]
            if time.monotonic() > deadline:
                break
            time.sleep(3)
        if retries <= 0:
            raise
        return trigger_from_form(page, base, dag_id, fields, screenshot, rest, retries - 1)
    run_id = unquote(page.url.split("/runs/", 1)[1].split("?")[0].split("/")[0])
    # Leave the run's page: it refreshes while the run runs, and a headless tab doing that
    # took half a core of the two the platform runs on (seen: chromium at 55 % CPU).
    page.goto("about:blank")
    return run_id


def keep_screenshots(source: Path, target: Path = ROOT / "tests" / "artifacts") -> list[Path]:
    """Copy screenshots to tests/artifacts/ (a passing session's directory is deleted)."""
    target.mkdir(exist_ok=True)
    kept = []
    for shot in sorted(source.glob("*.png")):
        shutil.copy2(shot, target / shot.name)
        kept.append(target / shot.name)
    return kept
