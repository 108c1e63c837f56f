"""Metrics for Prometheus (issue 73): ``streamlake metrics serve``.

:mod:`streamlake.monitoring.collector` computes every value on each scrape from durable
state: the Delta logs of every job's tables (versions, commit times, row counts from the
``add`` actions' statistics, the upstream positions and gold's watermark in ``txn``), the
platform's own tables (``consistency_checks``, ``quality_results``), Kafka's end offsets,
the job specs and each job's ``progress.jsonl``. Nothing is kept in memory that a restart
would lose except caches keyed by a table's version (or a file's size), so a value is the
same after a crash, and nothing runs while nobody scrapes.
:mod:`streamlake.monitoring.exporter` serves it (prometheus-client's HTTP server).

Layering: this package sits beside ``quality``/``operations`` and above; it reads through
their readers and nothing below imports it.
"""
