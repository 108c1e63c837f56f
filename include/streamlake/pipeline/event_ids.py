"""Which of silver's files may hold an event id: each data file's id hashes, read once.

Silver's de-duplication asks every micro-batch whether silver already holds one of
the batch's event ids (:meth:`streamlake.pipeline.silver.SilverStage.duplicates`).
Reading the id column of every file in the horizon costs about 60 ms per million ids
on 2 cores, so a 24-hour horizon at 200 events/s (17 million ids) would cost a second
of every micro-batch, and more each hour. Data files never change once written, so
:class:`FileIdHashes` reads a file's ids once per process and keeps their 64-bit hashes,
sorted (8 bytes an id); a micro-batch then reads only the files holding a hash of one of
its ids: the files with a duplicate, and, rarely, a file where two ids' hashes collide.
The caller reads those files and compares the ids themselves, so the answer stays exact.

Nothing here can go stale: every lookup is given the snapshot's files and consults
only those; a new file (an append, a compaction's output) is read the first time a
lookup needs it, and a file no lookup was given for a while (compacted away, restored
away, older than the horizon) is forgotten.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def hash_ids(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The 64-bit FNV-1a hash of each id's text (UTF-8), as a uint64 array in ``ids``' order.

    Ids of any type are hashed as their Arrow cast to text; a null hashes as the empty
    text does (callers that must tell a null apart check ``null_count`` first)."""
    text = pc.fill_null(ids.cast(pa.large_string()), "")
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    n = len(text)
    if n == 0:
        return np.empty(0, np.uint64)
    _, offsets_buffer, data_buffer = text.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64, n + 1, text.offset * 8)
    if data_buffer is None or not data_buffer.size:  # every id empty: nothing to index
        data = np.zeros(1, np.uint8)
    else:
        data = np.frombuffer(data_buffer, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.full(n, _FNV_OFFSET, np.uint64)
    for i in range(int(lengths.max())):  # one byte of every id per step: ids are short, files long
        live = lengths > i
        byte = data[np.where(live, starts + i, 0)].astype(np.uint64)
        hashes = np.where(live, (hashes ^ byte) * _FNV_PRIME, hashes)
    return hashes


class FileIdHashes:
    """The sorted id hashes of the data files recent lookups have met, by file path.

    A file no lookup was given for ``forget_after`` lookups is forgotten (the
    default: about a minute of one-second micro-batches), so a batch of late events,
    whose horizon reaches older files, does not make the next batches read those
    files' ids again, and files compacted away leave memory soon after."""

    def __init__(self, forget_after: int = 60) -> None:
        self.forget_after = forget_after
        self._hashes: dict[str, np.ndarray] = {}
        self._last_used: dict[str, int] = {}
        self._lookups = 0

    def __len__(self) -> int:
        return len(self._hashes)

    def ids_held(self) -> int:
        """How many ids' hashes are kept (the memory is 8 bytes each)."""
        return sum(h.size for h in self._hashes.values())

    def files_with(self, files: Iterable[str], wanted: np.ndarray,
                   read_ids: Callable[[str], pa.Array | pa.ChunkedArray]) -> list[str]:
        """Those of ``files`` that hold an id whose hash (:func:`hash_ids`) is in ``wanted``,
        in ``files``' order: every file holding one of the ids, and maybe a file whose id
        only shares a hash. A file not met before is read with ``read_ids(path)`` (its id
        column). Raises what ``read_ids`` raises."""
        files = list(files)
        wanted = np.asarray(wanted, np.uint64)
        self._lookups += 1
        hits = []
        for path in files:
            self._last_used[path] = self._lookups
            hashes = self._hashes.get(path)
            if hashes is None:
                # sorted, not made unique: np.unique takes 40 times as long on millions of ids
                hashes = self._hashes[path] = np.sort(hash_ids(read_ids(path)))
            if hashes.size and wanted.size:
                at = np.minimum(np.searchsorted(hashes, wanted), hashes.size - 1)
                if np.any(hashes[at] == wanted):
                    hits.append(path)
        for path in [p for p, used in self._last_used.items() if self._lookups - used > self.forget_after]:
            del self._hashes[path], self._last_used[path]
        return hits
