#!/usr/bin/env bash
# Catch-up after an outage, per sink, on the real binary (see BENCHMARKS.md):
# the sink's endpoint is down while loadgen sends BENCH_RECORDS (default 1,000,000)
# records of 250 bytes with acks over 4 forward connections, spread over 1 and 100
# tags (one S3 partition or CloudWatch stream each); then
#   catch-up: the endpoint (loadgen standin, which accepts everything at once) comes
#             up and the same process delivers the backlog;
#   restart:  the same load, the forwarder stopped, the endpoint up, a new process
#             started on the backlog.
# Each line: records delivered, seconds from the first delivery to the last one
# (S3: to the last object that was full, objects of 1 MiB with 100 tags; the last,
# partial ones wait max_object_age),
# the rate, the wait from the endpoint coming up to the first delivery (a retry
# interval of the sink, at most 30 s), forwarder CPU, peak RssAnon and the records
# read again from the WAL (forwarder_sink_reread_records_total). Default
# configuration but for the endpoints. With BENCH_CATCHUP_BACKLOG (e.g. 5GiB), also a
# backlog of that size behind both sinks, down for BENCH_OUTAGE seconds and then up:
# the catch-up's rate, the longest pause between two deliveries, and the longest
# but the one before the last delivery (the tail: a partial batch or object waiting its age). Needs ports
# 4599, 25224, 18080, 19880 (each plus BENCH_PORT_OFFSET, default 0), and about twice
# the backlog of disk in BENCH_DIR.
set -euo pipefail

records=${BENCH_RECORDS:-1000000}
dir=${BENCH_DIR:-$(mktemp -d /tmp/forwarder-catchup.XXXXXX)}
mkdir -p "$dir"
root=$(cd "$(dirname "$0")/.." && pwd)
off=${BENCH_PORT_OFFSET:-0}
standin_port=$((4599 + off)) forward_port=$((25224 + off)) http_port=$((18080 + off))
export BENCH_ADMIN=127.0.0.1:$((19880 + off)) BENCH_STANDIN=127.0.0.1:$standin_port
for port in $standin_port $forward_port $http_port ${BENCH_ADMIN#*:}; do
	if ss -ltn "sport = :$port" | grep -q LISTEN; then
		echo "bench-catchup: port $port is in use; stop what listens there first" >&2
		exit 1
	fi
done
(cd "$root" && go build -o "$dir/forwarder" ./cmd/forwarder && go build -o "$dir/loadgen" ./cmd/loadgen)
fwd=${BENCH_FORWARDER:-$dir/forwarder} # another build of the forwarder, to compare
loadgen=$dir/loadgen
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_EC2_METADATA_DISABLED=true
endpoint=http://$BENCH_STANDIN

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

# config FILE DATA_DIR SINK TAGS
config() {
	cat >"$1" <<YAML
data_dir: $2
log: {level: info, format: text}
wal: {max_bytes: 100GiB}
inputs:
  forward: {listen: "127.0.0.1:$forward_port"}
  http: {listen: "127.0.0.1:$http_port"}
admin: {listen: "$BENCH_ADMIN"}
sinks:
YAML
	if [ "$3" = s3 ]; then
		cat >>"$1" <<YAML
  - name: sink
    type: s3
    match: "**"
    bucket: bench
    region: us-east-1
    endpoint: "$endpoint"
    path_style: true
YAML
		# With 100 tags a tag's share of the records (about 3 MB of lines) fills no
		# object of the default 64 MiB, and the figure, up to the last full object,
		# would be 0: objects of 1 MiB then.
		if [ "${4:-1}" -gt 1 ]; then echo "    max_object_bytes: 1MiB" >>"$1"; fi
	else
		cat >>"$1" <<YAML
  - name: sink
    type: cloudwatch
    match: "**"
    region: us-east-1
    endpoint: "$endpoint"
    log_group: "/bench"
    log_stream: "\${tag}"
YAML
	fi
}

start_fwd() {
	"$fwd" run -c "$1" 2>>"$2" &
	PID=$!
	pids+=("$PID")
	until curl -sf -o /dev/null "http://$BENCH_ADMIN/readyz"; do
		kill -0 "$PID" 2>/dev/null || { echo "bench-catchup: the forwarder exited:" >&2; tail -20 "$2" >&2; exit 1; }
		sleep 0.01
	done
}

start_standin() {
	"$loadgen" standin -listen "$BENCH_STANDIN" >/dev/null &
	STANDIN=$!
	pids+=("$STANDIN")
	until curl -s -o /dev/null "$endpoint/_standin/stats"; do sleep 0.01; done
}

# watch PID FILE: the peak RssAnon (KiB) of PID, in FILE, until PID exits.
watch_rss() {
	(
		peak=0
		while [ -r "/proc/$1/status" ]; do
			v=$(awk '/^RssAnon/{print $2}' "/proc/$1/status" 2>/dev/null || true)
			if [ -n "$v" ] && [ "$v" -gt "$peak" ]; then peak=$v; echo "$peak" >"$2"; fi
			sleep 0.1
		done
	) &
}

cpu() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }

