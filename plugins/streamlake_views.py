"""StreamLake views in the Airflow UI: pipelines, late events, data quality, savepoints, checks, operations, health.

A FastAPI app mounted by Airflow's API server under ``/streamlake`` and linked
from the navigation (``external_views``). Every page requires an Airflow login
(the UI's session cookie or a bearer token). Pages are read-only but for the
backfill form, which triggers a pipeline's ``backfill_<pipeline>`` DAG with the
user's own login: savepoints are taken, restored and disposed through the DAGs
or ``streamlake savepoint``.

The *Pipelines* view lists every pipeline (each definition in ``pipelines/`` and
every defined job) with its tables, pending late events, latest checks and data
quality; the other views take ``?job=NAME`` to show one pipeline. Times are
shown to the second in the browser's time zone, with UTC on hover.

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
 dl.op-details { display: grid; grid-template-columns: max-content auto; gap: .1rem .8rem; margin: 0; }
 dl.op-details dt { color: #66727f; } dl.op-details dd { margin: 0; } dl.op-details dl.op-details { font-size: .95em; }
 details.raw-json summary { color: #66727f; font-size: .8rem; } details.raw-json pre { font-size: .75rem;
 white-space: pre-wrap; max-width: 60rem; } time.ts { white-space: nowrap; }
 section.pipeline, section.aggregate { border-top: 1px solid #dde3ea; margin-top: 1rem; }
</style>
"""

# Every <time class="ts"> shows its UTC instant in the browser's time zone, to the second;
# the UTC time stays on hover (the element's title), as on Airflow's own pages.
_LOCAL_TIME_SCRIPT = """<script>
document.querySelectorAll("time.ts[datetime]").forEach(function (el) {
  var d = new Date(el.getAttribute("datetime"));
  if (isNaN(d)) { return; }
  function p(n) { return String(n).padStart(2, "0"); }
  el.textContent = d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
    p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
});
</script>"""


def _page(title: str, body: str, base: str | None = None) -> HTMLResponse:
    """A page of the app; ``base`` (e.g. ``"../"``) for pages below the app's top level, so
    the relative links (navigation, forms) still point into the app."""
    nav = ('<nav><a href="pipelines">Pipelines</a><a href="late-events">Late events</a>'
           '<a href="quality">Data quality</a><a href="savepoints">Savepoints</a>'
           '<a href="checks">Consistency checks</a><a href="operations">Operations</a><a href="health">Health</a></nav>')
    head = f"<base href='{html.escape(base)}'>" if base else ""
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'>{head}<title>{html.escape(title)}</title>"
                        f"{_STYLE}</head><body>{nav}<h1>{html.escape(title)}</h1>{body}{_LOCAL_TIME_SCRIPT}"
                        f"</body></html>")


def _utc(value):
    """A time value (aware or naive-UTC datetime, ISO text, epoch seconds) as an aware UTC
    datetime; None for an empty value or one that does not parse."""
    import datetime as dt

    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, dt.datetime):
        return None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _time(value) -> str:
    """A time to the second: UTC in the page (the browser's script shows it in the user's time
    zone), UTC on hover."""
    when = _utc(value)
    if when is None:
        return html.escape("" if value is None else str(value))
    utc = f"{when:%Y-%m-%d %H:%M:%S} UTC"
    return f"<time class='ts' datetime='{when:%Y-%m-%dT%H:%M:%SZ}' title='{utc}'>{utc}</time>"


