#!/usr/bin/env python3
"""CPU or allocations per record by stage, from profiles of the forwarder
(BENCHMARKS.md).

    scripts/pprof-stages.py BINARY RECORDS PROFILE...

Each sample goes to the first stage below whose pattern matches a frame of its
stack (go tool pprof -raw); RECORDS is the records of one profiled run, and the
figures are the mean over the profiles. CPU profiles (bench-e2e's NAME.pprof)
give CPU per record; allocation profiles (NAME.allocs, what the process
allocated since it started, so of the whole run for a process started for it)
give bytes and objects allocated per record.
"""
import re
import subprocess
import sys

CW_PUT = r"sinks/cloudwatch\.\(\*Sink\)\.put|sinks/cloudwatch\.prebuiltBody"
STAGES = [
    ("CloudWatch signing (SigV4, payload SHA-256)", CW_PUT, r"aws/signer/v4|crypto/sha256"),
    ("CloudWatch request body", CW_PUT, r"awsjson\.\(\*Protocol\)\.SerializeRequest|PutLogEventsInput\)\.Serialize|appendPutBody|prebuiltBody"),
    ("CloudWatch HTTP and the rest of the SDK", CW_PUT, r"."),
    ("CloudWatch events, calls, intents", r"sinks/cloudwatch\.\(\*Sink\)\.Send", r"."),
    ("CloudWatch partition (name templates)", r"sinks/cloudwatch\.\(\*Sink\)\.Partition", r"."),
    ("S3 lines, gzip and upload", r"sinks/s3(sink)?\.", r"."),  # sinks/s3 before its rename
    ("HTTP client transport (both sinks)", r"net/http\.\(\*persistConn\)", r"."),
    ("WAL read", r"wal\.\(\*Reader\)|wal\.\(\*WAL\)\.read", r"."),
    ("WAL append (s2, commit, fsync)", r"wal\.\(\*writer\)|wal\.encodeEntries|wal\.sealEntry", r"."),
    ("forward decode and transcode", r"inputs/forward\.", r"."),
    ("HTTP input", r"inputs/httpin\.", r"."),
    ("drainer (queue)", r"forwarder/queue\.", r"."),
    ("GC (background)", r"runtime\.gcBgMarkWorker|runtime\.bgsweep|runtime\.bgscavenge", r"."),
]
OTHER = "other (runtime, admin, syscalls outside these)"


def samples(binary, prof):
    """Yields (values, stack) of each sample, values by sample type
    ("cpu/nanoseconds", "alloc_space/bytes", ...)."""
    out = subprocess.run(["go", "tool", "pprof", "-raw", binary, prof],
                         capture_output=True, text=True, check=True).stdout
    rows, locs, sec, cur, types = [], {}, None, None, []
    for line in out.splitlines():
        if line.startswith("Samples:"):
            sec = "h"
        elif sec == "h":
            types = [t.replace("[dflt]", "") for t in line.split()]
            sec = "s"
        elif line.startswith("Locations"):
            sec = "l"
        elif line.startswith("Mappings"):
            sec = None
        elif sec == "s":
            m = re.match(r"\s*([\d\s]+): (.*)", line)
            if m:
                rows.append((dict(zip(types, map(int, m.group(1).split()))), [int(x) for x in m.group(2).split()]))
        elif sec == "l":
            m = re.match(r"\s+(\d+): 0x[0-9a-f]+ M=\d+ (\S+)", line)
            if m:
                cur = int(m.group(1))
                locs[cur] = [m.group(2)]
            else:
                m = re.match(r"\s+(\S+) ", line)
                if m and cur in locs:
                    locs[cur].append(m.group(1))
    for values, stack in rows:
        yield values, " ".join(" ".join(locs.get(l, [])) for l in stack)


def stage(names):
    for name, where, what in STAGES:
        if re.search(where, names) and re.search(what, names):
            return name
    return OTHER


def main():
    binary, records, profs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tot, total = {}, {}
    for p in profs:
        for values, names in samples(binary, p):
            name = stage(names)
            for k, v in values.items():
                total[k] = total.get(k, 0) + v
                tot[(name, k)] = tot.get((name, k), 0) + v
    n, runs = records * len(profs), len(profs)
    order = [s[0] for s in STAGES] + [OTHER]
    if "cpu/nanoseconds" in total:
        k, t = "cpu/nanoseconds", total["cpu/nanoseconds"]
        print("| stage | CPU s | share | µs/record |")
        print("|---|---:|---:|---:|")
        for name in order:
            if v := tot.get((name, k), 0):
                print(f"| {name} | {v / 1e9 / runs:.2f} | {v / t * 100:.0f}% | {v / 1e3 / n:.2f} |")
        print(f"| total in the profiles | {t / 1e9 / runs:.2f} | 100% | {t / 1e3 / n:.2f} |")
    else:
        b, o = "alloc_space/bytes", "alloc_objects/count"
        print("| stage | MB allocated | share | bytes/record | objects/record |")
        print("|---|---:|---:|---:|---:|")
        for name in order:
            if v := tot.get((name, b), 0):
                print(f"| {name} | {v / 1e6 / runs:.1f} | {v / total[b] * 100:.0f}% | {v / n:.0f} | {tot.get((name, o), 0) / n:.3f} |")
        print(f"| total in the profiles | {total[b] / 1e6 / runs:.1f} | 100% | {total[b] / n:.0f} | {total[o] / n:.3f} |")


main()
