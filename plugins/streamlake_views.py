"""StreamLake views in the Airflow UI: savepoints, consistency checks, operations, data quality.

A FastAPI app mounted by Airflow's API server under ``/streamlake`` and linked
from the navigation (``external_views``). Every page requires an Airflow login
(the UI's session cookie or a bearer token). Pages are read-only: savepoints are
taken, restored and disposed through the DAGs or ``streamlake savepoint``.

The Data quality view shows the latest validation per table and suite (failing
expectations first), a trend plot per table (inline SVG), and links to each
result's Great Expectations Data Docs page, which the app serves from
``$STREAMLAKE_HOME/quality/data_docs`` under ``/streamlake/quality/docs/``
(behind the same login; paths outside that folder are refused).
"""

from __future__ import annotations

import html
import json
import mimetypes
from urllib.parse import quote

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

app = FastAPI(title="StreamLake", dependencies=[Depends(requires_authenticated())])

_STYLE = """
<style>
 body { font-family: system-ui, sans-serif; margin: 1.2rem; color: #1d2733; }
 h1 { font-size: 1.3rem; } nav a { margin-right: 1rem; }
 table { border-collapse: collapse; width: 100%; font-size: .85rem; }
 th, td { border-bottom: 1px solid #dde3ea; padding: .35rem .5rem; text-align: left; vertical-align: top; }
 th { background: #f3f6f9; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
 .PASS { color: #137333; font-weight: 600; } .FAIL { color: #b3261e; font-weight: 600; }
 code { font-size: .8rem; } .muted { color: #66727f; }
 .WARN { color: #b06000; font-weight: 600; } .critical { color: #b3261e; } .warning { color: #b06000; }
 tr.failing td { background: #fdf3f2; } h2 { font-size: 1.05rem; margin-top: 1.6rem; }
 .trends { display: flex; flex-wrap: wrap; gap: 1rem; } .trend-box { border: 1px solid #dde3ea; padding: .4rem; }
 details.passing-expectations { margin-top: .4rem; } details summary { cursor: pointer; color: #137333; }
</style>
"""


def _page(title: str, body: str, base: str | None = None) -> HTMLResponse:
    """A page of the app; ``base`` (e.g. ``"../"``) for pages below the app's top level, so
    the relative links (navigation, forms) still point into the app."""
    nav = ('<nav><a href="late-events">Late events</a><a href="quality">Data quality</a>'
           '<a href="savepoints">Savepoints</a><a href="checks">Consistency checks</a>'
           '<a href="operations">Operations</a></nav>')
    head = f"<base href='{html.escape(base)}'>" if base else ""
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'>{head}<title>{html.escape(title)}</title>"
                        f"{_STYLE}</head><body>{nav}<h1>{html.escape(title)}</h1>{body}</body></html>")


