#!/usr/bin/env python3
"""Steady-state side by side: baton and Kafka Streams running `groupByKey().count()` over the
same topic on the same broker, in alternating runs, with the CPU each process spends.

- The input is produced once by a librdkafka client (confluent-kafka) with its default
  partitioner, as most non-Java producers place keys: BATON_STEADY_RECORDS records (default
  48,000,000, so that every run lasts over 30 s on two cores), 20,000 keys spread uniformly, 8
  partitions.
- Each run starts the contender as a process of its own (`baton run`, or Kafka Streams'
  bench/kstreams/WordCount in `serve` mode) with 2 partitions / 2 stream threads and polls the
  group's committed input offsets every 50 ms from outside, the same way for both. The steady
  state is the window from 25% of the records committed to the last one: its rate, and the
  user + system CPU seconds per million records of the contender and of the broker over that
  window, read from /proc.
- Both guarantees; BATON_STEADY_ROUNDS rounds (default 3), the contenders' order alternating
  from round to round; medians are reported. The ceiling is bare readers (baton's own Kafka
  consumers with batched fetches, touching each record's key and nothing more, 2 of them, each
  over 4 partitions) reading the same topic, in the same rounds.

With BATON_STEADY_VERSUS=<another baton binary> (`bench/run compare <rev>`), the second
contender is that build instead of Kafka Streams, in the same alternating rounds, and no bare
readers run: a change of baton's data path measured against the build before it.

Run by bench/run (which starts the broker and builds what is needed); prints Markdown tables.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BOOT, Committed, cpu_secs, http, start_baton, stop, topic_producer  # noqa: E402
from benchlib import say as say_as  # noqa: E402

N = int(os.environ.get("BATON_STEADY_RECORDS", "48000000").replace("_", ""))
ROUNDS = int(os.environ.get("BATON_STEADY_ROUNDS", "3"))
# baton's commit_interval_ms (its default when unset), to measure throughput across intervals.
COMMIT_INTERVAL = os.environ.get("BATON_STEADY_COMMIT_INTERVAL_MS")
SLOTS = 8
KEYS = 20_000
BATON_BIN = os.environ["BATON_BIN"]
PLUGIN = os.environ["BATON_WORD_COUNT"]
# `windowed`: windowed-count (1 s tumbling windows, 200 ms grace, final counts sent when a window
# closes) against Kafka Streams' windowedBy(...).count().suppress(untilWindowCloses(...)).
TOPOLOGY = os.environ.get("BATON_STEADY_TOPOLOGY", "count")
WINDOW_MS, GRACE_MS = 1000, 200
VERSUS = os.environ.get("BATON_STEADY_VERSUS")
KSTREAMS_CP = os.environ.get("BATON_KSTREAMS_CP", "")
BROKER_PID = int(open(os.environ["BATON_BROKER_PIDFILE"]).read().strip())
RUN_ID = f"{os.getpid()}-{int(time.time())}"


def say(msg):
    say_as("steady", msg)


def produce(topic):
    p = topic_producer(topic, SLOTS)
    started = time.time()
    x = 0x9E3779B97F4A7C15
    for i in range(N):
        # A fixed xorshift stream: the same keys in every run of the benchmark.
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        key = f"w{x % KEYS}"
        while True:
            try:
                p.produce(topic, key=key, value=b"1")
                break
            except BufferError:
                p.poll(0.05)
        if i % 100_000 == 0:
            p.poll(0)
    p.flush()
    say(f"produced {N:,} records in {time.time() - started:.1f} s")


def measure(proc, group, topic, label):
    """Polls the group until every record is committed; returns the run's figures."""
    committed = Committed(group, topic, SLOTS)
    started = time.time()
    mark = None
    deadline = started + 900
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode}")
            done = committed.total()
            now = time.time()
            if mark is None and done >= N // 4:
                mark = (now, done, cpu_secs(proc.pid), cpu_secs(BROKER_PID))
            if done >= N:
                end = (now, done, cpu_secs(proc.pid), cpu_secs(BROKER_PID))
                break
            if now > deadline:
                raise RuntimeError(f"{label}: only {done:,} of {N:,} committed after 900 s")
            time.sleep(0.05)
    finally:
        committed.close()
    window = end[1] - mark[1]
    secs = end[0] - mark[0]
    return {
        "rate": window / secs,
        "total_secs": end[0] - started,
        "cpu_per_m": (end[2] - mark[2]) / (window / 1e6),
        "broker_cpu_per_m": (end[3] - mark[3]) / (window / 1e6),
    }


