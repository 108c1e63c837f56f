"""StreamLake views in the Airflow UI: savepoints, consistency checks, operations.

A FastAPI app mounted by Airflow's API server under ``/streamlake`` and linked
from the navigation (``external_views``). Every page requires an Airflow login
(the UI's session cookie or a bearer token). Pages are read-only: savepoints are
taken, restored and disposed through the DAGs or ``streamlake savepoint``.
"""

from __future__ import annotations

import html
import json

from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin

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
</style>
"""


def _page(title: str, body: str) -> HTMLResponse:
    nav = ('<nav><a href="savepoints">Savepoints</a><a href="checks">Consistency checks</a>'
           '<a href="operations">Operations</a></nav>')
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
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


@app.get("/operations", response_class=HTMLResponse)
def operations(job: str | None = Query(None), limit: int = Query(100, le=1000)) -> HTMLResponse:
    from streamlake.operations.records import recent_operations

    rows = []
    for r in recent_operations(limit, job):
        details = json.loads(r["details"] or "{}")
        summary = details
        if r["operation"] == "rescale":
            summary = {"before": details.get("throughput_before"), "after": details.get("throughput_after"),
                       "settings": details.get("settings", {}).get("after")}
        rows.append([_td(r["at"]), _td(r["operation"]), _td(r["job"]),
                     "<td><code>" + html.escape(json.dumps(summary, default=str)[:600]) + "</code></td>"])
    return _page("Operations", _table(["at", "operation", "job", "details"], rows, "No operations yet."))


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
    ]
