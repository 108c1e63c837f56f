"""`make bench` (last): every figure against its target, from bench/results/*.json.

Prints the throughput ratios (ingest_bench), the latency percentiles
(latency_bench), the backfill cost ratio (backfill_bench) and the peer stack's ratios
(peer_bench), each with its
target and whether it is met, and the machine's load when it was measured. A
missing result file is reported as missing, not as met.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS  # noqa: E402


def main() -> int:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    print("\n== figures against their targets ==")
    for name in ("ingest", "latency", "latency_200", "latency_orders", "backfill", "operations", "object_store",
                 "s3_proof", "spark_python", "peer"):
        path = results / f"{name}.json"
        if not path.exists():
            print(f"{name}: no results ({path} missing: run bench/{name}_bench.py)")
            continue
        data = json.loads(path.read_text())
        for line in data.get("summary", []):
            print(line)
    print(f"details: {results}/ingest.md, latency.md, latency_200.md, latency_orders.md, backfill.md, operations.md, object_store.md, s3_proof.md, "
          f"spark_python.md, peer.md (each figure with the machine's load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
