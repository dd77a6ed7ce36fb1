#!/usr/bin/env python3
"""State at scale: word-count (`groupByKey().count()`) over partitions of 20k to millions of
distinct keys, baton against Kafka Streams on the same input and broker, in alternating runs.

- Input per row: 3 records per distinct key (each key the same number of times, in a
  pseudo-random order that spreads a key's records over the whole run; at least
  BATON_SCALE_MIN_RECORDS records, default 6M, so that the small rows run long enough to
  measure), values of 100 bytes, produced by a librdkafka client (confluent-kafka) with its
  default partitioner into 4 partitions per baton partition.
- baton runs the row's partitions (4 slots each) under exactly-once with `--state-memory`
  (BATON_SCALE_STATE_MEMORY, default 512MiB); Kafka Streams runs one stream thread per baton
  partition (so one thread per 4 input partitions, each task with its own RocksDB, its defaults).
- Throughput is measured from outside on the group's committed offsets, every 250 ms: the rate
  over 25-100% of the records, the CPU seconds per million records over that window, and the
  rate over the second half of the records against the first half (a collapse shows there).
- For baton also: its peak RSS (VmHWM) against the bound, the SST bytes on disk at the end, and
  the restore: a new `baton` process on an empty data dir restores every partition from the
  changelogs; its rate is changelog records applied per second of wall time (process start to
  every partition running, so the host's start and its joining the cluster count too), with its
  CPU per million records; beside it, the slowest partition's rate by its own clock (its
  restore's start to its end, as `GET /api/v1/partitions` reports it). The ceiling is a bare
  reader per baton partition over the same changelog partitions: baton's own consumer
  (read_committed, its fetch settings, batched fetches) touching each record's key and nothing
  more.

Rows: BATON_SCALE_ROWS, a comma-separated list of KEYSxPARTITIONS (keys per partition, k and M
suffixes), default `20kx1,1Mx1,10Mx1,12.5Mx4`. Rounds per row: BATON_SCALE_ROUNDS (default 2
for rows of at most 1M keys, 1 above). Kafka Streams runs on rows of at most
BATON_SCALE_KS_MAX_KEYS keys in all (default 10M; above it a run would take hours here), and
for at most BATON_SCALE_KS_LIMIT_S seconds (default 900): a run stopped there is measured from
25% (or 10%, if it got no further than 40%) to where it got, and marked. Kafka Streams slows as
its state grows, so a stopped run's rate is above what the whole run would have shown: the
ratio to baton is in Kafka Streams' favour.
BATON_SCALE_KEEP_TOPICS=1 keeps each row's topics (input, changelogs) on the broker after it, for
profiling a restore of them again (`bench/restore.py`).
Run by `bench/run state-scale`; prints a Markdown table.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (BOOT, Committed, cpu_secs, http, say, start_baton,  # noqa: E402
                      status_kib, stop, topic_producer)

SLOTS_PER_PARTITION = 4
VALUE = b"v" * 100
STATE_MEMORY = os.environ.get("BATON_SCALE_STATE_MEMORY", "512MiB")
KSTREAMS_CP = os.environ.get("BATON_KSTREAMS_CP", "")
PLUGIN = os.environ["BATON_WORD_COUNT"]
RUN_ID = f"{os.getpid()}-{int(time.time())}"
KS_MAX_KEYS = None  # set in main()


def log(msg):
    say("state-scale", msg)


def parse_count(s):
    mult = {"k": 1_000, "M": 1_000_000}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "kM" else s) * mult)


def parse_bytes(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def produce(topic, keys, partitions, n):
    """`n` records over `keys` keys: record i carries key (i * STEP) mod keys, STEP a prime that
    does not divide `keys`, so that every key comes once per `keys` records and its neighbours
    in time are far apart in key order."""
    p = topic_producer(topic, partitions)
    step = 2_654_435_761
    while keys % step == 0:
        step += 2
    started = time.time()
    produce_one = p.produce
    for i in range(n):
        key = b"user-%012d" % ((i * step) % keys)
        while True:
            try:
                produce_one(topic, key=key, value=VALUE)
                break
            except BufferError:
                p.poll(0.05)
        if i % 200_000 == 0:
            p.poll(0)
            if i and i % 10_000_000 == 0:
                log(f"produced {i:,} of {n:,}")
    p.flush()
    log(f"produced {n:,} records over {keys:,} keys into {partitions} partitions "
        f"in {time.time() - started:.1f} s")
    return n


def measure(proc, group, topic, partitions, n, label, sample=None, limit_s=7200, stop_ok=False):
    """Polls the group's committed offsets until all `n` records are; returns the figures. With
    `stop_ok`, a run still going after `limit_s` is measured up to there."""
    committed = Committed(group, topic, partitions)
    started = time.time()
    points = []  # (time, committed, cpu)
    deadline = started + limit_s
    stopped = False
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode}")
            done = committed.total()
            now = time.time()
            points.append((now, done, cpu_secs(proc.pid)))
            if sample:
                sample()
            if done >= n:
                break
            if now > deadline and stop_ok and done >= 0.2 * n:
                stopped = True
                log(f"{label}: stopped after {limit_s:.0f} s at {done:,} of {n:,} records")
                break
            if now > deadline:
                raise RuntimeError(f"{label}: only {done:,} of {n:,} committed in time")
            if len(points) % 240 == 0:
                log(f"{label}: {done:,} of {n:,} committed after {now - started:.0f} s")
            time.sleep(0.25)
    finally:
        committed.close()

    def at(fraction):
        """The first point at which `fraction` of the records were committed."""
        return next(p for p in points if p[1] >= fraction * n)

    def rate(a, b):
        return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)

    first, end = next(p for p in points if p[1] > 0), points[-1]
    reached = end[1] / n
    start = at(0.25) if reached >= 0.4 else at(0.1)
    half = at(reached / 2)
    return {
        "rate": rate(start, end),
        "cpu_per_m": (end[2] - start[2]) / ((end[1] - start[1]) / 1e6),
        "first_half": rate(first, half),
        "second_half": rate(half, end),
        "total_secs": end[0] - started,
        "stopped_at": reached if stopped else None,
    }


def sst_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".sst"))
    return total


def wait_running(base, partitions, proc, limit_s):
    """Waits until every partition of the pipeline runs on this host with its restore finished;
    returns the changelog records the restores applied and the slowest partition's restore rate
    by its own clock (records over the seconds from its restore's start to its end)."""
    deadline = time.time() + limit_s
    me = http(base, "GET", "/api/v1/host")["id"]
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"baton exited with {proc.returncode}")
        rows = [p for p in http(base, "GET", "/api/v1/partitions")
                if p["pipeline"] == "wc" and p["owner"] == me]
        done = [p for p in rows if p["state"] == "running"
                and (p.get("restore") or {}).get("finished")]
        if len(rows) == partitions and len(done) == partitions:
            return (sum(p["restore"]["done"] for p in rows),
                    min(p["restore"]["rate"] for p in rows))
        if time.time() > deadline:
            raise RuntimeError(f"restore not finished in {limit_s} s: {rows}")
        time.sleep(0.1)