def run_baton(topic, guarantee, n, binary=None):
    data = tempfile.mkdtemp(prefix="baton-steady-")
    cluster = f"steady-{RUN_ID}-{n}"
    proc, base = start_baton(data, cluster, binary=binary)
    try:
        if TOPOLOGY == "windowed":
            http(base, "POST", "/api/v1/modules?name=windowed-count&version=1",
                 open(os.environ["BATON_WINDOWED_COUNT"], "rb").read(), "application/wasm")
            spec = {
                "name": "wc", "module": "windowed-count", "version": "1", "inputs": [topic],
                "outputs": [f"steady-out-{RUN_ID}-{n}", f"steady-late-{RUN_ID}-{n}"],
                "stores": ["windows"], "slots": SLOTS, "partitions": 2, "guarantee": guarantee,
                "config": {"window_ms": WINDOW_MS, "grace_ms": GRACE_MS,
                           "output": f"steady-out-{RUN_ID}-{n}",
                           "late": f"steady-late-{RUN_ID}-{n}"},
            }
        else:
            http(base, "POST", "/api/v1/modules?name=word-count&version=1",
                 open(PLUGIN, "rb").read(), "application/wasm")
            spec = {
                "name": "wc", "module": "word-count", "version": "1", "inputs": [topic],
                "stores": ["counts"], "slots": SLOTS, "partitions": 2, "guarantee": guarantee,
            }
        if COMMIT_INTERVAL is not None:
            spec["commit_interval_ms"] = int(COMMIT_INTERVAL)
        http(base, "POST", "/api/v1/pipelines", json.dumps(spec).encode())
        return measure(proc, f"{cluster}.wc", topic, "baton")
    finally:
        stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def run_kstreams(topic, guarantee, n):
    app = f"steady-ks-{RUN_ID}-{n}"
    log = tempfile.NamedTemporaryFile(prefix="kstreams-", suffix=".log", delete=False)
    if TOPOLOGY == "windowed":
        # The broker creates no topics on its own: the output must exist before Kafka Streams
        # sends to it (baton creates its outputs itself).
        out = f"steady-ks-out-{RUN_ID}-{n}"
        admin = AdminClient({"bootstrap.servers": BOOT})
        admin.create_topics([NewTopic(out, SLOTS, 1)])[out].result()
        args = ["WindowedCount", BOOT, topic, app, guarantee, "2", out,
                str(WINDOW_MS), str(GRACE_MS)]
    else:
        args = ["WordCount", BOOT, topic, app, guarantee, "2", "serve"]
    proc = subprocess.Popen(
        ["java", "-Xms512m", "-Xmx2g", "-cp", KSTREAMS_CP] + args,
        stdout=subprocess.DEVNULL, stderr=log)
    try:
        return measure(proc, app, topic, "Kafka Streams")
    finally:
        stop(proc)


def run_bare(topic):
    # BATON_BARE_BENCH: the kafka_pipeline bench executable, built already (nothing compiles
    # during the runs).
    cmd = ([os.environ["BATON_BARE_BENCH"], "--bench"] if "BATON_BARE_BENCH" in os.environ
           else ["cargo", "bench", "-q", "-p", "baton-tests", "--bench", "kafka_pipeline"])
    out = subprocess.run(
        cmd,
        env={**os.environ, "BATON_BENCH_BARE_TOPIC": topic}, capture_output=True, text=True,
        check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("bare "))
    _, rate, secs, cpu = line.split()
    return {"rate": float(rate), "cpu_per_m": float(cpu) / (N / 1e6)}


