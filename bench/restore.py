#!/usr/bin/env python3
"""A restore, again: a new `baton` process on an empty data dir restores every partition of the
pipeline `wc` of CLUSTER from its changelogs (left on the broker by
`BATON_SCALE_KEEP_TOPICS=1 bench/run state-scale`), and prints its rate and CPU.

    bench/restore.py CLUSTER PARTITIONS [ROUNDS]

For profiling the restore path: each round prints the process id at its start, and
BATON_RESTORE_PERF=FILE records a `perf` profile (dwarf call graphs) of the first round.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import cpu_secs, say, start_baton, stop  # noqa: E402
from state_scale import STATE_MEMORY, wait_running  # noqa: E402


def main():
    cluster, partitions = sys.argv[1], int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    perf_out = os.environ.get("BATON_RESTORE_PERF")
    for r in range(rounds):
        fresh = tempfile.mkdtemp(prefix="baton-restore-")
        started = time.time()
        proc, base = start_baton(fresh, cluster, STATE_MEMORY)
        perf = None
        if perf_out and r == 0:
            perf = subprocess.Popen(["perf", "record", "-F", "199", "--call-graph", "dwarf,16384",
                                     "-p", str(proc.pid), "-o", perf_out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            replayed, own_rate = wait_running(base, partitions, proc, 3600)
            secs = time.time() - started
            cpu = cpu_secs(proc.pid)
        finally:
            if perf:
                perf.send_signal(2)
                perf.wait()
            stop(proc)
            shutil.copy(os.path.join(fresh, "baton.log"), f"{fresh}.log")
            shutil.rmtree(fresh, ignore_errors=True)
        say("restore", f"round {r + 1}: {replayed:,} records in {secs:.1f} s: {replayed / secs:,.0f} "
            f"records/s, {cpu / max(replayed / 1e6, 1e-9):.2f} CPU s/M; slowest partition by its "
            f"own clock {own_rate:,.0f} records/s (log: {fresh}.log)")


if __name__ == "__main__":
    main()
