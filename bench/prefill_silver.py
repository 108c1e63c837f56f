"""Fill a pipeline's silver table with a day of synthetic events, as a long run leaves it.

For measuring what a full de-duplication horizon costs a running pipeline
(bench/results/dedup_pipeline_day.md): ``--events`` events of the definition
``--definition`` (default the demo's, sensors), random 32-hex-digit ids, event
times spread over the last 23 hours, written with delta-rs to ROOT/silver in files
of a million rows. Their lineage is made up (topic ``prefill``), so the platform's
checks of that root fail; use a root of its own.

    .venv/bin/python bench/prefill_silver.py ROOT [--events 17280000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "include"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from streamlake.pipeline.definition import load_definition  # noqa: E402
from streamlake.pipeline.silver import ensure_silver  # noqa: E402

CHUNK = 1_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="the pipeline's root (silver goes to ROOT/silver)")
    parser.add_argument("--events", type=int, default=17_280_000, help="events to write (24 h at 200/s)")
    parser.add_argument("--definition", default=str(HERE.parent / "pipelines" / "sensors.yaml"))
    args = parser.parse_args()
    definition = load_definition(args.definition)
    _, spec = ensure_silver(f"{args.root}/silver", definition)
    now_us = int(time.time() * 1e6)
    rng = np.random.default_rng(1)
    for start in range(0, args.events, CHUNK):
        k = min(CHUNK, args.events - start)
        times = pa.array(np.sort(now_us - rng.integers(0, 23 * 3600 * 10**6, k)), pa.timestamp("us", tz="UTC"))
        ids = [f"{x:016x}{y:016x}" for x, y in zip(rng.integers(0, 2**63, k).tolist(),
                                                   rng.integers(0, 2**63, k).tolist())]
        columns = {definition.event_id: pa.array(ids), definition.event_time: times, "topic": pa.array(["prefill"] * k),
                   "partition": pa.array(np.zeros(k, np.int32)),
                   "offset": pa.array(np.arange(start, start + k, dtype=np.int64)), "kafka_timestamp": times,
                   "bronze_version": pa.array(np.zeros(k, np.int64)), "event_date": pc.cast(times, pa.date32())}
        for f in spec.schema:  # the definition's other fields: one value each
            if f.name not in columns:
                columns[f.name] = pa.array([{"string": "x", "double": 21.5}.get(str(f.type))] * k, f.type)
        write_deltalake(f"{args.root}/silver", pa.table(columns, schema=spec.schema), mode="append",
                        partition_by=list(spec.partition_by))
        print(f"silver: {start + k:,} of {args.events:,} events", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
