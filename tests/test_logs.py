"""The jobs' and CLI's logging: StreamLake at the level asked, chatty libraries at WARNING."""

import logging

from streamlake import logs


def test_libraries_that_log_internals_at_info_are_held_at_warning():
    names = ["", *logs.QUIET_LIBRARIES]
    before = {name: logging.getLogger(name).level for name in names}
    try:
        _check_levels()
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def _check_levels():
    logs.configure(logging.INFO)
    assert logging.getLogger("streamlake.operations.verify").getEffectiveLevel() == logging.INFO
    # Great Expectations logs ~200 "Skipping registering function" lines per validation run.
    for name in ("great_expectations._docs_decorators", "great_expectations.expectations.registry", "py4j.java_gateway"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    logs.configure(logging.ERROR)  # quieter than WARNING stays quieter
    assert not logging.getLogger("great_expectations").isEnabledFor(logging.WARNING)