def run_baton(topic, n, partitions, run):
    data = tempfile.mkdtemp(prefix="baton-scale-")
    cluster = f"scale-{RUN_ID}-{run}"
    proc, base = start_baton(data, cluster, STATE_MEMORY)
    try:
        http(base, "POST", "/api/v1/modules?name=word-count&version=1",
             open(PLUGIN, "rb").read(), "application/wasm")
        spec = {
            "name": "wc", "module": "word-count", "version": "1", "inputs": [topic],
            "stores": ["counts"], "slots": partitions * SLOTS_PER_PARTITION,
            "partitions": partitions, "guarantee": "exactly-once",
        }
        http(base, "POST", "/api/v1/pipelines", json.dumps(spec).encode())
        peak = [0]
        at_peak = [{}]

        def sample():
            rss = status_kib(proc.pid, "VmRSS")
            if rss > peak[0]:
                peak[0] = rss
                # What the host's memory holds at its peak: the state layer's parts beside
                # jemalloc's view of the whole heap.
                try:
                    at_peak[0] = http(base, "GET", "/api/v1/host")
                except Exception:
                    pass

        res = measure(proc, f"{cluster}.wc", topic, partitions * SLOTS_PER_PARTITION, n,
                      "baton", sample)
        res["rss_peak"] = max(peak[0], status_kib(proc.pid, "VmHWM")) << 10
        log(f"baton at its RSS peak of {mib(peak[0] << 10)} MiB: {breakdown(at_peak[0])}")
        host = http(base, "GET", "/api/v1/host")
        res["state_memory"] = host.get("state_memory", {})
        res["sst_bytes"] = sst_bytes(data)
    finally:
        stop(proc)
    try:
        # Restore: a new process, an empty data dir, the same cluster.
        fresh = tempfile.mkdtemp(prefix="baton-scale-restore-")
        started = time.time()
        proc, base = start_baton(fresh, cluster, STATE_MEMORY)
        try:
            replayed, own_rate = wait_running(base, partitions, proc, 3600)
            secs = time.time() - started
            cpu = cpu_secs(proc.pid)
            res["restore_rss_peak"] = status_kib(proc.pid, "VmHWM") << 10
        finally:
            stop(proc)
            shutil.rmtree(fresh, ignore_errors=True)
        res["restore_rate"] = replayed / secs
        res["restore_own_rate"] = own_rate
        res["restore_cpu_per_m"] = cpu / max(replayed / 1e6, 1e-9)
        res["restored"] = replayed
        res["cluster"] = cluster
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return res


