"""GX Data Docs in a fixed folder, and the Great Expectations context that feeds them.

Layout under ``$STREAMLAKE_HOME/quality/``:

``validations/``
    GX's validation results store (``TupleFilesystemStoreBackend``): one JSON
    file per validation, ``<suite>/<run name>/<run time>/<batch>.json``; each
    suite's newest :func:`kept_per_suite` only (:func:`prune_validations`).
``data_docs/``
    the Data Docs site (``index.html``, ``expectations/<suite>.html``,
    ``validations/<suite>/<run name>/<run time>/<batch>.html``, ``static/``),
    rebuilt after each validation; the Airflow plugin serves it under
    ``/streamlake/quality/docs/`` behind the login.

The context is an *ephemeral* one whose only persistent store is the validation
results store: suites are code (:mod:`streamlake.quality.suites`) and are
registered anew in each context, so no ``great_expectations.yml`` is written
and tasks running at the same time cannot corrupt a shared configuration.
Builds are serialized across processes with a file lock. GX Cloud and GX's
usage statistics are off.

GX lists the whole results store several times per build, so the store is
bounded: a build first removes every suite's results but its newest
``STREAMLAKE_QUALITY_DOCS_PER_SUITE`` (default 100), and GX's index builder then
removes their pages. Unbounded, a build took 0.25 s with one stored result,
1.05 s with 4,000 and 2.26 s with 10,000 (2 cores), and `make run` stores
thousands a day (a validation per table every 5 minutes per pipeline). The
``quality_results`` table (:mod:`streamlake.quality.results`) keeps every
validation's outcomes; only the GX JSON and its page go.

Data Docs pages load their styles and scripts from public CDNs; without
internet access they render unstyled but complete (the validation pages are
static HTML), except the index's list of validation runs, which GX draws with
JavaScript. The plugin's Data quality view links each result's page directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import defaultdict
from pathlib import Path

from streamlake import config

SITE = "streamlake"
DATASOURCE = "streamlake"
DEFAULT_KEPT_PER_SUITE = 100


def quality_dir() -> Path:
    path = config.home() / "quality"
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_docs_dir() -> Path:
    """The fixed folder Data Docs are built into."""
    return quality_dir() / "data_docs"


def validations_dir() -> Path:
    return quality_dir() / "validations"


def site_config() -> dict:
    return {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(data_docs_dir())},
    }


def gx_context(definitions=()):
    """An ephemeral GX context: in-memory suites, file-backed validation results, the
    Data Docs site, a Spark data source; with the suites of every table of every known
    pipeline registered (:func:`known_definitions`, ``definitions`` in place of those of the
    same name). Every suite must be registered: GX's index builder deletes the pages of
    suites its context does not hold, so a context with one pipeline's suites would remove
    every other pipeline's suite pages whenever it rebuilt the docs."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    cfg = DataContextConfig(store_backend_defaults=InMemoryStoreBackendDefaults(), analytics_enabled=False,
                            progress_bars=ProgressBarsConfig(globally=False))
    cfg.stores[cfg.validation_results_store_name]["store_backend"] = {
        "class_name": "TupleFilesystemStoreBackend", "base_directory": str(validations_dir())}
    context = gx.get_context(mode="ephemeral", project_config=cfg)
    context.add_data_docs_site(SITE, site_config())
    from streamlake.quality.suites import build_suite, pipeline_suites

    replace_suite(context, build_suite("bronze"))  # jobs without a definition
    for definition in {**known_definitions(), **{d.name: d for d in definitions}}.values():
        for table in pipeline_suites(definition):
            replace_suite(context, build_suite(table, definition))
    return context


def known_definitions() -> dict:
    """Every pipeline's definition by name: the pipelines directory's, and the applied
    definition of every job (a job whose root is gone or unreadable is skipped)."""
    from streamlake.operations.jobs import definition_files, jobs_dir, load_job
    from streamlake.pipeline.definition import load_definition

    found = {}
    for name in sorted(p.stem for p in jobs_dir().glob("*.json")):
        with contextlib.suppress(Exception):
            definition = load_job(name).definition
            if definition is not None:
                found[definition.name] = definition
    for path in definition_files().values():
        with contextlib.suppress(Exception):
            definition = load_definition(path)
            found.setdefault(definition.name, definition)
    return found


def batch_definition(context, table: str):
    """The whole-DataFrame batch definition of ``table``'s asset in the context's Spark
    data source (created on first use; the DataFrame is passed at run time)."""
    try:
        source = context.data_sources.get(DATASOURCE)
    except (KeyError, LookupError, ValueError):
        source = context.data_sources.add_spark(DATASOURCE)
    try:
        asset = source.get_asset(table)
    except LookupError:
        asset = source.add_dataframe_asset(table)
    try:
        return asset.get_batch_definition("rows")
    except (KeyError, LookupError):
        return asset.add_batch_definition_whole_dataframe("rows")


