"""Operating named jobs: their specs (``jobs``), savepoints and restores (``savepoints``),
restart strategies (``supervisor``), launching with spark-submit (``runner``), the offset
audit (``audit``) and consistency checks (``consistency``). A job's control files are
:mod:`streamlake.pipeline.control`, the platform's own record tables
:mod:`streamlake.delta.records`: the pipeline's driver uses both."""
