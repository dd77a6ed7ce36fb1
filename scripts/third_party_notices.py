#!/usr/bin/env python3
"""Prints THIRD-PARTY-NOTICES for the `baton` binary: every crate it is built from (normal and
build dependencies, not dev), with its license, then each distinct license text found in those
crates' sources with the crates it covers, and the C/C++ libraries bundled by the -sys crates."""
import hashlib
import json
import os
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
target = next(l.split(": ", 1)[1] for l in host.splitlines() if l.startswith("host: "))
meta = json.loads(subprocess.run(
    ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target],
    cwd=root, capture_output=True, text=True, check=True).stdout)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
start = next(p["id"] for p in meta["packages"] if p["name"] == "baton")
seen, todo = set(), [start]
while todo:
    pid = todo.pop()
    if pid in seen:
        continue
    seen.add(pid)
    for dep in nodes[pid]["deps"]:
        if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
            todo.append(dep["pkg"])
seen.discard(start)
crates = sorted((packages[p] for p in seen), key=lambda p: (p["name"], p["version"]))
# Crates of this repository (the SDK's macros, say) are baton's own.
crates = [p for p in crates if p["source"] is not None]

texts = {}
for p in crates:
    d = os.path.dirname(p["manifest_path"])
    for f in sorted(os.listdir(d)):
        if f.upper().startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE", "UNLICENSE")):
            path = os.path.join(d, f)
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read().strip()
                key = hashlib.sha256(text.encode()).hexdigest()
                texts.setdefault(key, [text, []])[1].append(f"{p['name']} {p['version']}")

BUNDLED = [
    ("rdkafka-sys", "librdkafka", "BSD-2-Clause (and the licenses in its LICENSES.txt)",
     ["librdkafka/LICENSE", "librdkafka/LICENSES.txt"]),
    ("librocksdb-sys", "RocksDB", "Apache-2.0 (or GPL-2.0-only)",
     ["rocksdb/LICENSE.Apache", "rocksdb/LICENSE.leveldb"]),
    ("lz4-sys", "LZ4", "BSD-2-Clause", ["liblz4/lib/LICENSE"]),
]

out = sys.stdout
out.write("THIRD-PARTY NOTICES for baton\n\nbaton is licensed under Apache-2.0 (LICENSE). Its binary "
          "is built from the crates below\nand the C/C++ libraries they bundle.\n\n")
out.write(f"## Crates ({len(crates)})\n\n")
for p in crates:
    out.write(f"- {p['name']} {p['version']}: {p.get('license') or p.get('license_file') or 'see its sources'}"
              f"{' (' + p['repository'] + ')' if p.get('repository') else ''}\n")
out.write("\n## Bundled C/C++ libraries\n\n")
bundled_texts = []
for crate, lib, lic, files in BUNDLED:
    p = next((p for p in crates if p["name"] == crate), None)
    if p is None:
        continue
    out.write(f"- {lib}, bundled by {crate} {p['version']}: {lic}\n")
    d = os.path.dirname(p["manifest_path"])
    for f in files:
        path = os.path.join(d, f)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                bundled_texts.append((f"{lib} ({f})", fh.read().strip()))
out.write("\n## License texts\n")
for name, text in bundled_texts:
    out.write(f"\n### {name}\n\n{text}\n")
for text, users in sorted(texts.values(), key=lambda t: t[1][0]):
    out.write(f"\n### Covers: {', '.join(users)}\n\n{text}\n")