def replace_suite(context, suite):
    """Register ``suite`` in ``context`` in place of the one of the same name."""
    with contextlib.suppress(Exception):
        context.suites.delete(suite.name)
    return context.suites.add(suite)


@contextlib.contextmanager
def _build_lock():
    lock = quality_dir() / ".data_docs.lock"
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def kept_per_suite() -> int:
    """How many validation results (and pages) of each suite the Data Docs keep:
    ``STREAMLAKE_QUALITY_DOCS_PER_SUITE``, default 100. Raises ValueError unless it is a
    whole number of at least 1."""
    raw = os.environ.get("STREAMLAKE_QUALITY_DOCS_PER_SUITE", str(DEFAULT_KEPT_PER_SUITE))
    try:
        kept = int(raw)
    except ValueError:
        kept = 0
    if kept < 1:
        raise ValueError(f"STREAMLAKE_QUALITY_DOCS_PER_SUITE must be a whole number >= 1, not {raw!r}")
    return kept


def prune_validations(context, keep_per_suite: int) -> int:
    """Remove every suite's stored validation results but its ``keep_per_suite`` newest (by
    run time) from the context's results store; the next build removes their pages.
    Returns how many were removed. The quality results table is not touched."""
    by_suite = defaultdict(list)
    store, root = context.validation_results_store, validations_dir()
    for key in store.list_keys():
        by_suite[key.expectation_suite_identifier.name].append(key)
    removed = 0
    for keys in by_suite.values():
        keys.sort(key=lambda k: k.run_id.run_time, reverse=True)
        for key in keys[keep_per_suite:]:
            if store.remove_key(key):
                removed += 1
                # <suite parts>/<run name>/<run time>/<batch>.json
                _remove_empty_dirs(root.joinpath(*key.to_tuple()[:-1]), root)
    return removed


def _remove_empty_dirs(directory: Path, root: Path) -> None:
    """Remove ``directory`` and its parents below ``root`` while they are empty (GX's own
    clean-up after a removal removes none: it tests a generator's truth), so listing the
    store stays bounded too."""
    while root in directory.parents:
        try:
            directory.rmdir()
        except OSError:  # not empty, or already gone
            return
        directory = directory.parent


def build(context, validation_ids=None) -> Path:
    """Prune the stored validation results to each suite's newest :func:`kept_per_suite`,
    then render the given validation results (all stored ones if None) and every registered
    suite into the Data Docs folder, then the index (which drops the pruned pages).
    Returns the index page."""
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
    )

    keep = kept_per_suite()
    resources = None
    if validation_ids is not None:
        resources = list(validation_ids) + [ExpectationSuiteIdentifier(name=s.name) for s in context.suites.all()]
    with _build_lock():
        prune_validations(context, keep)
        context.build_data_docs(site_names=[SITE], resource_identifiers=resources)
    return data_docs_dir() / "index.html"


def rebuild_all() -> Path:
    """Rebuild the whole site from the stored validation results (e.g. after deleting it)."""
    return build(gx_context(), None)


def page_for(context, resource_identifier) -> str | None:
    """A resource's Data Docs page, relative to the Data Docs folder (POSIX separators)."""
    urls = context.get_docs_sites_urls(resource_identifier=resource_identifier, site_name=SITE,
                                       only_if_exists=False)
    if not urls or not urls[0].get("site_url"):
        return None
    url = urls[0]["site_url"]
    from urllib.parse import unquote

    local = Path(unquote(url[len("file://"):]) if url.startswith("file://") else url)
    try:
        return local.resolve().relative_to(data_docs_dir().resolve()).as_posix()
    except ValueError:
        return None


def suite_page(suite: str) -> str:
    """A suite's Data Docs page, relative to the Data Docs folder (GX splits names at dots)."""
    return "expectations/" + "/".join(suite.split(".")) + ".html"


def resolve_page(relative: str) -> Path | None:
    """The file under the Data Docs folder that ``relative`` names, or None if it does not
    exist or lies outside the folder (``..``, absolute paths, symlinks out)."""
    root = data_docs_dir().resolve()
    if not relative or relative.endswith("/"):
        relative = (relative or "") + "index.html"
    if "\x00" in relative or relative.startswith(("/", "\\")) or ".." in Path(relative).parts:
        return None
    candidate = (root / relative).resolve()
    try:
        candidate.relative_to(root)
    except ValueError:
        return None
    return candidate if candidate.is_file() else None