def _table(headers: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f"<p class='muted'>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value, cls: str = "") -> str:
    text = "" if value is None else str(value)
    return f"<td class='{cls}'>{html.escape(text)}</td>"


def _offsets(offsets: dict) -> str:
    parts = [f"{topic}-{p}: {off}" for topic, ps in sorted(offsets.items()) for p, off in sorted(ps.items())]
    return "<td><code>" + html.escape(", ".join(parts)) + "</code></td>"


@app.get("/api/savepoints")
def api_savepoints(job: str | None = None) -> list[dict]:
    from streamlake.operations.savepoints import list_savepoints

    return [m.to_dict() for m in list_savepoints(job)]


@app.get("/savepoints", response_class=HTMLResponse)
def savepoints(job: str | None = Query(None)) -> HTMLResponse:
    from streamlake.operations.savepoints import jobs_restored_from, list_savepoints

    rows = []
    for m in list_savepoints(job):
        in_use = jobs_restored_from(m.id)
        rows.append([
            _td(m.id), _td(m.job), _td(m.created_at),
            _td(", ".join(f"{t.name} v{t.version}" for t in m.tables)), _offsets(m.kafka_offsets),
            _td("running" if m.job_was_running else "idle"), _td(m.code_version),
            _td(f"in use by {', '.join(in_use)}" if in_use else ""), _td(m.note),
        ])
    body = _table(["id", "job", "created", "tables", "Kafka offsets (in the table)", "job was", "code version",
                   "restored by", "note"], rows, "No savepoints yet: trigger the savepoint DAG.")
    return _page("Savepoints", body + "<p class='muted'>Restore with the <b>restore</b> DAG; "
                 "dispose with <code>streamlake savepoint dispose ID</code>.</p>")


@app.get("/api/checks")
def api_checks(job: str | None = None, limit: int = 100) -> list[dict]:
    from streamlake.operations.consistency import recent_checks

    return json.loads(json.dumps(recent_checks(limit, job), default=str))


@app.get("/checks", response_class=HTMLResponse)
def checks(job: str | None = Query(None), limit: int = Query(100, le=1000)) -> HTMLResponse:
    from streamlake.operations.consistency import recent_checks

    rows = []
    for r in recent_checks(limit, job):
        counts = [_td(r[k], "num") for k in ("kafka_records", "table_rows", "missing", "duplicated", "extra",
                                             "mismatched")]
        context = json.loads(r["context"] or "{}")
        rows.append([_td(r["checked_at"]), _td(r["operation"]), _td(r["job"]), _td(r["delta_version"], "num"),
                     *counts, _td("" if r["offsets_match"] is None else r["offsets_match"]),
                     _td(r["verdict"], r["verdict"]), _td(context.get("dag_id", "")), _td(context.get("run_id", ""))])
    body = _table(["checked at", "operation", "job", "Delta version", "Kafka records", "table rows", "missing",
                   "duplicated", "extra", "mismatched", "offsets as expected", "verdict", "DAG", "run"],
                  rows, "No consistency checks recorded yet.")
    return _page("Consistency checks", body)


@app.get("/api/operations")
def api_operations(job: str | None = None, limit: int = 100) -> list[dict]:
    from streamlake.operations.records import recent_operations

    return json.loads(json.dumps(recent_operations(limit, job), default=str))


@app.get("/operations", response_class=HTMLResponse)
def operations(job: str | None = Query(None), limit: int = Query(100, le=1000)) -> HTMLResponse:
    from streamlake.operations.records import recent_operations

    rows = []
    for r in recent_operations(limit, job):
        details = json.loads(r["details"] or "{}")
        summary = details
        if r["operation"] in ("rescale", "rescale-throughput"):
            summary = {"before": details.get("throughput_before"),
                       "after": details.get("throughput_after", "measured by the job's next run"),
                       "settings": details.get("settings", {}).get("after")}
        rows.append([_td(r["at"]), _td(r["operation"]), _td(r["job"]),
                     "<td><code>" + html.escape(json.dumps(summary, default=str)[:600]) + "</code></td>"])
    return _page("Operations", _table(["at", "operation", "job", "details"], rows, "No operations yet."))


# -- data quality ----------------------------------------------------------------------------------


def _airflow_base(request: Request) -> str:
    """The Airflow UI's path prefix (this app is mounted at ``<prefix>/streamlake``)."""
    root = request.scope.get("root_path", "") or ""
    return root[: -len("/streamlake")] if root.endswith("/streamlake") else ""


def _run_link(request: Request, r: dict) -> str:
    """The operation and a link to the DAG run (and task) it came from, if any."""
    op = html.escape(r.get("operation") or "")
    if not r.get("dag_id") or not r.get("dag_run_id"):
        return f"<td>{op}<br><span class='muted'>not from a DAG run</span></td>"
    base = _airflow_base(request)
    run_url = f"{base}/dags/{quote(r['dag_id'], safe='')}/runs/{quote(r['dag_run_id'], safe='')}"
    task = ""
    if r.get("task_id"):
        task_url = f"{run_url}/tasks/{quote(r['task_id'], safe='')}"
        task = f" · <a class='task-link' href='{html.escape(task_url)}' target='_top'>{html.escape(r['task_id'])}</a>"
    return (f"<td>{op}<br><a class='run-link' href='{html.escape(run_url)}' target='_top'>"
            f"{html.escape(r['dag_id'])} / {html.escape(r['dag_run_id'])}</a>{task}</td>")


def _docs_link(page: str | None, text: str = "Data Docs") -> str:
    if not page:
        return "<td class='muted'>-</td>"
    return f"<td><a class='docs-link' href='quality/docs/{html.escape(quote(page))}'>{html.escape(text)}</a></td>"


def _suite_link(suite: str) -> str:
    from streamlake.quality.docs import suite_page

    return (f"<td><a class='suite-link' href='quality/docs/{html.escape(quote(suite_page(suite)))}'>"
            f"{html.escape(suite)}</a></td>")


def _version_range(v: dict) -> str:
    if v.get("to_version") is None:
        return "-"
    if v.get("from_version") is None:
        return f"v{v['to_version']} (snapshot)"
    return f"(v{v['from_version']}, v{v['to_version']}]"


def _json_cell(text: str | None, limit: int = 300) -> str:
    if not text:
        return "<td></td>"
    short = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"<td><code>{html.escape(short)}</code></td>"


@app.get("/api/quality")
def api_quality(table: str | None = None) -> list[dict]:
    """The latest validation per table and suite, with its expectations (failing first)."""
    from streamlake.quality.results import latest

    return json.loads(json.dumps(latest(table), default=str))


@app.get("/api/quality/validations")
def api_quality_validations(table: str | None = None, limit: int = Query(200, le=5000)) -> list[dict]:
    from streamlake.quality.results import validations

    return json.loads(json.dumps(validations(table, limit), default=str))


@app.get("/quality", response_class=HTMLResponse)
def quality(request: Request, table: str | None = Query(None)) -> HTMLResponse:
    from streamlake.quality.docs import suite_page
    from streamlake.quality.plots import trend_svg
    from streamlake.quality.results import latest, trend

    current = latest(table)
    summary_rows = []
    for v in current:
        failing = [r["expectation_key"] for r in v["results"] if not r["success"]]
        summary_rows.append([
            _td(v["status"], v["status"]),
            f"<td><a href='#v-{html.escape(v['validation_id'])}'>{html.escape(v['table_name'])}</a></td>",
            _suite_link(v["suite"]), _td(v["validated_at"]),
            _run_link(request, v), _td(_version_range(v)), _td(v["rows"], "num"),
            _td(f"{v['passed']}/{v['expectations']}", "num"), _td(", ".join(failing)),
            _docs_link(v["docs_page"]),
        ])
    body = [("<p class='muted'>Latest validation per table and suite (Great Expectations), failing first. "
            "A <b>critical</b> failure fails the operation's task; a <b>warning</b> flags the result. "
            "Run one from the shell with <code>streamlake quality run --table T</code>. "
            "<a class='docs-index' href='quality/docs/index.html'>Data Docs index</a></p>"),
            _table(["status", "table", "suite", "validated at", "operation / DAG run", "version range", "rows",
                    "expectations met", "failing", "report"], summary_rows,
                   "No quality results yet: they are recorded after every operation, or run "
                   "`streamlake quality run --table bronze`.")]
    tables = sorted({v["table_name"] for v in current})
    if tables:
        body.append("<h2>Trend</h2><div class='trends'>")
        for t in tables:
            body.append(f"<div class='trend-box' id='trend-{html.escape(t)}'>"
                        f"{trend_svg(trend(t), title=f'{t}: pass rate and unexpected rows')}</div>")
        body.append("</div>")
    for v in current:
        head = "".join(f"<th>{h}</th>" for h in ("severity", "key", "expectation", "column", "result", "observed",
                                                 "unexpected", "examples (with lineage)"))
        rows, passing = [], []
        for r in v["results"]:
            verdict = "PASS" if r["success"] else "FAIL"
            observed = f"error: {r['exception']}" if r["exception"] else r["observed_value"]
            cells = [_td(r["severity"], r["severity"]), _td(r["expectation_key"]), _td(r["expectation"]),
                     _td(r["column_name"]), _td(verdict, verdict), _json_cell(observed),
                     _td(r["unexpected_count"], "num"), _json_cell(r["examples"])]
            (passing if r["success"] else rows).append(
                f"<tr class='{'passing' if r['success'] else 'failing'}' "
                f"data-key='{html.escape(r['expectation_key'] or '')}' "
                f"data-severity='{html.escape(r['severity'] or '')}'>{''.join(cells)}</tr>")
        expectations = (f"<table class='expectations'><thead><tr>{head}</tr></thead>"
                        f"<tbody>{''.join(rows)}</tbody></table>") if rows else \
            "<p class='PASS'>Every expectation met.</p>"
        if passing:
            expectations += (f"<details class='passing-expectations'{'' if rows else ' open'}><summary>"
                             f"{len(passing)} expectations met</summary><table class='expectations'><thead>"
                             f"<tr>{head}</tr></thead><tbody>{''.join(passing)}</tbody></table></details>")
        body.append(
            f"<section class='validation' id='v-{html.escape(v['validation_id'])}' "
            f"data-table='{html.escape(v['table_name'])}' data-status='{html.escape(v['status'])}'>"
            f"<h2>{html.escape(v['table_name'])} · <a class='suite-link' href='quality/docs/"
            f"{html.escape(quote(suite_page(v['suite'])))}'>{html.escape(v['suite'])}</a> · "
            f"<span class='{html.escape(v['status'])}'>{html.escape(v['status'])}</span></h2>"
            f"<p class='muted'>{html.escape(str(v['validated_at']))} · operation "
            f"<b>{html.escape(v['operation'] or '')}</b> · {html.escape(_version_range(v))} of "
            f"<code>{html.escape(v['table_path'] or '')}</code> · {v['rows']} rows · quality run "
            f"<code>{html.escape(v['run_id'])}</code></p>"
            f"<table><tbody><tr>{_run_link(request, v)}{_docs_link(v['docs_page'], 'Data Docs page')}"
            f"</tr></tbody></table>"
            f"{expectations}</section>")
    return _page("Data quality", "".join(body))


@app.get("/quality/docs")
def quality_docs_root() -> RedirectResponse:
    return RedirectResponse("docs/index.html")


# Data Docs take their styles and icons from public CDNs. Where those cannot be reached
# (no internet access), this keeps the pages legible: tables, and a check mark or a cross
# in place of the icon fonts' status icons.
_DOCS_FALLBACK_STYLE = """<style id="streamlake-offline-style">
 body { font-family: system-ui, sans-serif; color: #1d2733; }
 table { border-collapse: collapse; } th, td { border-bottom: 1px solid #dde3ea; padding: .25rem .5rem;
 text-align: left; vertical-align: top; }
 i.fa-check-circle::before { content: "\\2713"; color: #137333; font-style: normal; font-weight: 700; }
 i.fa-times::before { content: "\\2717"; color: #b3261e; font-style: normal; font-weight: 700; }
</style>"""


@app.get("/quality/docs/{page:path}")
def quality_docs(page: str):
    """A file of the Data Docs site; 404 for anything outside its folder."""
    from streamlake.quality.docs import resolve_page

    path = resolve_page(page)
    if path is None:
        raise HTTPException(status_code=404, detail="no such Data Docs page")
    if path.suffix == ".html":
        text = path.read_text(encoding="utf-8", errors="replace")
        head_end = text.find("</head>")
        text = text[:head_end] + _DOCS_FALLBACK_STYLE + text[head_end:] if head_end >= 0 else text
        return HTMLResponse(text)
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media_type)


