#!/usr/bin/env bash
# The S3 partitions figures of BENCHMARKS.md on the real binary: an aggregator with one tag
# per container. `loadgen forward` sends BENCH_TAGS (default 2000) tags at BENCH_RATE
# (default 20000) records/s for BENCH_SECONDS (default 60) to a forwarder with one S3 sink
# (key logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz, max_object_bytes 64MiB,
# max_object_age 5m, everything else at its default) pointed at `loadgen standin`; then
# waits until the sink's lag is 0 (the objects finish by age), and prints the objects, their
# average size, the early cuts, the forwarder's CPU per record and its peak RssAnon and
# staged bytes, over BENCH_CONNS (default 64) connections, 10 records a message.
# BENCH_FORWARDER runs another build of the forwarder (for a before and after). With
# BENCH_SINKS="s3 cloudwatch", a CloudWatch Logs sink too, one stream per tag
# (log_stream "${tag}", everything else at its default): PutLogEvents calls and events.
# BENCH_MISTAKE=1 runs the mistake instead: a CloudWatch sink alone whose stream renders a
# value per record (log_group "/x/${tag}", log_stream "${record.id}": as many partitions as
# records), max_partitions at its default; it prints how long after the load's end the sink
# had delivered everything, and the max_partitions warning.
# It needs three free ports: BENCH_FORWARD_PORT (default 25224, the forward input),
# BENCH_ADMIN_PORT (19880) and BENCH_STANDIN_PORT (4599).
set -euo pipefail

fport=${BENCH_FORWARD_PORT:-25224}
aport=${BENCH_ADMIN_PORT:-19880}
sport=${BENCH_STANDIN_PORT:-4599}

secs=${BENCH_SECONDS:-60}
tags=${BENCH_TAGS:-2000}
rate=${BENCH_RATE:-20000}
dir=${BENCH_DIR:-$(mktemp -d /tmp/forwarder-s3p.XXXXXX)}
mkdir -p "$dir"
root=$(cd "$(dirname "$0")/.." && pwd)

for port in $fport $aport $sport; do
	if ss -ltn "sport = :$port" | grep -q LISTEN; then
		echo "bench-s3-partitions: port $port is in use; stop what listens there first" >&2
		exit 1
	fi
done

(cd "$root" && go build -o "$dir/loadgen" ./cmd/loadgen)
fwd=${BENCH_FORWARDER:-}
if [ -z "$fwd" ]; then
	(cd "$root" && go build -o "$dir/forwarder" ./cmd/forwarder)
	fwd=$dir/forwarder
fi
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_EC2_METADATA_DISABLED=true

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

"$dir/loadgen" standin -listen 127.0.0.1:$sport >"$dir/standin.log" 2>&1 &
pids+=($!)

rm -rf "$dir/data"
cat >"$dir/s3p.yaml" <<EOF
data_dir: $dir/data
log: {level: info, format: text}
inputs:
  forward: {listen: "127.0.0.1:$fport"}
admin: {listen: "127.0.0.1:$aport"}
sinks:
EOF
nsinks=0
if [ -n "${BENCH_MISTAKE:-}" ]; then
	BENCH_SINKS=mistake
	nsinks=1
	cat >>"$dir/s3p.yaml" <<EOF
  - name: cloudwatch
    type: cloudwatch
    match: "**"
    region: us-east-1
    endpoint: "http://127.0.0.1:$sport"
    log_group: "/x/\${tag}"
    log_stream: "\${record.id}"
EOF
fi
if [[ " ${BENCH_SINKS:-s3} " == *" s3 "* ]]; then
	nsinks=$((nsinks + 1))
	cat >>"$dir/s3p.yaml" <<EOF
  - name: archive
    type: s3
    match: "**"
    bucket: bench
    region: us-east-1
    endpoint: "http://127.0.0.1:$sport"
    path_style: true
    key: "logs/\${tag}/%Y/%m/%d/%H/\${hostname}-\${seq}.json.gz"
    max_object_bytes: 64MiB
    max_object_age: 5m
EOF
fi
if [[ " ${BENCH_SINKS:-s3} " == *" cloudwatch "* ]]; then
	nsinks=$((nsinks + 1))
	cat >>"$dir/s3p.yaml" <<EOF
  - name: cloudwatch
    type: cloudwatch
    match: "**"
    region: us-east-1
    endpoint: "http://127.0.0.1:$sport"
    log_group: "/bench"
    log_stream: "\${tag}"