def run_kstreams(topic, n, partitions, run):
    app = f"scale-ks-{RUN_ID}-{run}"
    logf = tempfile.NamedTemporaryFile(prefix="kstreams-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        ["java", "-Xms512m", "-Xmx2g", "-cp", KSTREAMS_CP, "WordCount", BOOT, topic, app,
         "exactly-once", str(partitions), "serve"],
        stdout=subprocess.DEVNULL, stderr=logf)
    try:
        return measure(proc, app, topic, partitions * SLOTS_PER_PARTITION, n, "Kafka Streams",
                       limit_s=float(os.environ.get("BATON_SCALE_KS_LIMIT_S", "900")),
                       stop_ok=True)
    finally:
        stop(proc)


def run_bare(topic, slots, consumers):
    """Bare rdkafka consumers (one per baton partition) over the `slots` partitions of a
    changelog topic: (records/s, CPU s per M records)."""
    cmd = ([os.environ["BATON_BARE_BENCH"], "--bench"] if "BATON_BARE_BENCH" in os.environ
           else ["cargo", "bench", "-q", "-p", "baton-tests", "--bench", "kafka_pipeline"])
    out = subprocess.run(
        cmd, env={**os.environ, "BATON_BENCH_BARE_TOPIC": topic,
                  "BATON_BENCH_BARE_PARTITIONS": str(slots), "BATON_BENCH_BARE_CONSUMERS": str(consumers)},
        capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("bare "))
    _, rate, secs, cpu = line.split()
    rate, secs, cpu = float(rate), float(secs), float(cpu)
    return rate, cpu / max(rate * secs / 1e6, 1e-9)


def drop_topics():
    """Deletes the topics of this run (inputs, baton's, Kafka Streams'): a row of 50M keys
    leaves tens of GB on the broker, and a full disk stops it mid-run."""
    admin = AdminClient({"bootstrap.servers": BOOT})
    mine = [t for t in admin.list_topics(timeout=30).topics if RUN_ID in t]
    for topic, done in (admin.delete_topics(mine, operation_timeout=60).items() if mine else []):
        try:
            done.result()
        except Exception as e:  # noqa: BLE001 - a topic left behind is worth a line, not a stop
            log(f"could not delete {topic}: {e}")


def breakdown(host):
    """The parts of a host's memory from a `GET /api/v1/host` answer, in MiB."""
    mem, heap = host.get("state_memory") or {}, host.get("heap") or {}
    parts = [(k, mem.get(k)) for k in ("block_cache_usage", "block_cache_capacity",
                                        "memtable_usage", "hot_cache_usage", "table_readers_bytes")]
    parts += [(f"heap {k}", heap.get(k)) for k in ("allocated", "active", "resident")]
    return ", ".join(f"{k} {mib(v)}" for k, v in parts if v is not None)


def mib(b):
    return f"{b / (1 << 20):,.0f}"


