"""What bench/steady.py and bench/state_scale.py share: CPU and memory of a process from /proc, a
group's committed offsets, the HTTP API, and starting and stopping `baton run`."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOT = os.environ.get("BATON_KAFKA", "127.0.0.1:9092")
TICK = os.sysconf("SC_CLK_TCK")


def say(prefix, msg):
    print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)


def cpu_secs(pid):
    """User + system CPU seconds of a process (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kib(pid, field):
    """A figure in kB of /proc/<pid>/status, e.g. `VmRSS` or `VmHWM` (the peak RSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/{pid}/status")


def topic_producer(topic, partitions):
    """Creates `topic` with `partitions` partitions and returns a librdkafka producer tuned for
    bulk input (large batches, no compression)."""
    admin = AdminClient({"bootstrap.servers": BOOT})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    return Producer({
        "bootstrap.servers": BOOT,
        "linger.ms": 50,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 2_000_000,
        "compression.type": "none",
    })


class Committed:
    """The sum of a group's committed offsets over the first `partitions` partitions of a topic."""

    def __init__(self, group, topic, partitions):
        self.c = Consumer({"bootstrap.servers": BOOT, "group.id": group,
                           "enable.auto.commit": False})
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def total(self):
        got = self.c.committed(self.tps, timeout=10)
        return sum(max(tp.offset, 0) for tp in got)

    def close(self):
        self.c.close()


def stop(proc):
    """SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http(base, method, path, body=None, ctype="application/json"):
    req = urllib.request.Request(base + path, data=body, method=method,
                                 headers={"content-type": ctype})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def start_baton(data, cluster, state_memory="512MiB", extra=(), binary=None):
    """`baton run` on Kafka in `data` (`binary`, else $BATON_BIN); returns (process, API base
    URL) once it has written its address."""
    proc = subprocess.Popen(
        [binary or os.environ["BATON_BIN"], "run", "--kafka", BOOT, "--cluster", cluster, "--data-dir",
         data, "--http", "127.0.0.1:0", "--state-memory", state_memory, *extra],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(data, "baton.log"), "a"))
    addr = os.path.join(data, "baton.addr")
    deadline = time.time() + 60
    while not (os.path.exists(addr) and open(addr).read()):
        if time.time() > deadline or proc.poll() is not None:
            stop(proc)
            raise RuntimeError(f"baton did not start; see {data}/baton.log")
        time.sleep(0.05)
    return proc, "http://" + open(addr).read().strip()
