"""Jar sets fetched from Maven Central by ``make setup`` (``scripts/jars.sh``).

A jar set is a pom, ``jars/<set>.pom.xml`` (pinned artifacts), and a lock,
``jars/<set>.sha256`` (every jar of the set with its sha256). ``make setup``
copies the set's runtime jars into ``.venv/jars/<set>/``, checks them against
the lock and stamps the folder with a hash of the pom and the lock it was made
from; :func:`jar_dir` is the one way the platform finds a set, and refuses one
that is missing or was made from another pom or lock.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from streamlake import config

STAMP = ".lock.sha256"

# The platform's sets.
KAFKA = "kafka"  # the Apache Kafka broker (streamlake.platform.broker)
SPARK = "spark"  # on every Spark JVM's class path: Delta's connector, Spark's Kafka source, s3a


class JarsNotInstalled(FileNotFoundError):
    """A jar set is missing from ``.venv/jars`` or out of date: ``make setup`` fetches it."""


def source_dir() -> Path:
    """The committed poms and locks."""
    return config.project_root() / "jars"


def installed_dir() -> Path:
    """Where ``make setup`` installs the sets (one folder each)."""
    return config.project_root() / ".venv" / "jars"


def _wanted_stamp(name: str) -> str:
    digest = hashlib.sha256()
    for suffix in (".pom.xml", ".sha256"):
        digest.update((source_dir() / f"{name}{suffix}").read_bytes())
    return digest.hexdigest()


def jar_dir(name: str) -> Path:
    """The folder holding jar set ``name``'s jars, checked against its lock by ``make setup``.

    Raises ValueError for a set that has no pom in ``jars/``, and
    :class:`JarsNotInstalled` when the set is not installed, or was installed from
    another version of its pom or lock (run ``make setup``)."""
    if not (source_dir() / f"{name}.pom.xml").exists():
        known = sorted(p.name.removesuffix(".pom.xml") for p in source_dir().glob("*.pom.xml"))
        raise ValueError(f"no jar set {name!r} (jars/{name}.pom.xml); known: {', '.join(known) or 'none'}")
    target = installed_dir() / name
    stamp = target / STAMP
    if not stamp.exists():
        raise JarsNotInstalled(f"the {name} jars are not installed ({target} is missing): run `make setup`, "
                               f"which fetches them from Maven Central")
    try:
        wanted = _wanted_stamp(name)
    except OSError as exc:
        raise JarsNotInstalled(f"jar set {name!r} has no lock ({exc.filename}): run `make lock-jars SET={name}`") \
            from None
    if stamp.read_text().strip() != wanted:
        raise JarsNotInstalled(f"the {name} jars in {target} were installed from another jars/{name}.pom.xml or "
                               f"jars/{name}.sha256: run `make setup`")
    return target


def classpath(name: str) -> str:
    """A Java class path of every jar of set ``name`` (a ``dir/*`` wildcard)."""
    return str(jar_dir(name) / "*")
