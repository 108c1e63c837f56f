#!/usr/bin/env bash
# `make test`: the whole suite as two pytest sessions side by side, each with its own home,
# broker, SparkSession and Airflow database (tests/conftest.py):
#   [platform] the live platform and the UI in a browser (an Airflow standalone, a Spark
#              cluster, the demo producers: they run one after the other, never two at once);
#   [suite]    everything else, `airflow dags test` scenarios included.
# Output lines carry the session's name; each session ends with its slowest tests. Exit status:
# non-zero when either session fails. PYTEST_ARGS is passed to both (e.g. -x).
set -uo pipefail
cd "$(dirname "$0")/.."
PLATFORM_FILES=(tests/test_live_platform.py tests/test_ui_browser.py)
PYTEST=.venv/bin/pytest
ignore=()
for f in "${PLATFORM_FILES[@]}"; do ignore+=(--ignore "$f"); done

started=$(date +%s)
( $PYTEST "${PLATFORM_FILES[@]}" --durations=10 ${PYTEST_ARGS:-} 2>&1 | sed -u 's/^/[platform] /' ) &
platform_pid=$!
( $PYTEST "${ignore[@]}" --durations=25 ${PYTEST_ARGS:-} 2>&1 | sed -u 's/^/[suite]    /' ) &
suite_pid=$!
wait $suite_pid; suite=$?
wait $platform_pid; platform=$?
echo "make test: suite exit $suite, platform exit $platform, $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s"
[ "$suite" -eq 0 ] && [ "$platform" -eq 0 ]