def main():
    rows = [r.split("x") for r in
            os.environ.get("BATON_SCALE_ROWS", "20kx1,1Mx1,10Mx1,12.5Mx4").split(",")]
    ks_max = parse_count(os.environ.get("BATON_SCALE_KS_MAX_KEYS", "10M"))
    bound = parse_bytes(STATE_MEMORY)
    table = []
    run = 0
    for ri, (keys_s, parts_s) in enumerate(rows):
        per, partitions = parse_count(keys_s), int(parts_s)
        keys = per * partitions
        rounds = int(os.environ.get("BATON_SCALE_ROUNDS", "2" if keys <= 1_000_000 else "1"))
        topic = f"scale-{RUN_ID}-{ri}"
        n = max(3 * keys, parse_count(os.environ.get("BATON_SCALE_MIN_RECORDS", "6M")))
        produce(topic, keys, partitions * SLOTS_PER_PARTITION, n)
        with_ks = keys <= ks_max
        results = {"baton": [], "kstreams": []}
        for r in range(rounds):
            order = [("baton", run_baton), ("kstreams", run_kstreams)]
            if (ri + r) % 2:
                order.reverse()
            for who, fn in order:
                if who == "kstreams" and not with_ks:
                    continue
                run += 1
                res = fn(topic, n, partitions, run)
                results[who].append(res)
                extra = ""
                if who == "baton":
                    extra = (f", RSS peak {mib(res['rss_peak'])} MiB, SST {mib(res['sst_bytes'])}"
                             f" MiB, restore {res['restore_rate']:,.0f} records/s (slowest partition by its"
                             f" own clock: {res['restore_own_rate']:,.0f}), restore RSS peak"
                             f" {mib(res['restore_rss_peak'])} MiB")
                log(f"{keys_s}x{parts_s} round {r + 1} {who}: {res['rate']:,.0f} records/s, "
                    f"{res['cpu_per_m']:.2f} CPU s/M, halves {res['first_half']:,.0f} -> "
                    f"{res['second_half']:,.0f}, {res['total_secs']:.0f} s{extra}")
        bt = results["baton"]
        last = bt[-1]
        bare = run_bare(f"{last['cluster']}.wc.counts.changelog",
                        partitions * SLOTS_PER_PARTITION, partitions)
        log(f"{keys_s}x{parts_s} bare readers of the changelog: {bare[0]:,.0f} records/s, "
            f"{bare[1]:.2f} CPU s/M")
        table.append((keys_s, partitions, n, results, bare))
        if os.environ.get("BATON_SCALE_KEEP_TOPICS") != "1":
            drop_topics()

    med = lambda xs, k: statistics.median(x[k] for x in xs)
    print(f"\nword-count (groupByKey().count()) at scale, exactly-once: 3 records per distinct "
          f"key (at least {os.environ.get('BATON_SCALE_MIN_RECORDS', '6M')} records), 100-byte values, {SLOTS_PER_PARTITION} input partitions per baton partition, "
          f"--state-memory {STATE_MEMORY}; rates over 25-100% of the records; medians of the "
          "rounds\n")
    print("| keys per partition | partitions | records | baton records/s | baton CPU s / M | "
          "KS records/s | KS CPU s / M | baton / KS | 2nd half / 1st half (baton, KS) | "
          "baton peak RSS MiB (bound) | SST MiB | restore records/s | restore records/s per "
          "partition | restore CPU s / M | "
          "bare readers of the changelog records/s (CPU s / M) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for keys_s, partitions, n, results, bare in table:
        bt, ks = results["baton"], results["kstreams"]
        halves = lambda xs: min(x["second_half"] / x["first_half"] for x in xs)
        stopped = [x["stopped_at"] for x in ks if x.get("stopped_at")]
        mark = f" (stopped at {100 * min(stopped):.0f}%)" if stopped else ""
        ks_rate = f"{med(ks, 'rate'):,.0f}{mark}" if ks else "not run"
        ks_cpu = f"{med(ks, 'cpu_per_m'):.2f}" if ks else "—"
        ratio = f"{med(bt, 'rate') / med(ks, 'rate'):.2f}" if ks else "—"
        ks_halves = f"{halves(ks):.2f}" if ks else "—"
        print(f"| {keys_s} | {partitions} | {n:,} | {med(bt, 'rate'):,.0f} | "
              f"{med(bt, 'cpu_per_m'):.2f} | {ks_rate} | {ks_cpu} | {ratio} | "
              f"{halves(bt):.2f}, {ks_halves} | {mib(max(x['rss_peak'] for x in bt))} "
              f"({mib(bound)}) | {mib(med(bt, 'sst_bytes'))} | {med(bt, 'restore_rate'):,.0f} | "
              f"{med(bt, 'restore_own_rate'):,.0f} | "
              f"{med(bt, 'restore_cpu_per_m'):.2f} | {bare[0]:,.0f} ({bare[1]:.2f}) |")
    print("\nevery run (records/s over 25-100%):")
    for keys_s, partitions, n, results, _ in table:
        for who, rs in results.items():
            if rs:
                print(f"- {keys_s}x{partitions} {who}: " +
                      ", ".join(f"{x['rate']:,.0f}" for x in rs))
    for keys_s, partitions, n, results, _ in table:
        print(f"- {keys_s}x{partitions} baton state memory at the end: "
              f"{results['baton'][-1]['state_memory']}")


if __name__ == "__main__":
    main()
