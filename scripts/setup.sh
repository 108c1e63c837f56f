#!/usr/bin/env bash
# Idempotent environment setup: .venv with every pinned dependency, the
# streamlake package (editable), a Java >= 17 check, and the pinned jar sets
# from Maven Central (.venv/jars/: the Kafka broker, Delta's Spark connector, Spark's Kafka source, s3a; scripts/jars.sh). Re-running
# it is a no-op unless requirements.txt, constraints.txt, pyproject.toml or a
# jar set (jars/) changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.streamlake-installed"

die() { echo "setup: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found. Install Python 3.10-3.13 (e.g. apt-get install python3 python3-venv)."
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
  || die "Python 3.10-3.13 is required (Airflow 3.3); $PYTHON is $("$PYTHON" -V 2>&1). Set PYTHON=python3.X."

java_major() {
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null 2>&1 || { echo 0; return; }
  "$java" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
major="$(java_major)"
if [ "${major:-0}" -lt 17 ]; then
  die "Java 17 or newer is required by Spark 4 (found: ${major:-none}).
  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless
  macOS:         brew install openjdk@17
  or point JAVA_HOME at an existing JDK 17+."
fi

# Headless Chromium for the browser test (tests/test_ui_browser.py drives it with Playwright's
# executable_path: Playwright downloads no browser). Debian's package; skipped when present.
chromium_bin() {
  local c
  for c in /usr/lib/chromium/chromium /usr/bin/chromium; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
if ! chromium_bin >/dev/null; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "setup: installing Debian's chromium (headless browser for the UI tests)"
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }; then
      echo "setup: WARNING: could not install chromium; the UI browser test will fail until it is installed:
  sudo apt-get update && sudo apt-get install -y chromium" >&2
    fi
  else
    echo "setup: WARNING: Chromium not found and apt-get is not available; tests/test_ui_browser.py needs
  Chromium at /usr/lib/chromium/chromium or /usr/bin/chromium (Debian/Ubuntu: apt-get install chromium)." >&2
  fi
fi
if chromium_bin >/dev/null; then echo "setup: chromium at $(chromium_bin)."; fi

# Prometheus and promtool (monitoring/: make run's Prometheus on 127.0.0.1:9090, the rules' test):
# Debian's `prometheus` package, pinned, unpacked into .venv/prometheus (apt-get download +
# dpkg-deb -x: no root, no system service, no user). Its binaries need only libc.
PROMETHEUS_DEB_VERSION=2.42.0+ds-5+deb12u1
PROM_DIR="$VENV/prometheus"
if [ "$(cat "$PROM_DIR/.version" 2>/dev/null)" != "$PROMETHEUS_DEB_VERSION" ] || [ ! -x "$PROM_DIR/usr/bin/promtool" ]; then
  if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    echo "setup: fetching Debian's prometheus $PROMETHEUS_DEB_VERSION into $PROM_DIR"
    mkdir -p "$VENV"
    deb_dir="$(mktemp -d)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    if ( cd "$deb_dir" && { apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION" 2>/dev/null \
           || { $SUDO apt-get update -qq && apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION"; }; } ) \
       && rm -rf "$PROM_DIR" && dpkg-deb -x "$deb_dir"/prometheus_*.deb "$PROM_DIR"; then
      echo "$PROMETHEUS_DEB_VERSION" > "$PROM_DIR/.version"
    else
      echo "setup: WARNING: could not fetch Debian's prometheus $PROMETHEUS_DEB_VERSION; make run starts no Prometheus
  and tests/test_metrics_rules.py skips until it is there (apt-get download prometheus=$PROMETHEUS_DEB_VERSION)" >&2
    fi
    rm -rf "$deb_dir"
  else
    echo "setup: WARNING: apt-get/dpkg-deb not available: no Prometheus (make run starts none; the rules' test skips)" >&2
  fi
fi
if [ -x "$PROM_DIR/usr/bin/promtool" ]; then echo "setup: prometheus $(cat "$PROM_DIR/.version") in $PROM_DIR."; fi

# The local S3 API server (moto) in a venv of its own: its botocore and the platform's lock
# disagree on python-dateutil. Tests and the optional object-store mode start it.
# It installs beside the jar sets and .venv (below): each writes only its own files.
S3_VENV=.venv-s3
s3_want="$(sha256sum requirements-s3.txt | cut -d' ' -f1)"
install_s3_server() {
  if [ ! -f "$S3_VENV/.installed" ] || [ "$(cat "$S3_VENV/.installed")" != "$s3_want" ] || [ ! -x "$S3_VENV/bin/moto_server" ]; then
    echo "setup: installing the local S3 server (moto) into $S3_VENV"
    [ -x "$S3_VENV/bin/python" ] || "$PYTHON" -m venv "$S3_VENV"
    "$S3_VENV/bin/python" -m pip install --quiet -r requirements-s3.txt
    echo "$s3_want" > "$S3_VENV/.installed"
  fi
}
install_s3_server & s3_job=$!

# Jar sets (jars/<set>.pom.xml, locked by jars/<set>.sha256) from Maven Central into
# .venv/jars/<set>/, checked, once: the Apache Kafka broker (streamlake.platform.broker), and
# what every Spark JVM has on its class path: Delta's Spark connector, Spark's Kafka source
# and Hadoop's s3a (streamlake.spark.session.spark_class_path).
# Needs mvn; scripts/jars.sh says how it works, `make lock-jars` re-locks a changed pom.
# Fetched while .venv installs; the class archive (last) needs both.
bash scripts/jars.sh fetch & jars_job=$!
# a set-up that stops early stops what runs beside it
trap 'kill $s3_job $jars_job 2>/dev/null || true' EXIT
beside_done() {
  wait "$s3_job" || die "installing the local S3 server (moto) into $S3_VENV failed (pip's error above)"
  wait "$jars_job" || exit 1  # scripts/jars.sh said why
  trap - EXIT
}

want="$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/streamlake" ]; then
  echo "setup: .venv is up to date (Java $major)."
  beside_done
  # The Spark JVMs' class archive (streamlake.spark.class_archive): built once, about 40 s.
  "$VENV/bin/python" -m streamlake.spark.class_archive
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "setup: installing pinned dependencies into $VENV (first run takes a few minutes: pyspark is a 450 MB download)"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r requirements.txt -c constraints.txt
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" - <<'PY'
import confluent_kafka, deltalake, pyspark, airflow
print(f"setup: pyspark {pyspark.__version__}, deltalake {deltalake.__version__}, "
      f"confluent-kafka {confluent_kafka.version()}, airflow {airflow.__version__}")
PY
echo "$want" > "$STAMP"
beside_done
"$VENV/bin/python" -m streamlake.spark.class_archive --rebuild
echo "setup: done (Java $major)."
