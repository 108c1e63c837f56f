#!/usr/bin/env bash
# Jar sets from Maven Central, pinned and checked (run by `make setup`; `make lock-jars`).
#
# A jar set is one pom, jars/<set>.pom.xml (pinned versions of the artifacts it needs), and
# one lock, jars/<set>.sha256 (`sha256sum` lines: every jar of the set, its dependencies
# included). Python finds a set through streamlake.jars.jar_dir("<set>").
#
#   scripts/jars.sh fetch [SET...]  copy each set's runtime jars into .venv/jars/<set>/ with
#                                   mvn (--strict-checksums: Maven checks the repository's
#                                   checksums), check them against the lock, then install the
#                                   folder whole (a temporary folder renamed): a failed fetch
#                                   or a mismatch installs nothing. A stamp makes a re-run a
#                                   no-op until the pom or the lock changes. Default: every set.
#   scripts/jars.sh lock [SET...]   resolve each set anew and rewrite its lock (after a pom
#                                   changed); `make setup` then installs it.
#
# mvn runs with jars/maven-settings.xml as its global settings: every repository is Maven
# Central (https://repo.maven.apache.org/maven2). Jars are cached in ~/.m2 as for any mvn.
set -euo pipefail
cd "$(dirname "$0")/.."

SRC=jars
DEST=.venv/jars
STAMP=.lock.sha256   # in each installed set: sha256 of its pom and lock when installed

die() { echo "jars: $*" >&2; exit 1; }

sets() {
  if [ $# -gt 0 ]; then
    local s
    for s in "$@"; do
      [ -f "$SRC/$s.pom.xml" ] || die "no jar set '$s' (no $SRC/$s.pom.xml)"
      echo "$s"
    done
  else
    local pom
    for pom in "$SRC"/*.pom.xml; do
      [ -e "$pom" ] || continue
      basename "$pom" .pom.xml
    done
  fi
}

# What a set's installed copy must have been made from (the stamp's content).
want() { cat "$SRC/$1.pom.xml" "$SRC/$1.sha256" 2>/dev/null | sha256sum | cut -d' ' -f1; }

need_tools() {
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null 2>&1 \
    || die "Java not found (mvn and the Kafka broker need Java 17+): apt-get install openjdk-17-jdk-headless, or set JAVA_HOME"
  command -v mvn >/dev/null 2>&1 \
    || die "Apache Maven (mvn) not found; it fetches the pinned jars from Maven Central.
  Debian/Ubuntu: sudo apt-get install -y maven    macOS: brew install maven"
}

# copy SET DIR: the set's runtime jars into DIR (created), from Maven Central.
copy() {
  local set="$1" dir="$2" log="$2.mvn.log"
  mkdir -p "$dir"
  if ! mvn -B -q -Dstyle.color=never --strict-checksums -gs "$SRC/maven-settings.xml" -f "$SRC/$set.pom.xml" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$(realpath "$dir")" \
      >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

fetch() {
  local set="$1" lock="$SRC/$1.sha256" target="$DEST/$1"
  [ -f "$lock" ] || die "jar set '$set' has no lock $lock: run \`make lock-jars SET=$set\` and commit it"
  if [ -f "$target/$STAMP" ] && [ "$(cat "$target/$STAMP")" = "$(want "$set")" ]; then
    echo "jars: $set is installed ($target, $(wc -l <"$lock") jars)."
    return 0
  fi
  need_tools
  mkdir -p "$DEST"
  local tmp
  tmp="$(mktemp -d "$DEST/.$set.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp' '$tmp.mvn.log'" EXIT
  echo "jars: fetching jar set '$set' ($SRC/$set.pom.xml and its dependencies) from Maven Central..."
  copy "$set" "$tmp" || die "fetching jar set '$set' from Maven Central failed (mvn's output above); nothing installed"
  local bad="" lock_abs
  lock_abs="$(realpath "$lock")"
  if ! bad="$(cd "$tmp" && sha256sum --check --strict --quiet "$lock_abs" 2>&1)"; then
    die "jar set '$set' does not match its lock $lock; nothing installed:
$bad
If you changed $SRC/$set.pom.xml, regenerate the lock (make lock-jars SET=$set) and commit it;
otherwise what Maven Central served differs from the jars the lock names."
  fi
  local extra
  extra="$(comm -23 <(cd "$tmp" && ls | sort) <(awk '{sub(/^\*/, "", $2); print $2}' "$lock" | sort))"
  [ -z "$extra" ] || die "jar set '$set' resolved to jars its lock $lock does not name; nothing installed:
$extra
If you changed $SRC/$set.pom.xml, regenerate the lock (make lock-jars SET=$set) and commit it."
  want "$set" >"$tmp/$STAMP"
  chmod 755 "$tmp"  # mktemp made it private
  rm -rf "$target"
  mv "$tmp" "$target"
  trap - EXIT
  echo "jars: $set installed ($target: $(ls "$target" | wc -l) jars, $(du -sh "$target" | cut -f1), sha256 checked)."
}

lock() {
  local set="$1" lock="$SRC/$1.sha256"
  need_tools
  mkdir -p "$DEST"
  local tmp
  tmp="$(mktemp -d "$DEST/.$set.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp' '$tmp.mvn.log'" EXIT
  copy "$set" "$tmp" || die "resolving jar set '$set' failed (mvn's output above); $lock unchanged"
  (cd "$tmp" && LC_ALL=C sha256sum -- $(LC_ALL=C ls)) >"$lock"
  rm -rf "$tmp"
  trap - EXIT
  echo "jars: wrote $lock ($(wc -l <"$lock") jars); \`make setup\` installs them."
}

action="${1:-}"
shift || true
case "$action" in
  fetch) names="$(sets "$@")"; for s in $names; do fetch "$s"; done ;;
  lock)  names="$(sets "$@")"; for s in $names; do lock "$s"; done ;;
  *) die "usage: scripts/jars.sh fetch|lock [SET...]" ;;
esac
