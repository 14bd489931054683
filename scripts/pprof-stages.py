#!/usr/bin/env python3
"""CPU per record by stage, from CPU profiles of the forwarder (BENCHMARKS.md).

    scripts/pprof-stages.py BINARY RECORDS PROFILE...

Each sample goes to the first stage below whose pattern matches a frame of its
stack (go tool pprof -raw); RECORDS is the records of one profiled run, and the
figures are the mean over the profiles.
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
    ("S3 lines, gzip and upload", r"sinks/s3sink\.", r"."),
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
    out = subprocess.run(["go", "tool", "pprof", "-raw", binary, prof],
                         capture_output=True, text=True, check=True).stdout
    rows, locs, sec, cur = [], {}, None, None
    for line in out.splitlines():
        if line.startswith("Samples:"):
            sec = "s"
        elif line.startswith("Locations"):
            sec = "l"
        elif line.startswith("Mappings"):
            sec = None
        elif sec == "s":
            m = re.match(r"\s+\d+\s+(\d+): (.*)", line)
            if m:
                rows.append((int(m.group(1)), [int(x) for x in m.group(2).split()]))
        elif sec == "l":
            m = re.match(r"\s+(\d+): 0x[0-9a-f]+ M=\d+ (\S+)", line)
            if m:
                cur = int(m.group(1))
                locs[cur] = [m.group(2)]
            else:
                m = re.match(r"\s+(\S+) ", line)
                if m and cur in locs:
                    locs[cur].append(m.group(1))
    for ns, stack in rows:
        yield ns, " ".join(" ".join(locs.get(l, [])) for l in stack)


def main():
    binary, records, profs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tot, total = {}, 0
    for p in profs:
        for ns, names in samples(binary, p):
            total += ns
            for name, where, what in STAGES:
                if re.search(where, names) and re.search(what, names):
                    break
            else:
                name = OTHER
            tot[name] = tot.get(name, 0) + ns
    n = records * len(profs)
    print("| stage | CPU s | share | µs/record |")
    print("|---|---:|---:|---:|")
    for name in [s[0] for s in STAGES] + [OTHER]:
        v = tot.get(name, 0)
        if v:
            print(f"| {name} | {v / 1e9 / len(profs):.2f} | {v / total * 100:.0f}% | {v / 1e3 / n:.2f} |")
    print(f"| total in the profiles | {total / 1e9 / len(profs):.2f} | 100% | {total / 1e3 / n:.2f} |")


main()
