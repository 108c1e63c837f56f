"""Files and folders at a lake URI (local path or object store), through pyarrow's
filesystems with the URI's storage options (:func:`streamlake.storage.location.storage_options`).

What the platform keeps beside its tables (savepoints) reads and writes through
these, so the same code serves a local directory and a bucket. An object store has
no rename: a folder written here is complete once the file its reader looks for
first (a savepoint's ``manifest.json``) is there, so write that one last.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamlake.storage.location import arrow_filesystem, storage_options


def _fs(uri: str | os.PathLike):
    return arrow_filesystem(storage_options(uri))


def exists(uri: str | os.PathLike) -> bool:
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_text(uri: str | os.PathLike) -> str:
    """The file's text. Raises FileNotFoundError when it does not exist."""
    fs, path = _fs(uri)
    try:
        with fs.open_input_stream(path) as fh:
            return fh.read().decode()
    except (FileNotFoundError, OSError) as exc:
        if not exists(uri):
            raise FileNotFoundError(f"{uri} does not exist") from exc
        raise


def write_text(uri: str | os.PathLike, text: str) -> None:
    """Write the file whole (one PUT on an object store: readers see all of it or nothing)."""
    fs, path = _fs(uri)
    if not os.fspath(uri).count("://"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with fs.open_output_stream(path) as fh:
        fh.write(text.encode())


def upload_dir(local: str | os.PathLike, uri: str | os.PathLike) -> int:
    """Copy the local folder's files under ``uri``; returns how many."""
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    local_fs = pafs.LocalFileSystem()
    files = [f for f in local_fs.get_file_info(pafs.FileSelector(str(local), recursive=True))
             if f.type == pafs.FileType.File]
    for info in files:
        relative = os.path.relpath(info.path, local)
        target = f"{path}/{relative}"
        if isinstance(fs, pafs.LocalFileSystem):
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(info.path, target, source_filesystem=local_fs, destination_filesystem=fs)
    return len(files)


def download_dir(uri: str | os.PathLike, local: str | os.PathLike) -> int:
    """Copy the files under ``uri`` into the local folder (created); returns how many."""
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    Path(local).mkdir(parents=True, exist_ok=True)
    files = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
             if f.type == pafs.FileType.File]
    for info in files:
        target = Path(local) / os.path.relpath(info.path, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(info.path, str(target), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return len(files)


def delete_file(uri: str | os.PathLike) -> None:
    """Delete the file (nothing if it does not exist)."""
    fs, path = _fs(uri)
    if exists(uri):
        fs.delete_file(path)


def delete_dir(uri: str | os.PathLike) -> None:
    """Delete the folder and everything under it (nothing if it does not exist)."""
    fs, path = _fs(uri)
    if exists(uri):
        fs.delete_dir(path)
