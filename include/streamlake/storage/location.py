"""Lake URIs, their storage options, and what delta-rs and pyarrow need to reach them.

A table is a plain path, a ``file://`` URI, or an object-store URI (so far bronze
tables: ``streamlake ingest``, ``audit``, ``vacuum`` and the ``streamlake-delta``
source take them; and a pipeline's root: ``pipeline run`` writes bronze, silver,
quarantine, gold and late events there, its checkpoints and control files to
:func:`state_dir`; ``check``, ``backfill`` and ``quality run`` read and write it): ``s3://bucket/prefix`` (also ``s3a://``; MinIO
and other S3-compatible stores through an endpoint), ``gs://bucket/prefix``
or ``abfss://container@account.dfs.core.windows.net/prefix``.

Storage options come from the usual places, later ones winning:

1. the environment variables of the store's family (``AWS_*`` for S3,
   ``GOOGLE_*`` for GCS, ``AZURE_*`` for Azure), the way every AWS/GCP/Azure
   tool reads them;
2. the options a job recorded for its root (:func:`remember_options`);
3. ``--storage-option KEY=VALUE`` (repeatable).

Keys are delta-rs's (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``,
``conditional_put``, ...). Secret values (keys naming a secret, token,
password or access key) never go on a command line or into a log:
:meth:`StorageOptions.public` drops them, :func:`redact` blanks them in text,
and child processes get them through their environment
(:meth:`StorageOptions.secret_environment`). Spark executors read them from
theirs, which is all a worker machine needs besides the package.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping
from urllib.parse import unquote, urlsplit

from streamlake.errors import StorageOptionError, UnsafeStoreError

log = logging.getLogger(__name__)

# URI scheme -> store family (its environment prefix and commit rules).
STORE_FAMILIES = {"s3": "aws", "s3a": "aws", "gs": "google", "gcs": "google",
                  "abfss": "azure", "abfs": "azure", "az": "azure", "azure": "azure"}
ENV_PREFIXES = {"aws": "AWS_", "google": "GOOGLE_", "azure": "AZURE_"}
# A key naming one of these holds a secret.
SECRET_MARKERS = ("SECRET", "TOKEN", "PASSWORD", "ACCESS_KEY", "ACCOUNT_KEY", "SAS", "CREDENTIAL", "PRIVATE")
REDACTED = "***"


def scheme(uri: str | os.PathLike) -> str:
    """The URI's scheme, lower case; ``file`` for a plain path."""
    raw = os.fspath(uri)
    if "://" not in raw:
        return "file"
    return raw.split("://", 1)[0].lower()


def store_family(uri: str | os.PathLike) -> str | None:
    """``aws``, ``google`` or ``azure`` for an object-store URI; None for the local filesystem.

    Raises StorageOptionError for a scheme the platform does not know."""
    s = scheme(uri)
    if s == "file":
        return None
    if s not in STORE_FAMILIES:
        raise StorageOptionError(
            f"unsupported lake URI scheme {s!r} in {uri!s}: use a path, file://, s3://, gs:// or abfss://")
    return STORE_FAMILIES[s]


def is_object_store(uri: str | os.PathLike) -> bool:
    return store_family(uri) is not None


def normalize(uri: str | os.PathLike) -> str:
    """A local root as an absolute path; an object-store URI as given, without a trailing slash."""
    raw = os.fspath(uri)
    if scheme(raw) == "file":
        if raw.startswith("file://"):
            raw = unquote(raw[len("file://"):])
        return os.path.abspath(raw)
    store_family(raw)  # raises for an unknown scheme
    return raw.rstrip("/")


def join(root: str | os.PathLike, *parts: str) -> str:
    """``root`` and relative ``parts`` joined the way its store spells paths."""
    raw = normalize(root)
    if not is_object_store(raw):
        return os.path.join(raw, *parts)
    return "/".join([raw, *(p.strip("/") for p in parts if p)])


def state_dir(root: str | os.PathLike) -> str:
    """Where the driver keeps a root's Spark checkpoints and control files (``_checkpoints/``,
    ``_control/``): the root itself on the local filesystem; for an object-store root a
    directory on the driver's own disk, ``$STREAMLAKE_HOME/lakes/<scheme>/<bucket>/<prefix>``.
    Spark's checkpoints cannot go to an object store here (the s3a connector's jars cannot be
    installed), and need not: every table's commits carry the positions it consumed, so a
    driver that lost this directory resumes from the tables alone."""
    raw = normalize(root)
    if not is_object_store(raw):
        return raw
    from streamlake import config

    store, rest = raw.split("://", 1)
    return os.path.join(str(config.home()), "lakes", store.lower(), *[p for p in rest.split("/") if p])


