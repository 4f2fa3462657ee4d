"""What a stand-in perf_analyzer (a test's shell script, through ``DEPLOYBENCH_PERF_ANALYZER``)
writes for ``--profile-export-file``, in the format of tritonclient 2.41's perf_analyzer
(triton-inference-server/client r23.12, src/c++/perf_analyzer/profile_data_exporter.cc): one
experiment, its requests' start and response timestamps (system clock, ns since the epoch) and
its windows' boundaries (contiguous windows).

A script gets it with ``PROFILE_EXPORT`` at its top (before it parses its arguments) and calls
``write_export <requests in the measured windows>`` where it writes its CSV.

    python tests/perf_standin.py <path> <requests> [latency_ms]

``PERF_STANDIN_WINDOW_S`` in its environment: another window length (a test that reads a meter
over the windows makes them long enough that a loaded machine's late ticks stay small beside them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

WINDOWS = 3
WINDOW_S = 0.02


def write_export(
    path: Path, requests: int, latency_ms: float = 5.0, window_s: float = WINDOW_S
) -> None:
    """``requests`` evenly spread over 3 windows of ``window_s``, measured now (as the real one's
    windows pass while it runs: a meter sampled around the process spans them), each request
    ``latency_ms`` long, and one more request before the windows (which they leave out)."""
    start = time.time_ns()
    time.sleep(WINDOWS * window_s)
    end = start + int(WINDOWS * window_s * 1e9)
    latency = int(latency_ms * 1e6)
    ends = [start + (i + 1) * (end - start) // (requests + 1) for i in range(requests)]
    records = [{"timestamp": start - 2 * latency, "response_timestamps": [start - latency]}]
    records += [{"timestamp": e - latency, "response_timestamps": [e]} for e in ends]
    boundaries = [start + w * (end - start) // WINDOWS for w in range(WINDOWS + 1)]
    experiment = {
        "experiment": {"mode": "concurrency", "value": 1},
        "requests": records,
        "window_boundaries": boundaries,
    }
    path.write_text(json.dumps({"experiments": [experiment], "version": "stand-in"}))


# Bash: `export_file` from the arguments, and `write_export N` (a no-op without the flag).
PROFILE_EXPORT = f"""export_file=""; prev=""
for a in "$@"; do [ "$prev" = "--profile-export-file" ] && export_file=$a; prev=$a; done
write_export() {{ [ -z "$export_file" ] || "{sys.executable}" "{Path(__file__)}" "$export_file" "$1"; }}
"""

if __name__ == "__main__":
    write_export(
        Path(sys.argv[1]),
        int(sys.argv[2]),
        *(float(a) for a in sys.argv[3:4]),
        window_s=float(os.environ.get("PERF_STANDIN_WINDOW_S", WINDOW_S)),
    )