# measure T0_NS: waits until the sink has delivered every record or the stand-in has
# taken nothing for BENCH_QUIET seconds (default 5); prints "delivered first_s last_s": the records the forwarder
# counts delivered, and the stand-in's first and last delivery (seconds after T0_NS).
measure() {
	python3 - "$1" "$records" "${BENCH_QUIET:-5}" <<'PY'
import datetime, json, os, sys, time, urllib.request
t0 = int(sys.argv[1]) / 1e9
want = int(sys.argv[2])
quiet = float(sys.argv[3])
def get(url):
    return json.load(urllib.request.urlopen(url, timeout=5))
def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
n = 0
while True:
    try:
        n = [s for s in get("http://" + os.environ["BENCH_ADMIN"] + "/status")["sinks"] if s["sink"] == "sink"][0]["delivered_records"]
    except Exception:
        pass
    st = get("http://" + os.environ["BENCH_STANDIN"] + "/_standin/stats")
    now = time.time()
    last = ts(st["last"]) if st.get("last") else None
    if n >= want or (last is not None and now - last > quiet) or (last is None and now - t0 > 120):
        break
    time.sleep(0.1)
time.sleep(1.2)  # the forwarder's status is updated every second
n = [s for s in get("http://" + os.environ["BENCH_ADMIN"] + "/status")["sinks"] if s["sink"] == "sink"][0]["delivered_records"]
first = ts(st["first"]) - t0 if st.get("first") else 0
print(n, first, (last - t0) if last else 0)
PY
}

