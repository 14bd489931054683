package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/logfwd/forwarder/emulator/cloudwatchlogs"
	"github.com/logfwd/forwarder/wal"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The whole path in the real binary: records POSTed to the HTTP input reach
// CloudWatch Logs (the local emulator) in streams named from the records.
func TestRunDeliversHTTPToCloudWatch(t *testing.T) {
	t.Parallel()
	emu := cloudwatchlogs.New(cloudwatchlogs.Options{})
	url, err := emu.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	httpAddr, adminAddr := freePort(t), freePort(t)
	cfg := fmt.Sprintf(`admin: {listen: %q}
inputs:
  http: {listen: %q}
sinks:
  - name: cw
    type: cloudwatch
    match: "pod.**"
    region: us-east-1
    endpoint: %q
    log_group: "/eks/${record.kubernetes.namespace_name}"
    log_stream: "${record.kubernetes.pod_name}"
    flush_interval: 50ms
`, adminAddr, httpAddr, url)
	path, dataDir := writeConfig(t, shortShutdownYAML, cfg)
	s := startService(t, path, "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_EC2_METADATA_DISABLED=true")
	s.waitFor("msg=started", filepath.Join(dataDir, wal.FileName))
	var body strings.Builder
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&body, `{"log":"line %d","kubernetes":{"namespace_name":"shop","pod_name":"web-%d"}}`+"\n", i, i%2)
	}
	res, err := http.Post("http://"+httpAddr+"/v1/logs/pod.shop", "application/x-ndjson", strings.NewReader(body.String()))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST: %s", res.Status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(emu.Events("/eks/shop", "web-0"))+len(emu.Events("/eks/shop", "web-1")) < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("events: %+v; stderr:\n%s", emu.Groups(), s.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The admin server tells the same story.
	get := func(p string) (int, string) {
		res, err := http.Get("http://" + adminAddr + p)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, metrics := get("/metrics")
		if strings.Contains(metrics, `forwarder_input_records_total{input="http"} 20`) &&
			strings.Contains(metrics, `forwarder_sink_delivered_records_total{sink="cw"} 20`) &&
			strings.Contains(metrics, "forwarder_wal_commits_total") &&
			strings.Contains(metrics, `forwarder_input_unrouted_records_total{input="http"} 0`) &&
			strings.Contains(metrics, `forwarder_build_info{goversion="go`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks the counts:\n%s", metrics)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var st struct {
		WAL struct {
			NextSeq uint64 `json:"next_seq"`
		} `json:"wal"`
		Sinks []struct {
			Sink      string `json:"sink"`
			Delivered uint64 `json:"delivered_records"`
		} `json:"sinks"`
	}
	_, status := get("/status")
	// The WAL was new: its numbers began at the first_seq the start logged.
	var first uint64
	if m := regexp.MustCompile(`msg="wal opened" .* first_seq=([0-9]+)`).FindStringSubmatch(s.stderr.String()); m != nil {
		first, _ = strconv.ParseUint(m[1], 10, 64)
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil || first < 2 || st.WAL.NextSeq != first+20 || len(st.Sinks) != 1 || st.Sinks[0].Sink != "cw" {
		t.Errorf("/status: %v %s", err, status)
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(10 * time.Second); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, s.stderr.String())
	}
	if n := len(emu.Events("/eks/shop", "web-0")); n != 10 {
		t.Fatalf("web-0 has %d events", n)
	}
}
