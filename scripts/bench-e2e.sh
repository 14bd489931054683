#!/usr/bin/env bash
# The end-to-end figures of BENCHMARKS.md on the real binary, driven by cmd/loadgen:
#   1. ingest: forward with acks (1 and 8 connections) and HTTP (8 clients), both sinks
#      pointed at a refused endpoint, so that only ingest runs; records/s, MB/s, ack
#      latency, peak RssAnon, forwarder CPU per record, WAL bytes per record;
#   2. a backlog of BENCH_BACKLOG (default 1GiB; BENCHMARKS.md used 5GiB) written with
#      `loadgen backlog`: time from start to /readyz 200, then 30 s of forward ingest on
#      top of it, peak RssAnon;
#   3. a drain of 2,130,000 records (140 MiB of WAL) to both sinks, against the emulators
#      of a `forwarder dev` in another process: time until each sink's lag is 0, peak RssAnon;
#   4. both: BENCH_RECORDS (default 1,000,000) records of 250 bytes sent with acks over 4
#      forward connections while both sinks deliver to `loadgen standin` (an endpoint that
#      accepts everything at once): time from the first record sent to the last delivery
#      of the later sink, records/s, forwarder CPU-seconds and us per record, peak RssAnon.
# BENCH_FORWARDER runs another build of the forwarder. BENCH_PARTS picks the parts (default "ingest backlog drain both"); BENCH_REPEAT runs each
# ingest and both run that many times (default 1) and prints the median's line last;
# BENCH_PPROF=DIR turns admin.pprof on and saves a CPU profile of each run (its first
# BENCH_PPROF_SECONDS, default 4) and of what it allocated in DIR; the "both" part then
# prints CPU and allocations per record by stage (scripts/pprof-stages.py). BENCH_WAL_SYNC
# sets wal.sync (default always). It needs the ports of `forwarder dev` (24224,
# 8080, 9880, 4566, 4567) and 25224, 18080, 19880, 4599 free, and about three times
# BENCH_BACKLOG of disk in BENCH_DIR (default a new directory under /tmp). Run it on an
# otherwise idle machine: the figures depend on it; `cat /proc/loadavg` is printed with
# every figure.
set -euo pipefail

secs=${BENCH_SECONDS:-20}
parts=" ${BENCH_PARTS:-ingest backlog drain both} "
repeat=${BENCH_REPEAT:-1}
records=${BENCH_RECORDS:-1000000}
pprof=${BENCH_PPROF:-}
pprof_secs=${BENCH_PPROF_SECONDS:-4}
pprof_on=false
if [ -n "$pprof" ]; then pprof_on=true; fi
backlog=${BENCH_BACKLOG:-1GiB}
walsync=${BENCH_WAL_SYNC:-always}
dir=${BENCH_DIR:-$(mktemp -d /tmp/forwarder-bench.XXXXXX)}
mkdir -p "$dir"
root=$(cd "$(dirname "$0")/.." && pwd)

for port in 24224 8080 9880 4566 4567 25224 18080 19880 4599; do
	if ss -ltn "sport = :$port" | grep -q LISTEN; then
		echo "bench-e2e: port $port is in use; stop what listens there first" >&2
		exit 1
	fi
done

echo "building into $dir"
(cd "$root" && go build -o "$dir/forwarder" ./cmd/forwarder && go build -o "$dir/loadgen" ./cmd/loadgen)
fwd=${BENCH_FORWARDER:-$dir/forwarder} # another build of the forwarder, to compare
loadgen=$dir/loadgen
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_EC2_METADATA_DISABLED=true

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

# config FILE DATA_DIR S3_ENDPOINT CW_ENDPOINT [MAX_OBJECT_AGE]
config() {
	cat >"$1" <<EOF
data_dir: $2
log: {level: info, format: text}
wal: {max_bytes: 100GiB, sync: $walsync}
inputs:
  forward: {listen: "127.0.0.1:25224"}
  http: {listen: "127.0.0.1:18080"}
admin: {listen: "127.0.0.1:19880", pprof: $pprof_on}
sinks:
  - name: archive
    type: s3
    match: "**"
    bucket: forwarder-dev
    region: us-east-1
    endpoint: "$3"
    path_style: true
    max_object_age: ${5:-10s}  # the last, partial object of a drain waits this long, not 5m
  - name: cloudwatch
    type: cloudwatch
    match: "pod.**"
    region: us-east-1
    endpoint: "$4"
    log_group: "/eks/\${record.kubernetes.namespace_name|default}"
    log_stream: "\${record.kubernetes.pod_name|unknown}-\${hostname}"
EOF
}