# -- late events ------------------------------------------------------------------------------------


def _job_or_demo(job: str | None):
    from streamlake.operations.jobs import DEMO_JOB, load_job

    return load_job(job or DEMO_JOB)


@app.get("/api/late-events")
def api_late_events(job: str | None = None) -> list[dict]:
    from streamlake.pipeline.late_events import hourly_summary

    return json.loads(json.dumps(hourly_summary(_job_or_demo(job).table_path("late_events")), default=str))


@app.get("/late-events", response_class=HTMLResponse)
def late_events(request: Request, job: str | None = Query(None)) -> HTMLResponse:
    """Pending and applied late events per hour of event time, the windows they touch, and a
    link to the prefilled backfill form for that hour."""
    from streamlake.pipeline.late_events import hourly_summary

    spec = _job_or_demo(job)
    rows = []
    for h in hourly_summary(spec.table_path("late_events")):
        form = (f"late-events/backfill?job={quote(spec.name)}&start={quote(h['hour'].isoformat())}"
                f"&end={quote(h['end'].isoformat())}")
        action = (f"<td><a class='backfill-link' href='{html.escape(form)}'>backfill this hour</a></td>"
                  if h["pending"] else "<td class='muted'>nothing pending</td>")
        rows.append([_td(f"{h['hour']:%Y-%m-%d %H:00} UTC"), _td(h["pending"], "num" + (" FAIL" if h["pending"] else "")),
                     _td(h["applied"], "num"), _td(h["windows"], "num"),
                     _td(", ".join(h["example_windows"]) + (" ..." if h["windows"] > len(h["example_windows"]) else "")),
                     action])
    body = _table(["event-time hour", "pending", "applied", "gold windows to restate", "some of them", ""], rows,
                  "No late events: every event arrived before its window closed.")
    intro = (f"<p>Job <b>{html.escape(spec.name)}</b>: events that arrived after their window had closed. Gold "
             f"keeps them here until the <b>backfill_late_data</b> DAG restates their windows from silver "
             f"(<a href='late-events/backfill?job={quote(spec.name)}&all_pending=true'>backfill all pending</a>, or "
             f"<code>streamlake backfill --job {html.escape(spec.name)}</code>).</p>")
    return _page("Late events", intro + body)


