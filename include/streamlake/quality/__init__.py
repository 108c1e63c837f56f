"""Data quality: Great Expectations suites per table, run after every operation.

``suites``    the expectation suites, as code, with each expectation's severity
``validate``  run a suite on the rows an operation touched; pass/fail by severity
``results``   the ``quality_results`` platform table and the queries the UI and CLI use
``docs``      GX Data Docs, rebuilt into ``$STREAMLAKE_HOME/quality/data_docs``
``plots``     trend plots as inline SVG
``gx_spark``  GX's Spark metrics without the queries whose answer is not used

The usual entry points are :func:`streamlake.quality.validate.validate_operation`
(DAG tasks) and :func:`streamlake.quality.validate.validate_table` (CLI).
"""