# start CONFIG LOG: starts the forwarder, waits for /readyz 200, sets PID and READY_MS.
start() {
	local t0
	t0=$(date +%s%N)
	"$fwd" run -c "$1" 2>"$2" &
	PID=$!
	pids+=("$PID")
	until curl -sf -o /dev/null http://127.0.0.1:19880/readyz; do
		if ! kill -0 "$PID" 2>/dev/null; then
			echo "bench-e2e: the forwarder exited; its log:" >&2
			tail -20 "$2" >&2
			exit 1
		fi
		sleep 0.005
	done
	READY_MS=$((($(date +%s%N) - t0) / 1000000))
}

# watch PID FILE: writes the peak RssAnon (KiB) of PID to FILE until PID exits.
watch() {
	(
		peak=0
		while [ -r "/proc/$1/status" ]; do
			v=$(awk '/^RssAnon/{print $2}' "/proc/$1/status" 2>/dev/null || true)
			if [ -n "$v" ] && [ "$v" -gt "$peak" ]; then
				peak=$v
				echo "$peak" >"$2"
			fi
			sleep 0.1
		done
	) &
}

# profile NAME: in the background, a CPU profile of the forwarder's first
# BENCH_PPROF_SECONDS into BENCH_PPROF/NAME.pprof (when BENCH_PPROF is set);
# profiled waits for it (call it before stopping the forwarder).
PROF=
PROF_NAME=
profile() {
	[ -n "$pprof" ] || return 0
	mkdir -p "$pprof"
	curl -s -o "$pprof/$1.pprof" "http://127.0.0.1:19880/debug/pprof/profile?seconds=$pprof_secs" &
	PROF=$!
	PROF_NAME=$1
}
# profiled also saves what the run allocated (BENCH_PPROF/NAME.allocs).
profiled() {
	if [ -n "$PROF" ]; then
		wait "$PROF" || true
		curl -s -o "$pprof/$PROF_NAME.allocs" http://127.0.0.1:19880/debug/pprof/allocs
	fi
	PROF=
}

# median FILE: the line of FILE (one run a line, the sort key first) in the middle.
median() { sort -g "$1" | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}' | cut -d' ' -f2-; }

cpu() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }

stop() {
	kill -TERM "$1"
	wait "$1" || true
}