@app.get("/late-events/backfill", response_class=HTMLResponse)
def backfill_form(job: str | None = Query(None), start: str | None = Query(None), end: str | None = Query(None),
                  all_pending: bool = Query(False)) -> HTMLResponse:
    """The backfill trigger form, filled in for a range (Airflow 3.3's own form cannot be
    opened from a link with values)."""
    spec = _job_or_demo(job)
    value = lambda v: html.escape((v or "")[:19])  # noqa: E731 - datetime-local wants YYYY-MM-DDTHH:MM:SS
    body = f"""<form method='post' action='late-events/backfill'>
      <input type='hidden' name='job' value='{html.escape(spec.name)}'>
      <p><label>Event time from (UTC) <input type='datetime-local' step='1' name='start' value='{value(start)}'></label>
         <label>to <input type='datetime-local' step='1' name='end' value='{value(end)}'></label></p>
      <p><label><input type='checkbox' name='all_pending' value='true' {'checked' if all_pending else ''}>
         all pending late events (ignore the range)</label></p>
      <p><label><input type='checkbox' name='dry_run' value='true'> dry run: list what would change, change nothing
         </label></p>
      <p><button type='submit'>Trigger backfill_late_data</button></p></form>
      <p class='muted'>Triggers a run of the <b>backfill_late_data</b> DAG as you, with this range; the run restates
      the windows, marks the late events applied and proves gold equals a recompute from silver.</p>"""
    return _page(f"Backfill late events of {spec.name}", body, base="../")