def main():
    topic = f"steady-words-{RUN_ID}"
    produce(topic)
    results = {(g, who): [] for g in ("exactly-once", "at-least-once")
               for who in ("baton", "kstreams")}
    bare = []
    n = 0
    other = ((lambda t, g, n: run_baton(t, g, n, VERSUS)) if VERSUS else run_kstreams)
    for r in range(ROUNDS):
        for g in ("exactly-once", "at-least-once"):
            order = [("baton", run_baton), ("kstreams", other)]
            if (r + (g == "at-least-once")) % 2:
                order.reverse()
            for who, run in order:
                n += 1
                res = run(topic, g, n)
                results[(g, who)].append(res)
                say(f"round {r + 1} {g} {who}: {res['rate']:,.0f} records/s steady, "
                    f"{res['total_secs']:.1f} s in all, {res['cpu_per_m']:.2f} CPU s per M, "
                    f"broker {res['broker_cpu_per_m']:.2f}")
                if res["total_secs"] < 30:
                    say(f"warning: the run lasted {res['total_secs']:.1f} s, under 30 s: "
                        "raise BATON_STEADY_RECORDS")
        if VERSUS:
            continue
        b = run_bare(topic)
        bare.append(b)
        say(f"round {r + 1} bare consumers: {b['rate']:,.0f} records/s, "
            f"{b['cpu_per_m']:.2f} CPU s per M")

    med = lambda xs, k: statistics.median(x[k] for x in xs)
    if VERSUS:
        print(f"\nword-count, this build against {VERSUS}: steady state, {N:,} records over "
              f"{SLOTS} partitions, {KEYS:,} keys; median of {ROUNDS} alternating rounds\n")
        print("| guarantee | before records/s | after records/s | after / before | "
              "before CPU s / M | after CPU s / M | after / before CPU |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for g in ("exactly-once", "at-least-once"):
            old, new = results[(g, "kstreams")], results[(g, "baton")]
            print(f"| {g} | {med(old, 'rate'):,.0f} | {med(new, 'rate'):,.0f} | "
                  f"{med(new, 'rate') / med(old, 'rate'):.3f} | {med(old, 'cpu_per_m'):.2f} | "
                  f"{med(new, 'cpu_per_m'):.2f} | "
                  f"{med(new, 'cpu_per_m') / med(old, 'cpu_per_m'):.3f} |")
        print("\nevery run (records/s steady, before / after):")
        for g in ("exactly-once", "at-least-once"):
            print(f"- {g}: " + ", ".join(f"{a['rate']:,.0f} / {b['rate']:,.0f}" for a, b in
                                         zip(results[(g, "kstreams")], results[(g, "baton")])))
        return
    ceiling = med(bare, "rate")
    what = ("windowed-count (1 s tumbling windows, 200 ms grace, suppressed until closed)"
            if TOPOLOGY == "windowed" else "word-count (groupByKey().count())")
    print(f"\n{what}: steady state, {N:,} records over {SLOTS} partitions produced by librdkafka "
          f"(default partitioner), {KEYS:,} keys; median of {ROUNDS} alternating rounds; "
          "window from 25% to 100% of the records committed\n")
    print("| guarantee | Kafka Streams records/s | baton records/s | baton / KS | "
          "KS CPU s / M records | baton CPU s / M records | baton / KS CPU | "
          "broker CPU s / M (KS run, baton run) | baton / bare consumers |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for g in ("exactly-once", "at-least-once"):
        ks, bt = results[(g, "kstreams")], results[(g, "baton")]
        print(f"| {g} | {med(ks, 'rate'):,.0f} | {med(bt, 'rate'):,.0f} | "
              f"{med(bt, 'rate') / med(ks, 'rate'):.2f} | {med(ks, 'cpu_per_m'):.2f} | "
              f"{med(bt, 'cpu_per_m'):.2f} | {med(bt, 'cpu_per_m') / med(ks, 'cpu_per_m'):.2f} | "
              f"{med(ks, 'broker_cpu_per_m'):.2f}, {med(bt, 'broker_cpu_per_m'):.2f} | "
              f"{med(bt, 'rate') / ceiling:.2f} |")
    print(f"\nbare readers (2, each over 4 partitions; baton's consumers, batched fetches): "
          f"{ceiling:,.0f} records/s, {med(bare, 'cpu_per_m'):.2f} CPU s / M records")
    print("\nevery run (records/s steady):")
    for (g, who), rs in results.items():
        print(f"- {g} {who}: " + ", ".join(f"{x['rate']:,.0f}" for x in rs))


if __name__ == "__main__":
    main()