# result LABEL JSON CPU_S PEAK_KIB: one line of the summary.
result() {
	python3 - "$@" <<'EOF'
import json, sys
label, js, cpu, peak = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
n = js["acked_records"]
print(f"{label:<34} {js['records_per_sec']:>10,.0f} rec/s {js['mb_per_sec']:>7.1f} MB/s  p50 {js['p50_ms']:>6.1f} ms  p99 {js['p99_ms']:>6.1f} ms  "
      f"peak RssAnon {peak/1024:>6.1f} MiB  fwd CPU {cpu/max(n,1)*1e6:>4.1f} us/record")
EOF
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
refused=http://127.0.0.1:1

if [[ $parts == *" ingest "* ]]; then
echo "== ingest, both sinks refused, ${secs} s a run, batches of 1,000 records of 250 bytes"
for run in "forward 1" "forward 4" "forward 8" "http 8"; do
	set -- $run
	: >"$dir/runs"
	for i in $(seq "$repeat"); do
	rm -rf "$dir/ingest"
	config "$dir/ingest.yaml" "$dir/ingest" "$refused" "$refused"
	start "$dir/ingest.yaml" "$dir/ingest.log"
	watch "$PID" "$dir/peak"
	c0=$(cpu "$PID")
	profile "ingest-$1-$2-$i"
	if [ "$1" = forward ]; then
		js=$("$loadgen" forward -addr 127.0.0.1:25224 -conns "$2" -batch 1000 -size 250 -duration "${secs}s" -json)
	else
		js=$("$loadgen" http -url http://127.0.0.1:18080/v1/logs/pod.shop -clients "$2" -batch 1000 -size 250 -duration "${secs}s" -json)
	fi
	c=$(python3 -c "print($(cpu "$PID") - $c0)")
	profiled
	stop "$PID"
	line=$(result "$1, $2 connection(s)" "$js" "$c" "$(cat "$dir/peak")")
	echo "$line  load $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "$(echo "$js" | python3 -c 'import json,sys; print(json.load(sys.stdin)["records_per_sec"])') $line  load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$dir/runs"
	"$fwd" wal stats --json -c "$dir/ingest.yaml" | python3 -c '
import json, sys
s = json.load(sys.stdin)
n = max(s["records"], 1)
print("%-34s WAL: %.1f file bytes and %.1f live bytes per record" % ("", s["file_bytes"] / n, s["live_bytes"] / n))'
	done
	if [ "$repeat" -gt 1 ]; then echo "median of $repeat: $(median "$dir/runs")"; fi
done
fi

if [[ $parts == *" backlog "* ]]; then
echo "== backlog of $backlog (loadgen backlog), both sinks refused"
rm -rf "$dir/backlog"
"$loadgen" backlog -data "$dir/backlog" -bytes "$backlog"
config "$dir/backlog.yaml" "$dir/backlog" "$refused" "$refused"
start "$dir/backlog.yaml" "$dir/backlog.log"
echo "start to /readyz 200: ${READY_MS} ms (page cache warm)"
watch "$PID" "$dir/peak"
js=$("$loadgen" forward -addr 127.0.0.1:25224 -conns 8 -batch 1000 -size 250 -duration 30s -json)
c=$(cpu "$PID")
stop "$PID"
result "forward, 8 conns, on the backlog" "$js" "$c" "$(cat "$dir/peak")"
rm -rf "$dir/backlog"
fi

if [[ $parts == *" drain "* ]]; then
echo "== drain of 2,130,000 records to both sinks (emulators of forwarder dev in another process)"
mkdir -p "$dir/emu"
(cd "$dir/emu" && exec "$fwd" dev --reset >"$dir/emu.log" 2>&1) &
dev=$!
pids+=("$dev")
until curl -s -o /dev/null http://127.0.0.1:4567/ 2>/dev/null && curl -s -o /dev/null http://127.0.0.1:4566/ 2>/dev/null; do sleep 0.1; done
rm -rf "$dir/drain"
"$loadgen" backlog -data "$dir/drain" -bytes 140MiB
config "$dir/drain.yaml" "$dir/drain" http://127.0.0.1:4566 http://127.0.0.1:4567
t0=$(date +%s%N)
start "$dir/drain.yaml" "$dir/drain.log"
watch "$PID" "$dir/peak"
declare -A drained=()
while [ "${#drained[@]}" -lt 2 ]; do
	st=$(curl -s http://127.0.0.1:19880/status || true)
	for s in archive cloudwatch; do
		lag=$(echo "$st" | python3 -c "import json,sys; print([k for k in json.load(sys.stdin)['sinks'] if k['sink']=='$s'][0]['lag_records'])" 2>/dev/null || true)
		if [ "$lag" = 0 ] && [ -z "${drained[$s]:-}" ]; then
			drained[$s]=$((($(date +%s%N) - t0) / 1000000))
			echo "$s drained after ${drained[$s]} ms"
		fi
	done
	sleep 0.2
done
c=$(cpu "$PID")
stop "$PID"
echo "forwarder CPU ${c} s, peak RssAnon $(($(cat "$dir/peak") / 1024)) MiB"
kill "$dev" 2>/dev/null || true # the emulators' forwarder dev
fi

if [[ $parts == *" both "* ]]; then
echo "== both: $records records of 250 bytes, 4 forward connections with acks, both sinks to loadgen standin"
"$loadgen" standin -listen 127.0.0.1:4599 >/dev/null &
standin=$!
pids+=("$standin")
until curl -s -o /dev/null http://127.0.0.1:4599/_standin/stats; do sleep 0.01; done
: >"$dir/runs"
for i in $(seq "$repeat"); do
	rm -rf "$dir/both"
	# max_object_age and flush_interval 1s: the last, partial S3 object and PutLogEvents
	# batches of the run wait at most that long.
	config "$dir/both.yaml" "$dir/both" http://127.0.0.1:4599 http://127.0.0.1:4599 1s
	echo "    flush_interval: 1s" >>"$dir/both.yaml"
	start "$dir/both.yaml" "$dir/both.log"
	watch "$PID" "$dir/peak"
	c0=$(cpu "$PID")
	profile "both-$i"
	t0=$(date +%s%N)
	"$loadgen" forward -addr 127.0.0.1:25224 -conns 4 -batch 1000 -size 250 -messages $((records / 4000)) -duration 0 -json >"$dir/both.json"
	# Until both sinks count every record delivered; the end is the stand-in's last delivery.
	line=$(python3 - "$t0" "$((records / 4000 * 4000))" <<'PY'
import datetime, json, sys, time, urllib.request
t0, want = int(sys.argv[1]) / 1e9, int(sys.argv[2])
def get(url):
    return urllib.request.urlopen(url, timeout=5).read().decode()
deadline = time.time() + 300
done = {}
while time.time() < deadline:
    got = {}
    for l in get("http://127.0.0.1:19880/metrics").splitlines():
        if l.startswith("forwarder_sink_delivered_records_total{"):
            got[l.split('sink="')[1].split('"')[0]] = float(l.split()[-1])
    for k in ("archive", "cloudwatch"):
        if got.get(k, 0) >= want and k not in done:
            done[k] = time.time() - t0
    if len(done) == 2:
        break
    time.sleep(0.05)
st = json.loads(get("http://127.0.0.1:4599/_standin/stats"))
last = datetime.datetime.fromisoformat(st["last"].replace("Z", "+00:00")).timestamp()
print(f"{last - t0:.3f} {int(min(got.get('archive', 0), got.get('cloudwatch', 0)))} {done.get('archive', 0):.1f} {done.get('cloudwatch', 0):.1f}")
PY
)
	read -r span n s3done cwdone <<<"$line"
	c=$(python3 -c "print($(cpu "$PID") - $c0)")
	metrics=$(curl -s http://127.0.0.1:19880/metrics)
	commits=$(awk '/^forwarder_wal_commits_total /{print $2}' <<<"$metrics")
	commitsecs=$(awk '/^forwarder_wal_commit_seconds_total /{print $2}' <<<"$metrics")
	memreads=$(awk '/^forwarder_wal_reads_total\{from="memory"\}/{print $2}' <<<"$metrics")
	filereads=$(awk '/^forwarder_wal_reads_total\{from="file"\}/{print $2}' <<<"$metrics")
	wrote=$(awk '/^write_bytes:/{print $2}' "/proc/$PID/io" 2>/dev/null || echo 0)
	profiled
	stop "$PID"
	peak=$(cat "$dir/peak")
	line=$(python3 -c "
span, n, c, peak, commits, csecs, wrote, mem, file = $span, $n, $c, $peak, ${commits:-0}, ${commitsecs:-0}, ${wrote:-0}, ${memreads:-0}, ${filereads:-0}
print(f'{n:,} records in both sinks in {span:.2f} s: {n/span:,.0f} records/s; fwd CPU {c:.2f} s ({c/max(n,1)*1e6:.2f} us/record), peak RssAnon {peak/1024:.1f} MiB; S3 done by {$s3done} s, CloudWatch by {$cwdone} s; {commits:,.0f} WAL commits ({csecs:.2f} s committing), {wrote/2**20:,.0f} MiB written; WAL reads {mem:,.0f} from memory, {file:,.0f} from the file')")
	echo "$line  load $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "$span $line  load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$dir/runs"
done
if [ "$repeat" -gt 1 ]; then echo "median of $repeat: $(median "$dir/runs")"; fi
if [ -n "$pprof" ]; then
	# CPU per record by stage (of the profiles' first BENCH_PPROF_SECONDS), and what
	# each stage allocated per record over the whole run (the process started for it).
	echo "CPU by stage, mean of the $repeat profiled run(s):"
	python3 "$root/scripts/pprof-stages.py" "$fwd" "$records" "$pprof"/both-*.pprof
	echo "allocations by stage:"
	python3 "$root/scripts/pprof-stages.py" "$fwd" "$records" "$pprof"/both-*.allocs
fi
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