def _td_time(value) -> str:
    return f"<td>{_time(value)}</td>"


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
    """The savepoints (of ``job``), newest first, with what each holds."""
    from streamlake.operations.savepoints import jobs_restored_from, list_savepoints

    rows = []
    for m in list_savepoints(job):
        in_use = jobs_restored_from(m.id)
        rows.append([
            _td(m.id), _td(m.job), _td_time(m.created_at),
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


CHECK_NAMES = {"kafka-audit": "Kafka audit", "pipeline-accounting": "pipeline accounting",
               "gold": "gold = recompute"}
CHECK_HELP = {"kafka-audit": "bronze holds exactly the records Kafka holds in the ranges it committed",
              "pipeline-accounting": "every bronze row once in silver, quarantine or the dropped duplicates",
              "gold": "the gold table equals a recompute from silver"}


def _table_of(path: str | None) -> str:
    """A table's name from its path: ``bronze``, ``silver``, ``gold/<aggregate>``..."""
    parts = [p for p in str(path or "").split("/") if p]
    if len(parts) >= 2 and parts[-2] in ("gold", "late_events"):
        return "/".join(parts[-2:])
    return parts[-1] if parts else "?"


def _check_details(row: dict) -> dict:
    try:
        return json.loads(row.get("context") or "{}").get("details") or {}
    except ValueError:
        return {}


def _covered(row: dict) -> str:
    """What a check covered, in words: the table, the versions, the offsets or event times."""
    kind = row.get("kind") or "kafka-audit"
    details = _check_details(row)
    table = _table_of(row.get("table_path"))
    if kind == "pipeline-accounting":
        since, through = details.get("since_version"), details.get("bronze_version")
        scope = (f"bronze versions ({since}, {through}]" if since is not None else
                 f"bronze up to version {through}" if through is not None else "bronze (nothing consumed yet)")
        return f"{scope} → silver, quarantine"
    if kind == "gold":
        start, end = details.get("range_start"), details.get("range_end")
        times = f"event time [{start or '-∞'}, {end or '+∞'})"
        return f"{table} against silver v{details.get('silver_version')}, {times}"
    try:
        topics = ", ".join(json.loads(row.get("topics") or "[]"))
    except ValueError:
        topics = row.get("topics") or ""
    text = f"{table} v{row.get('delta_version')} against {topics or 'Kafka'}"
    if row.get("mode"):
        text += f" ({row['mode']}" + (f" from the proof of v{row['proof_version']})"
                                      if row.get("proof_version") is not None else ")")
    if row.get("offsets_expected"):
        try:
            expected = json.loads(row["offsets_expected"])
            text += "; offsets expected " + ", ".join(f"{t}-{p}: {o}" for t, ps in sorted(expected.items())
                                                      for p, o in sorted(ps.items()))
        except (ValueError, AttributeError):
            pass
    return text


@app.get("/checks", response_class=HTMLResponse)
def checks(job: str | None = Query(None), limit: int = Query(100, le=1000)) -> HTMLResponse:
    """Every recorded check (of ``job``), newest first: which check, what it covered, its verdict."""
    from streamlake.operations.consistency import recent_checks

    rows = []
    for r in recent_checks(limit, job):
        kind = r.get("kind") or "kafka-audit"
        counts = [_td(r[k], "num") for k in ("kafka_records", "table_rows", "missing", "duplicated", "extra",
                                             "mismatched")]
        context = json.loads(r["context"] or "{}")
        name = (f"<td class='check-name' title='{html.escape(CHECK_HELP.get(kind, kind))}'>"
                f"{html.escape(CHECK_NAMES.get(kind, kind))}</td>")
        cells = [_td_time(r["checked_at"]), name, _td(_covered(r), "check-covered"), _td(r["operation"]),
                 _td(r["job"]), _td(r["verdict"], r["verdict"]), *counts,
                 _td("" if r["offsets_match"] is None else r["offsets_match"]), _td(context.get("dag_id", "")),
                 _td(context.get("run_id", ""))]
        rows.append((kind, cells))
    head = ["checked at", "check", "covered", "operation", "job", "verdict", "Kafka records", "table rows",
            "missing", "duplicated", "extra", "mismatched", "offsets as expected", "DAG", "run"]
    if not rows:
        return _page("Consistency checks", "<p class='muted'>No consistency checks recorded yet.</p>")
    body = "".join(f"<tr class='check' data-kind='{html.escape(kind)}'>{''.join(cells)}</tr>" for kind, cells in rows)
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    intro = ("<p class='muted'>Every proof the platform ran: the <b>Kafka audit</b> (bronze against Kafka), the "
             "<b>pipeline accounting</b> (every bronze row once downstream) and <b>gold = recompute</b> (one per "
             "gold table). Counts: records read from Kafka or windows checked, rows, and what was wrong.</p>")
    return _page("Consistency checks", intro + f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>")


@app.get("/api/operations")
def api_operations(job: str | None = None, limit: int = 100) -> list[dict]:
    from streamlake.delta.records import recent_operations

    return json.loads(json.dumps(recent_operations(limit, job), default=str))


RUN_KEYS = ("dag_id", "run_id", "task_id")


def _value_html(value, depth: int = 0) -> str:
    """A value of an operation's details for people: nested mappings as definition lists,
    lists joined, long text shortened."""
    if isinstance(value, dict):
        if not value:
            return "<span class='muted'>none</span>"
        if depth >= 2:
            return f"<code>{html.escape(json.dumps(value, default=str)[:300])}</code>"
        return _details_html(value, depth + 1)
    if isinstance(value, list):
        if not value:
            return "<span class='muted'>none</span>"
        if all(not isinstance(v, (dict, list)) for v in value):
            text = ", ".join(str(v) for v in value)
            return html.escape(text if len(text) <= 300 else text[:299] + "…")
        return "<br>".join(_value_html(v, depth + 1) for v in value[:10]) + (" …" if len(value) > 10 else "")
    if value is None:
        return "<span class='muted'>-</span>"
    text = str(value)
    return html.escape(text if len(text) <= 300 else text[:299] + "…")


def _details_html(details: dict, depth: int = 0) -> str:
    parts = []
    run = {k: details.get(k) for k in RUN_KEYS if details.get(k)}
    for key, value in details.items():
        if key in RUN_KEYS:
            continue
        parts.append(f"<dt>{html.escape(key.replace('_', ' '))}</dt><dd>{_value_html(value, depth)}</dd>")
    if run and depth == 0:
        parts.append(f"<dt>DAG run</dt><dd>{html.escape(' / '.join(str(v) for v in run.values()))}</dd>")
    return f"<dl class='op-details'>{''.join(parts)}</dl>"


def _operation_summary(operation: str, details: dict) -> dict:
    """What a person wants first of an operation (the rest is behind the raw JSON toggle)."""
    if operation in ("rescale", "rescale-throughput"):
        return {"throughput before": details.get("throughput_before"),
                "throughput after": details.get("throughput_after", "measured by the job's next run"),
                "settings after": (details.get("settings") or {}).get("after"),
                **{k: details[k] for k in RUN_KEYS if details.get(k)}}
    return details


@app.get("/operations", response_class=HTMLResponse)
def operations(job: str | None = Query(None), limit: int = Query(100, le=1000)) -> HTMLResponse:
    """Savepoints, restores, rescales, backfills and pipeline runs (of ``job``), newest first."""
    from streamlake.delta.records import recent_operations

    rows = []
    for r in recent_operations(limit, job):
        details = json.loads(r["details"] or "{}")
        readable = _details_html(_operation_summary(r["operation"], details))
        raw = (f"<details class='raw-json'><summary>raw JSON</summary><pre>"
               f"{html.escape(json.dumps(details, indent=2, default=str))}</pre></details>")
        rows.append([_td_time(r["at"]), _td(r["operation"]), _td(r["job"]), f"<td>{readable}{raw}</td>"])
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
def api_quality(table: str | None = None, job: str | None = None) -> list[dict]:
    """The latest validation per table and suite (of ``job``'s pipeline), with its expectations
    (failing first)."""
    from streamlake.quality.results import latest

    return json.loads(json.dumps(latest(table, job), default=str))


@app.get("/api/quality/validations")
def api_quality_validations(table: str | None = None, job: str | None = None,
                            limit: int = Query(200, le=5000)) -> list[dict]:
    from streamlake.quality.results import validations

    return json.loads(json.dumps(validations(table, limit, job), default=str))


def _dom_id(text: str) -> str:
    """``text`` as an HTML id (table and suite names hold ``/`` and ``.``)."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)


def _job_picker(page: str, current: str | None, jobs: list[str], everything: str | None = None) -> str:
    """Links to the same page of each pipeline (and of all of them when ``everything``)."""
    links = []
    if everything is not None:
        cls = " class='current'" if current is None else ""
        links.append(f"<a{cls} href='{page}'>{html.escape(everything)}</a>")
    for name in jobs:
        cls = " class='current'" if name == current else ""
        links.append(f"<a{cls} data-job='{html.escape(name)}' href='{page}?job={quote(name)}'>{html.escape(name)}</a>")
    return f"<p class='job-picker'>Pipeline: {' · '.join(links)}</p>"


@app.get("/quality", response_class=HTMLResponse)
def quality(request: Request, table: str | None = Query(None), job: str | None = Query(None)) -> HTMLResponse:
    """The latest validation per table and suite (of ``job``'s pipeline), failing first, with
    a trend per suite and every expectation's outcome."""
    from streamlake.operations.jobs import list_jobs
    from streamlake.quality.docs import suite_page
    from streamlake.quality.plots import trend_svg
    from streamlake.quality.results import latest, validations

    current = latest(table, job)
    summary_rows = []
    for v in current:
        failing = [r["expectation_key"] for r in v["results"] if not r["success"]]
        summary_rows.append([
            _td(v["status"], v["status"]),
            f"<td><a href='#v-{html.escape(v['validation_id'])}'>{html.escape(v['table_name'])}</a></td>",
            _suite_link(v["suite"]), _td_time(v["validated_at"]),
            _run_link(request, v), _td(_version_range(v)), _td(v["rows"], "num"),
            _td(f"{v['passed']}/{v['expectations']}", "num"), _td(", ".join(failing)),
            _docs_link(v["docs_page"]),
        ])
    body = [_job_picker("quality", job, list_jobs(), everything="all"),
            ("<p class='muted'>Latest validation per table and suite (Great Expectations), failing first. "
             "A <b>critical</b> failure fails the operation's task; a <b>warning</b> flags the result. "
             "Suites derive from each pipeline's definition. Run one from the shell with "
             "<code>streamlake quality run --job NAME --table T</code>. "
             "<a class='docs-index' href='quality/docs/index.html'>Data Docs index</a></p>"),
            _table(["status", "table", "suite", "validated at", "operation / DAG run", "version range", "rows",
                    "expectations met", "failing", "report"], summary_rows,
                   "No quality results yet: they are recorded after every operation, or run "
                   "`streamlake quality run --job NAME --table bronze`.")]
    suites = sorted({(v["suite"], v["table_name"]) for v in current})
    if suites:
        body.append("<h2>Trend</h2><div class='trends'>")
        for suite, t in suites:
            points = list(reversed([v for v in validations(t, 400, job) if v["suite"] == suite][:200]))
            body.append(f"<div class='trend-box' id='trend-{_dom_id(suite)}' data-table='{html.escape(t)}'>"
                        f"{trend_svg(points, title=f'{suite}: pass rate and unexpected rows')}</div>")
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
            f"<p class='muted'>{_time(v['validated_at'])} · operation "
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
        raise HTTPException(status_code=404, detail=(
            "no such Data Docs page: the Data Docs keep each suite's newest validations only "
            "(STREAMLAKE_QUALITY_DOCS_PER_SUITE); the Data quality view keeps every outcome"))
    if path.suffix == ".html":
        text = path.read_text(encoding="utf-8", errors="replace")
        head_end = text.find("</head>")
        text = text[:head_end] + _DOCS_FALLBACK_STYLE + text[head_end:] if head_end >= 0 else text
        return HTMLResponse(text)
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media_type)


# -- late events ------------------------------------------------------------------------------------


def _job_or_default(job: str | None):
    """The named job, or the demo pipeline (the first job when there is no demo)."""
    from streamlake.operations.jobs import DEMO_JOB, list_jobs, load_job

    names = list_jobs()
    return _reachable(load_job(job or (DEMO_JOB if DEMO_JOB in names or not names else names[0])))


def _reachable(job):
    """``job``, its tables reachable from this process: for a root on an object store, the
    credentials of its storage connection (an Airflow ``aws`` connection) are remembered for
    the root (never in the page or a log)."""
    import logging

    from streamlake.orchestration.hooks import reach_store

    reach_store(job, logging.getLogger(__name__))
    return job


def _late_hours(spec) -> list[dict]:
    """Every aggregate's hourly late-event summary, each row with its ``aggregate``."""
    from streamlake.pipeline.late_events import hourly_summary

    definition = spec.definition
    if definition is None:
        return []
    return [{"aggregate": agg.name, **h} for agg in definition.aggregates
            for h in hourly_summary(definition, agg, spec.table_path(agg.late_table))]


@app.get("/api/late-events")
def api_late_events(job: str | None = None) -> list[dict]:
    return json.loads(json.dumps(_late_hours(_job_or_default(job)), default=str))


@app.get("/late-events", response_class=HTMLResponse)
def late_events(request: Request, job: str | None = Query(None)) -> HTMLResponse:
    """Per aggregate of the pipeline: pending and applied late events per hour of event time,
    the windows they touch, and a link to the prefilled backfill form for that hour."""
    from streamlake.operations.jobs import list_jobs
    from streamlake.orchestration.pipeline_dags import backfill_dag_id

    spec = _job_or_default(job)
    definition = spec.definition
    hours = _late_hours(spec)
    dag = backfill_dag_id(spec.name)
    body = [_job_picker("late-events", spec.name, list_jobs()),
            f"<p>Pipeline <b>{html.escape(spec.name)}</b>: events that arrived after their window had closed. "
            f"Each gold table keeps them until the <b>{html.escape(dag)}</b> DAG restates their windows from "
            f"silver (<a class='backfill-all' href='late-events/backfill?job={quote(spec.name)}&all_pending=true'>"
            f"backfill all pending</a>, or <code>streamlake backfill --job {html.escape(spec.name)}</code>).</p>"]
    for agg in (definition.aggregates if definition else ()):
        rows = []
        for h in (h for h in hours if h["aggregate"] == agg.name):
            form = (f"late-events/backfill?job={quote(spec.name)}&aggregate={quote(agg.name)}"
                    f"&start={quote(h['hour'].isoformat())}&end={quote(h['end'].isoformat())}")
            action = (f"<td><a class='backfill-link' href='{html.escape(form)}'>backfill this hour</a></td>"
                      if h["pending"] else "<td class='muted'>nothing pending</td>")
            examples = ", ".join(h["example_windows"]) + (" ..." if h["windows"] > len(h["example_windows"]) else "")
            rows.append([f"<td>{_time(h['hour'])}</td>", _td(h["pending"], "num" + (" FAIL" if h["pending"] else "")),
                         _td(h["applied"], "num"), _td(h["windows"], "num"), _td(examples), action])
        table = _table(["event-time hour", "pending", "applied", "gold windows to restate", "some of them", ""], rows,
                       "No late events: every event arrived before its window closed.")
        body.append(f"<section class='aggregate' data-aggregate='{html.escape(agg.name)}'>"
                    f"<h2>gold/{html.escape(agg.name)} <span class='muted'>({html.escape(str(agg.window))} windows, "
                    f"allowed lateness {html.escape(agg.to_dict()['allowed_lateness'])})</span></h2>{table}</section>")
    if definition is None:
        body.append("<p class='muted'>This job ingests bronze only: it has no gold tables.</p>")
    return _page("Late events", "".join(body))


@app.get("/late-events/backfill", response_class=HTMLResponse)
def backfill_form(job: str | None = Query(None), aggregate: str | None = Query(None), start: str | None = Query(None),
                  end: str | None = Query(None), all_pending: bool = Query(False)) -> HTMLResponse:
    """The backfill trigger form, filled in for a range (Airflow 3.3's own form cannot be
    opened from a link with values)."""
    from streamlake.orchestration.pipeline_dags import backfill_dag_id

    spec = _job_or_default(job)
    aggregates = [a.name for a in spec.definition.aggregates] if spec.definition else []
    dag = backfill_dag_id(spec.name)
    value = lambda v: html.escape((v or "")[:19])  # noqa: E731 - datetime-local wants YYYY-MM-DDTHH:MM:SS
    options = "".join(f"<option value='{html.escape(a)}'{' selected' if a == aggregate else ''}>gold/"
                      f"{html.escape(a)}</option>" for a in aggregates)
    body = f"""<form method='post' action='late-events/backfill'>
      <input type='hidden' name='job' value='{html.escape(spec.name)}'>
      <p><label>Aggregate <select name='aggregate'><option value=''{'' if aggregate else ' selected'}>every
         aggregate</option>{options}</select></label></p>
      <p><label>Event time from (UTC) <input type='datetime-local' step='1' name='start' value='{value(start)}'></label>
         <label>to <input type='datetime-local' step='1' name='end' value='{value(end)}'></label></p>
      <p><label><input type='checkbox' name='all_pending' value='true' {'checked' if all_pending else ''}>
         all pending late events (ignore the range)</label></p>
      <p><label><input type='checkbox' name='dry_run' value='true'> dry run: list what would change, change nothing
         </label></p>
      <p><button type='submit'>Trigger {html.escape(dag)}</button></p></form>
      <p class='muted'>Triggers a run of the <b>{html.escape(dag)}</b> DAG as you, with this range; the run restates
      the windows, marks the late events applied and proves gold equals a recompute from silver.</p>"""
    return _page(f"Backfill late events of {spec.name}", body, base="../")


@app.post("/late-events/backfill", response_class=HTMLResponse)
async def trigger_backfill(request: Request) -> HTMLResponse:
    """Trigger the pipeline's ``backfill_<pipeline>`` DAG through Airflow's REST API with the
    caller's own login."""
    import urllib.error
    import urllib.request

    from streamlake.orchestration.pipeline_dags import backfill_dag_id

    form = dict((await request.form()).items())
    dag = backfill_dag_id(_job_or_default(form.get("job")).name)
    conf = {"aggregate": form.get("aggregate") or None, "all_pending": form.get("all_pending") == "true",
            "dry_run": form.get("dry_run") == "true",
            "start": f"{form['start']}+00:00" if form.get("start") else None,
            "end": f"{form['end']}+00:00" if form.get("end") else None}
    token = request.cookies.get("_token") or request.headers.get("authorization", "").removeprefix("Bearer ")
    base = str(request.base_url).rstrip("/")
    base = base[: -len("/streamlake")] if base.endswith("/streamlake") else base
    call = urllib.request.Request(f"{base}/api/v2/dags/{quote(dag, safe='')}/dagRuns", method="POST",
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
    url = f"{_airflow_base(request)}/dags/{quote(dag, safe='')}/runs/{quote(run['dag_run_id'], safe='')}"
    return _page("Backfill triggered", f"<p class='PASS'>Run <a class='run-link' href='{html.escape(url)}' "
                                       f"target='_top'>{html.escape(run['dag_run_id'])}</a> of {html.escape(dag)}: "
                                       f"<code>{html.escape(json.dumps(conf))}</code></p>", base="../")


# -- pipelines ----------------------------------------------------------------------------------------


def _pipeline_overview(name: str) -> dict:
    """One pipeline as the Pipelines view shows it: gold's freshness, definition, tables with
    their Delta versions, pending late events per aggregate, latest checks and quality. A table the
    process cannot reach (a store without credentials here) shows as unreachable."""
    import logging

    from streamlake.delta.table import open_table
    from streamlake.operations.consistency import recent_checks
    from streamlake.operations.jobs import load_job
    from streamlake.pipeline.late_events import pending_count
    from streamlake.quality.results import latest

    from streamlake.pipeline.definition import DefinitionError

    job = _reachable(load_job(name))
    try:  # what the next run applies: a file that no longer loads is shown beside the pipeline
        job.file_definition()
        file_error = None
    except DefinitionError as exc:
        file_error = str(exc)
    try:
        definition = job.definition  # the one its tables were built with, else the file's
    except DefinitionError:
        definition = None
    tables = {}
    for table, path in job.tables().items():
        try:
            tables[table] = open_table(path).version()
        except FileNotFoundError:
            tables[table] = None
        except Exception as exc:  # noqa: BLE001 - an unreachable store: this pipeline says so, the page stays
            logging.getLogger(__name__).warning("pipeline %s: table %s unreachable: %s", name, path, exc)
            tables[table] = f"unreachable: {type(exc).__name__}"
    pending = {}
    for agg in (definition.aggregates if definition else ()):
        try:
            pending[agg.name] = pending_count(definition, agg, job.table_path(agg.late_table))
        except Exception as exc:  # noqa: BLE001 - as above
            pending[agg.name] = f"unreachable: {type(exc).__name__}"
    last_checks = {}
    for row in recent_checks(200, name):
        key = (row.get("kind") or "kafka-audit", _table_of(row.get("table_path")))
        last_checks.setdefault(key, row)
    quality = {v["table_name"]: v["status"] for v in latest(None, name)}
    return {"freshness_s": _freshness(job), "name": name, "definition": definition.source if definition else job.definition_file,
            "definition_error": file_error,
            "description": definition.description if definition else "",
            "topics": job.source_topics if definition or not job.definition_file else [],
            "root": job.root, "running": job.control.is_running(), "tables": tables, "pending_late_events": pending,
            "aggregates": {a.name: {"keys": list(a.keys), "window": str(a.window),
                                    "measures": {m.column: m.expression for m in a.measures}}
                           for a in (definition.aggregates if definition else ())},
            "checks": [{"check": CHECK_NAMES.get(kind, kind), "table": table, "verdict": r["verdict"],
                        "checked_at": r["checked_at"]} for (kind, table), r in last_checks.items()],
            "quality": quality}


def _freshness(job):
    """Gold's freshness in seconds (streamlake.monitoring.freshness), or why there is none."""
    import logging

    from streamlake.monitoring.freshness import gold_freshness_s

    try:
        return round(gold_freshness_s(job, timeout_ms=3_000), 1)
    except FileNotFoundError:
        return "no tables yet"
    except Exception as exc:  # noqa: BLE001 - Kafka or the store unreachable: this pipeline says so
        logging.getLogger(__name__).warning("pipeline %s: freshness unknown: %s", job.name, exc)
        return f"unknown: {type(exc).__name__}"


def _freshness_html(value) -> str:
    if isinstance(value, (int, float)):
        return (f"gold <b class='freshness'>{value:.1f} s</b> behind Kafka's newest record "
                "<span class='muted'>(the age of the oldest record a gold table does not hold yet)</span>")
    return f"gold freshness: <span class='freshness'>{html.escape(str(value))}</span>"


def _definition_error(error: str | None) -> str:
    if not error:
        return ""
    return ("<p class='definition-error'><span class='FAIL'>The definition file does not load</span>: "
            f"{html.escape(error)}. New runs fail until it is fixed; a running job keeps the definition its "
            "tables were built with (<code>streamlake pipeline validate FILE</code>).</p>")


def _pipeline_overviews(names: list[str]) -> list[dict]:
    """:func:`_pipeline_overview` of each pipeline, side by side (each waits on its store and its
    Kafka cluster: with Kafka down, every pipeline's freshness gives up after the same 3 s,
    not one pipeline's 3 s after another's), in the order of ``names``."""
    from concurrent.futures import ThreadPoolExecutor

    if len(names) <= 1:
        return [_pipeline_overview(n) for n in names]
    with ThreadPoolExecutor(max_workers=min(8, len(names)), thread_name_prefix="pipeline-overview") as pool:
        return list(pool.map(_pipeline_overview, names))


@app.get("/api/pipelines")
def api_pipelines() -> list[dict]:
    from streamlake.operations.jobs import list_jobs

    return json.loads(json.dumps(_pipeline_overviews(list_jobs()), default=str))


@app.get("/pipelines", response_class=HTMLResponse)
def pipelines(request: Request) -> HTMLResponse:
    """Every pipeline: its definition, tables, pending late events, latest checks and quality;
    then the definition files that do not load, with why."""
    from streamlake.operations.jobs import definition_errors, list_jobs
    from streamlake.operations.sql_catalog import sql_name
    from streamlake.orchestration.pipeline_dags import backfill_dag_id, ingest_dag_id

    base = _airflow_base(request)
    body = ["<p class='muted'>Each definition in <code>pipelines/</code> (and each job defined with "
            "<code>streamlake job define</code>) is a pipeline: its DAGs run it, these pages show it. "
            "<code>streamlake pipeline validate FILE</code> shows what a definition makes.</p>"]
    names = list_jobs()
    for name, p in zip(names, _pipeline_overviews(names)):
        q = p["quality"]
        rows = [[_td(t), f"<td><code>{html.escape(sql_name(name, t))}</code></td>", _td("-" if v is None else f"v{v}" if isinstance(v, int) else v, "num"), _td(q.get(t, "-"), q.get(t, "")),
                 _td(p["pending_late_events"].get(t.split("/", 1)[1], "") if t.startswith("late_events/") else "",
                     "num")]
                for t, v in p["tables"].items()]
        checks_rows = [[_td(c["check"]), _td(c["table"]), _td(c["verdict"], c["verdict"]), _td_time(c["checked_at"])]
                       for c in p["checks"]]
        links = (f"<a href='{base}/dags/{quote(ingest_dag_id(name))}' target='_top'>{ingest_dag_id(name)}</a> · "
                 f"<a href='{base}/dags/{quote(backfill_dag_id(name))}' target='_top'>{backfill_dag_id(name)}</a> · "
                 f"<a href='late-events?job={quote(name)}'>late events</a> · "
                 f"<a href='quality?job={quote(name)}'>data quality</a> · "
                 f"<a href='checks?job={quote(name)}'>checks</a> · <a href='savepoints?job={quote(name)}'>savepoints</a>")
        aggs = "".join(f"<li><b>gold/{html.escape(a)}</b>: per {html.escape(', '.join(d['keys']) or 'window')} and "
                       f"{html.escape(d['window'])} window: "
                       f"{html.escape(', '.join(f'{c} = {e}' for c, e in d['measures'].items()))}</li>"
                       for a, d in p["aggregates"].items())
        body.append(
            f"<section class='pipeline' data-pipeline='{html.escape(name)}'><h2>{html.escape(name)} "
            f"<span class='muted'>{'running' if p['running'] else 'idle'}</span></h2>"
            f"<p>{html.escape(p['description'])}</p><p class='muted'>topics {html.escape(', '.join(p['topics']))} · "
            f"root <code>{html.escape(p['root'])}</code> · definition <code>{html.escape(p['definition'] or '-')}"
            f"</code></p><p>{_freshness_html(p['freshness_s'])}</p>"
            f"{_definition_error(p['definition_error'])}<p>{links}</p><ul>{aggs}</ul>"
            + _table(["table", "SQL name", "Delta version", "latest quality", "late events pending"], rows, "")
            + _table(["check", "table", "verdict", "checked at"], checks_rows, "No checks recorded yet.")
            + "</section>")
    if not names:
        body.append("<p class='muted'>No pipelines: add a definition to pipelines/.</p>")
    broken = definition_errors()
    if broken:
        rows = [[_td(path.name), _td(message, "FAIL")] for path, message in broken.items()]
        body.append("<section class='definition-errors'><h2>Definitions that do not load</h2><p class='muted'>"
                    "A new file gets no DAGs until it is fixed; a pipeline that ran before keeps its DAGs, and its runs fail until the file is fixed (<code>streamlake pipeline validate FILE</code>)."
                    "</p>" + _table(["file", "what is wrong"], rows, "") + "</section>")
    return _page("Pipelines", "".join(body))


# -- health -------------------------------------------------------------------------------------------


@app.get("/api/health")
def api_health() -> dict:
    from dataclasses import asdict

    from streamlake.monitoring.health import health

    return json.loads(json.dumps(asdict(health()), default=str))


@app.get("/health", response_class=HTMLResponse)
def health_view() -> HTMLResponse:
    """Per pipeline: Kafka lag, gold's freshness and bronze's throughput over the last hour
    (plots), and the alerts firing now; from Prometheus, else the exporter's current values."""
    from streamlake.monitoring.health import FIGURES, health, series_svg

    h = health()
    body = [f"<p class='muted'>From {html.escape(h.source)}.</p>"]
    if h.error:
        body.append(f"<p class='WARN source-error'>{html.escape(h.error)}: the figures are current values only, "
                    "and no alerts are evaluated (<code>make run</code> starts Prometheus).</p>")
    rows = [[_td(a["name"], "FAIL"), _td(a["pipeline"]), _td(a["severity"]), _td(a["summary"]), _td_time(a["since"])]
            for a in h.alerts]
    body.append("<section class='alerts'><h2>Alerts firing</h2>"
                + _table(["alert", "pipeline", "severity", "summary", "since"], rows, "No alert is firing.")
                + "</section>")
    for name, p in sorted(h.pipelines.items()):
        plots = "".join(f"<div class='trend-box' data-figure='{f}'>{series_svg(p.series.get(f, []), title)}</div>"
                        for f, (title, _query) in FIGURES.items())
        body.append(f"<section class='pipeline' data-pipeline='{html.escape(name)}'><h2>{html.escape(name)}</h2>"
                    f"<div class='trends'>{plots}</div></section>")
    if not h.pipelines:
        body.append("<p class='muted'>No pipeline has reported a figure yet.</p>")
    return _page("Health", "".join(body))


class StreamLakePlugin(AirflowPlugin):
    name = "streamlake"
    fastapi_apps = [{"app": app, "url_prefix": "/streamlake", "name": "StreamLake"}]
    external_views = [
        {"name": "Pipelines", "href": "/streamlake/pipelines", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-pipelines"},
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
        {"name": "Health", "href": "/streamlake/health", "destination": "nav", "category": "StreamLake",
         "url_route": "streamlake-health"},
    ]
