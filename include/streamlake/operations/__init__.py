"""Operating named jobs: their specs (``jobs``), control at micro-batch boundaries
(``control``), savepoints and restores (``savepoints``), restart strategies
(``supervisor``), launching with spark-submit (``runner``), the offset audit
(``audit``), consistency checks (``consistency``) and the platform's own record
tables (``records``)."""