report() { # LABEL DELIVERED FIRST LAST CPU PEAK_KIB REREAD
	python3 - "$@" <<'PY'
import sys
label, n, first, last, cpu, peak, reread = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
span = max(last - first, 1e-3)
print(f"{label:<30} {n:>9,} records in {span:6.2f} s: {n/span:>9,.0f} records/s; first delivery after {first:5.2f} s; "
      f"fwd CPU {cpu:5.1f} s ({cpu/max(n,1)*1e6:4.1f} us/record), peak RssAnon {peak/1024:5.1f} MiB, read again {reread:,.0f}")
PY
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
conns=4
msgs=$((records / conns / 1000))
for sink in ${BENCH_SINKS-s3 cloudwatch}; do
	for tags in ${BENCH_TAGS-1 100}; do
		for mode in catch-up restart; do
			data=$dir/data-$sink-$tags-$mode
			rm -rf "$data"
			config "$dir/c.yaml" "$data" "$sink" "$tags"
			log=$dir/$sink-$tags-$mode.log
			: >"$log"
			start_fwd "$dir/c.yaml" "$log"
			"$loadgen" forward -addr "127.0.0.1:$forward_port" -conns "$conns" -batch 1000 -size 250 -messages "$msgs" -duration 0 \
				-tag pod.bench -tags "$tags" -json >/dev/null
			if [ "$mode" = restart ]; then
				kill -TERM "$PID"; wait "$PID" || true
				start_standin
				t0=$(date +%s%N)
				start_fwd "$dir/c.yaml" "$log"
				c0=0
			else
				sleep 2 # the sink retries against a closed port
				start_standin
				t0=$(date +%s%N)
				c0=$(cpu "$PID")
			fi
			watch_rss "$PID" "$dir/peak"
			read -r n first last < <(measure "$t0")
			c=$(python3 -c "print($(cpu "$PID") - $c0)")
			reread=$(curl -s "http://$BENCH_ADMIN/metrics" | awk '/^forwarder_sink_reread_records_total/{print $2}')
			report "$sink, $tags tag(s), $mode" "$n" "$first" "$last" "$c" "$(cat "$dir/peak")" "${reread:-0}"
			kill -TERM "$PID"; wait "$PID" || true
			kill "$STANDIN"; wait "$STANDIN" 2>/dev/null || true
			rm -rf "$data"
		done
	done
done
if [ -n "${BENCH_CATCHUP_BACKLOG:-}" ]; then
	# A backlog written while the forwarder was stopped (loadgen backlog), then both
	# sinks' endpoint down for BENCH_OUTAGE seconds (default 60: the sinks retry, read
	# the backlog through and spill it), then up.
	echo "== backlog of $BENCH_CATCHUP_BACKLOG, both sinks down ${BENCH_OUTAGE:-60} s, then up"
	data=$dir/long
	rm -rf "$data"
	"$loadgen" backlog -data "$data" -bytes "$BENCH_CATCHUP_BACKLOG"
	config "$dir/long.yaml" "$data" s3
	cat >>"$dir/long.yaml" <<YAML
  - name: cloudwatch
    type: cloudwatch
    match: "**"
    region: us-east-1
    endpoint: "$endpoint"
    log_group: "/bench"
    log_stream: "\${tag}"
YAML
	start_fwd "$dir/long.yaml" "$dir/long.log"
	watch_rss "$PID" "$dir/peak"
	sleep "${BENCH_OUTAGE:-60}"
	start_standin
	t0=$(date +%s%N)
	c0=$(cpu "$PID")
	python3 - "$t0" <<'PY'
import datetime, json, os, sys, time, urllib.request
t0 = int(sys.argv[1]) / 1e9
def get(url):
    return json.load(urllib.request.urlopen(url, timeout=5))
def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
while True:
    st = get("http://" + os.environ["BENCH_STANDIN"] + "/_standin/stats")
    sinks = {s["sink"]: s for s in get("http://" + os.environ["BENCH_ADMIN"] + "/status")["sinks"]}
    now = time.time()
    last = ts(st["last"]) if st.get("last") else None
    if sinks["cloudwatch"]["lag_records"] == 0 and last is not None and now - last > 5 or last is None and now - t0 > 120:
        break
    time.sleep(0.5)
time.sleep(1.2)
sinks = {s["sink"]: s for s in get("http://" + os.environ["BENCH_ADMIN"] + "/status")["sinks"]}
for name, s in sorted(sinks.items()):
    print(f"{name}: {s['delivered_records']:,} records delivered, {s['lag_records']:,} waiting")
span = ts(st["last"]) - ts(st["first"])
n = sum(s["delivered_records"] for s in sinks.values())
print(f"first delivery {ts(st['first']) - t0:.2f} s after the endpoint came up; last {ts(st['last']) - t0:.2f} s; "
      f"{n / max(span, 1e-3):,.0f} records/s for both sinks")
for kind, what in (("logs", "PutLogEvents"), ("objects", "objects")):
    if st.get(f"gap_{kind}_end"):
        print(f"longest pause between two {what}: {st[f'max_gap_{kind}_ms'] / 1000:.2f} s, ended {ts(st[f'gap_{kind}_end']) - t0:.2f} s after the endpoint came up")
    if st.get(f"earlier_gap_{kind}_end"):
        print(f"  longest pause before the last of the {what} (not the tail): {st[f'max_earlier_gap_{kind}_ms'] / 1000:.2f} s, "
              f"ended {ts(st[f'earlier_gap_{kind}_end']) - t0:.2f} s after the endpoint came up")
PY
	echo "forwarder CPU $(python3 -c "print(round($(cpu "$PID") - $c0, 1))") s during the catch-up, peak RssAnon $(($(cat "$dir/peak") / 1024)) MiB"
	kill -TERM "$PID"; wait "$PID" || true
	rm -rf "$data"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