@app.post("/late-events/backfill", response_class=HTMLResponse)
async def trigger_backfill(request: Request) -> HTMLResponse:
    """Trigger ``backfill_late_data`` through Airflow's REST API with the caller's own login."""
    import urllib.error
    import urllib.request

    form = dict((await request.form()).items())
    conf = {"job": form.get("job"), "all_pending": form.get("all_pending") == "true",
            "dry_run": form.get("dry_run") == "true",
            "start": f"{form['start']}+00:00" if form.get("start") else None,
            "end": f"{form['end']}+00:00" if form.get("end") else None}
    token = request.cookies.get("_token") or request.headers.get("authorization", "").removeprefix("Bearer ")
    base = str(request.base_url).rstrip("/")
    base = base[: -len("/streamlake")] if base.endswith("/streamlake") else base
    call = urllib.request.Request(f"{base}/api/v2/dags/backfill_late_data/dagRuns", method="POST",
                                  data=json.dumps({"logical_date": None, "conf": conf}).encode(),
                                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    def post():
        with urllib.request.urlopen(call, timeout=30) as resp:
            return json.load(resp)

    try:
        import anyio

        run = await anyio.to_thread.run_sync(post)  # Airflow's API may be served by this very process
    except urllib.error.HTTPError as exc:
        return _page("Backfill not triggered", f"<p class='FAIL'>Airflow answered {exc.code}: "
                                               f"{html.escape(exc.read().decode(errors='replace')[:500])}</p>",
                     base="../")
    url = f"{_airflow_base(request)}/dags/backfill_late_data/runs/{quote(run['dag_run_id'], safe='')}"
    return _page("Backfill triggered", f"<p class='PASS'>Run <a href='{html.escape(url)}' target='_top'>"
                                       f"{html.escape(run['dag_run_id'])}</a> of backfill_late_data: "
                                       f"<code>{html.escape(json.dumps(conf))}</code></p>", base="../")


class StreamLakePlugin(AirflowPlugin):
    name = "streamlake"
    fastapi_apps = [{"app": app, "url_prefix": "/streamlake", "name": "StreamLake"}]
    external_views = [
        {"name": "Savepoints", "href": "/streamlake/savepoints", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-savepoints"},
        {"name": "Consistency checks", "href": "/streamlake/checks", "destination": "nav",
         "category": "StreamLake", "url_route": "streamlake-checks"},
        {"name": "Operations", "href": "/streamlake/operations", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-operations"},
        {"name": "Late events", "href": "/streamlake/late-events", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-late-events"},
        {"name": "Data quality", "href": "/streamlake/quality", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-quality"},
    ]