def is_secret(key: str) -> bool:
    """True for a key whose value must never be printed (secret keys, tokens, passwords)."""
    upper = key.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings -> dict. Raises StorageOptionError for one without ``=``
    (the message never repeats the value: it may be a secret)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise StorageOptionError(f"--storage-option wants KEY=VALUE, got one starting {pair[:12]!r}..."
                                     if len(pair) > 12 else f"--storage-option wants KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


@dataclass(frozen=True)
class StorageOptions(Mapping[str, str]):
    """The storage options of one lake URI. Printing one shows secrets as ``***``."""

    uri: str
    values: Mapping[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"StorageOptions({self.uri!r}, {self.redacted()!r})"

    __str__ = __repr__

    def get_any(self, *keys: str) -> str | None:
        """The value of the first of ``keys`` present, matched without regard to case."""
        lower = {k.lower(): v for k, v in self.values.items()}
        for key in keys:
            if key.lower() in lower and lower[key.lower()] != "":
                return lower[key.lower()]
        return None

    def redacted(self) -> dict[str, str]:
        return {k: REDACTED if is_secret(k) else v for k, v in self.values.items()}

    def public(self) -> dict[str, str]:
        """The options without secrets: what may travel in a command line or a task."""
        return {k: v for k, v in self.values.items() if not is_secret(k)}

    def secret_environment(self) -> dict[str, str]:
        """The secrets as environment variables for a child process (key upper-cased)."""
        return {k.upper(): v for k, v in self.values.items() if is_secret(k)}

    def for_delta(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs (None on the local filesystem)."""
        return dict(self.values) if self.values else None

    def for_hadoop(self) -> dict[str, str]:
        """The same options as Hadoop's s3a settings for this URI's bucket
        (``fs.s3a.bucket.<bucket>.*``: endpoint, path-style access and TLS for an endpoint,
        region, and the keys when given; without keys s3a's default chain applies: the
        environment, a profile, an instance role). Empty for a store that is not S3. They hold
        secrets: set them on a session (``spark.conf.set``), never on a command line."""
        if store_family(self.uri) != "aws":
            return {}
        prefix = f"fs.s3a.bucket.{urlsplit(self.uri).netloc}."
        out: dict[str, str] = {}
        endpoint = self.get_any("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "endpoint_url", "endpoint")
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            out.update({"endpoint": f"{ep.scheme}://{ep.netloc}", "path.style.access": "true",
                        "connection.ssl.enabled": str(ep.scheme == "https").lower()})
        region = self.get_any("AWS_REGION", "region", "AWS_DEFAULT_REGION")
        if region:
            out["endpoint.region"] = region
        key_id = self.get_any("AWS_ACCESS_KEY_ID", "access_key_id")
        if key_id:
            out.update({"access.key": key_id,
                        "secret.key": self.get_any("AWS_SECRET_ACCESS_KEY", "secret_access_key") or ""})
            token = self.get_any("AWS_SESSION_TOKEN", "session_token")
            out["aws.credentials.provider"] = ("org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider" if token
                                               else "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
            if token:
                out["session.token"] = token
        return {prefix + k: v for k, v in out.items()}


# Options of object-store roots this process was told about (remember_options), by root.
_REMEMBERED: dict[str, dict[str, str]] = {}


def remember_options(root: str | os.PathLike, options: Mapping[str, str]) -> None:
    """Make every later :func:`storage_options` of ``root`` or a URI under it, in this process,
    include ``options`` (after the environment's, before those given), added to what was
    remembered for it before (a key given again takes the new value). A job's recorded
    options (endpoint, region, commit mode; never secrets) so reach every table its
    checks, backfills and validations open, the way Hadoop's per-bucket settings do."""
    raw = normalize(root)
    if options and is_object_store(raw):
        _REMEMBERED[raw] = {**_REMEMBERED.get(raw, {}), **options}


def _remembered(uri: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for root in sorted(r for r in _REMEMBERED if uri == r or uri.startswith(r + "/")):
        out.update(_REMEMBERED[root])  # the longest root last: the most specific wins
    return out


def storage_options(uri: str | os.PathLike, given: Mapping[str, str] | Iterable[str] = (),
                    env: Mapping[str, str] | None = None) -> StorageOptions:
    """The storage options of ``uri``: its family's environment variables, then the options
    remembered for a root it is under (:func:`remember_options`), then ``given`` (a mapping,
    or ``KEY=VALUE`` strings). Raises StorageOptionError for options given for a local path
    (they would be silently ignored) or malformed pairs."""
    raw = normalize(uri)
    given = dict(given) if isinstance(given, Mapping) else parse_pairs(given)
    family = store_family(raw)
    if family is None:
        if given:
            raise StorageOptionError(f"storage options given for {raw}, which is on the local filesystem: "
                                     f"{sorted(given)} would have no effect")
        return StorageOptions(raw, {})
    env = os.environ if env is None else env
    prefix = ENV_PREFIXES[family]
    values = {k: v for k, v in env.items() if k.startswith(prefix) and v != ""}
    values.update(_remembered(raw))
    values.update(given)
    return StorageOptions(raw, values)


def require_safe_commits(options: StorageOptions) -> None:
    """Raise UnsafeStoreError unless two writers can never both commit one Delta version there.

    Local disks, GCS and Azure have an atomic put-if-absent, which delta-rs uses. S3 has
    no atomic rename, so one of these must be set: ``conditional_put=etag`` (S3 and
    S3-compatible stores honouring ``If-None-Match``, such as MinIO and moto),
    ``AWS_S3_LOCKING_PROVIDER=dynamodb`` (a DynamoDB lock table, named by
    ``DELTA_DYNAMO_TABLE_NAME``), or ``AWS_S3_ALLOW_UNSAFE_RENAME=true``, which declares
    the table has a single writer ever (then nothing protects it from a second one).
    """
    if store_family(options.uri) != "aws":
        return
    if (options.get_any("conditional_put", "aws_conditional_put") or "").lower() == "etag":
        return
    if (options.get_any("AWS_S3_LOCKING_PROVIDER") or "").lower() == "dynamodb":
        return
    if (options.get_any("AWS_S3_ALLOW_UNSAFE_RENAME") or "").lower() == "true":
        log.warning("%s: AWS_S3_ALLOW_UNSAFE_RENAME=true: commits are safe only while this table has one writer",
                    options.uri)
        return
    raise UnsafeStoreError(
        f"{options.uri} is on S3, which has no atomic rename: two writers could both commit the same Delta "
        "version there. Set --storage-option conditional_put=etag (S3, MinIO and stores honouring "
        "If-None-Match), or AWS_S3_LOCKING_PROVIDER=dynamodb with DELTA_DYNAMO_TABLE_NAME (a lock table); "
        "or, only if this table will only ever have one writer, AWS_S3_ALLOW_UNSAFE_RENAME=true"
    )


def arrow_filesystem(options: StorageOptions, create_buckets: bool = False):
    """``(pyarrow filesystem, path in it)`` of ``options.uri``.

    S3 gets its endpoint, region and credentials from the options (credentials left
    out fall back to the AWS default chain: environment, profile, instance role); GCS
    and Azure get pyarrow's defaults for their URIs (credentials from their usual
    environment variables)."""
    import pyarrow.fs as pafs

    uri = options.uri
    family = store_family(uri)
    if family is None:
        return pafs.LocalFileSystem(), uri
    if family != "aws":
        return pafs.FileSystem.from_uri(uri)
    parts = urlsplit(uri)
    kwargs: dict = {"allow_bucket_creation": create_buckets}
    region = options.get_any("AWS_REGION", "region", "AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    endpoint = options.get_any("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "endpoint_url", "endpoint")
    if endpoint:
        ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = ep.netloc
        kwargs["scheme"] = ep.scheme
    key_id = options.get_any("AWS_ACCESS_KEY_ID", "access_key_id")
    if key_id:
        kwargs["access_key"] = key_id
        kwargs["secret_key"] = options.get_any("AWS_SECRET_ACCESS_KEY", "secret_access_key") or ""
        token = options.get_any("AWS_SESSION_TOKEN", "session_token")
        if token:
            kwargs["session_token"] = token
    return pafs.S3FileSystem(**kwargs), f"{parts.netloc}{parts.path}".rstrip("/")


def redact(text: str, *options: Mapping[str, str]) -> str:
    """``text`` with every secret value of ``options`` replaced by ``***``."""
    for opts in options:
        for key, value in opts.items():
            if is_secret(key) and value and len(value) >= 4:
                text = text.replace(value, REDACTED)
    return text