EOF
fi

"$fwd" run -c "$dir/s3p.yaml" 2>"$dir/forwarder.log" &
PID=$!
pids+=("$PID")
until curl -sf -o /dev/null http://127.0.0.1:$aport/readyz; do
	if ! kill -0 "$PID" 2>/dev/null; then
		echo "bench-s3-partitions: the forwarder exited; its log:" >&2
		cat "$dir/forwarder.log" >&2
		exit 1
	fi
	sleep 0.05
done

# Peak RssAnon (KiB) and staged bytes, every half second, while the forwarder runs.
(
	peak=0 staged=0
	while [ -r "/proc/$PID/status" ]; do
		v=$(awk '/^RssAnon/{print $2}' "/proc/$PID/status" 2>/dev/null || true)
		[ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v
		s=$(du -sb "$dir/data/s3-staging" 2>/dev/null | cut -f1 || true)
		[ -n "$s" ] && [ "$s" -gt "$staged" ] && staged=$s
		echo "$peak $staged" >"$dir/peak"
		sleep 0.5
	done
) &
pids+=($!)

metric() { curl -s http://127.0.0.1:$aport/metrics | awk -v m="$1" '$1 ~ "^"m"({|$)" {s+=$2} END {printf "%d", s}'; }
cpu() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
c0=$(cpu "$PID")
t0=$(date +%s)
"$dir/loadgen" forward -addr 127.0.0.1:$fport -conns "${BENCH_CONNS:-64}" -batch 10 -tags "$tags" -rate "$rate" -duration "${secs}s" -json >"$dir/load.json"
objects_during=$(metric forwarder_s3_objects_uploaded_total)
cuts_during=$(metric forwarder_sink_early_cuts_total)
c1=$(cpu "$PID")
tload=$(date +%s.%N)
echo "load done after $(($(date +%s) - t0)) s: $objects_during objects uploaded meanwhile, $cuts_during early cuts"
sent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["acked_records"])' "$dir/load.json")

until [ "$(metric forwarder_sink_lag_records)" = 0 ] && [ "$(metric forwarder_sink_delivered_records_total)" -ge $((sent * nsinks)) ]; do
	sleep 0.5
done
t1=$(date +%s)
echo "everything delivered $(python3 -c "import time; print(f'{time.time() - $tload:.1f}')") s after the load's end"
if [ -n "${BENCH_MISTAKE:-}" ]; then
	echo "admitted partitions $(metric forwarder_sink_admitted_partitions), overflow records $(metric forwarder_sink_overflow_records_total)"
	grep -m1 'more partitions than max_partitions' "$dir/forwarder.log" || echo "no max_partitions warning in the log"
fi
c2=$(cpu "$PID")
curl -s http://127.0.0.1:$sport/_standin/stats >"$dir/standin.json"
python3 - "$dir/load.json" "$dir/standin.json" "$dir/peak" "$c0" "$c1" "$c2" "$cuts_during" "$objects_during" "$(metric forwarder_sink_early_cuts_total)" "$(metric forwarder_s3_staging_full_total)" "$(metric forwarder_s3_uncompressed_bytes_total)" "$((t1 - t0))" <<'PY'
import json, sys
load, st = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
peak, staged = (int(x) for x in open(sys.argv[3]).read().split())
c0, c1, c2 = (float(x) for x in sys.argv[4:7])
cuts_during, objects_during, cuts, full, lines, took = (int(x) for x in sys.argv[7:13])
n, objs, body = load["acked_records"], st["objects"], st["body_bytes"]
print(f"records {n} ({load['records_per_sec']:.0f}/s); objects {objs} ({objects_during} during the load), "
      f"{n/max(objs,1):.0f} records and {body/max(objs,1)/1024:.1f} KiB ({lines/max(objs,1)/1024:.1f} KiB of lines) each on average")
print(f"early cuts {cuts} ({cuts_during} during the load); staging full {full}; peak staged {staged/2**20:.1f} MiB")
if st.get("put_log_events"):
    print(f"CloudWatch: {st['events']} events in {st['put_log_events']} PutLogEvents ({st['events']/st['put_log_events']:.0f} a call)")
print(f"forwarder CPU {c2-c0:.1f} s: {(c2-c0)/n*1e6:.1f} us/record ({(c1-c0)/n*1e6:.1f} during the load); "
      f"peak RssAnon {peak/1024:.1f} MiB; lag 0 after {took} s")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
