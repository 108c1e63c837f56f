"""Delta side of the platform: tables, committed offsets, the two-phase-commit sink, and the
platform's own record tables (``records``)."""
