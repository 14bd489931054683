package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/wal"
)

func TestBacklogFillsTheWAL(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"backlog", "-data", dir, "-bytes", "2MiB", "-tag", "pod.x"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	w, err := wal.Open(dir, wal.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	st := w.Stats()
	if st.FileBytes < 2<<20 || st.Records == 0 || st.Records%10000 != 0 {
		t.Fatalf("WAL after the fill: %+v", st)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("appended %d records", st.Records)) {
		t.Errorf("report %q does not give the %d records in the WAL", out.String(), st.Records)
	}
	recs, err := w.Read(st.FirstSeq, 10000, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		var v struct {
			ID         string `json:"id"`
			Kubernetes struct {
				Pod string `json:"pod_name"`
			} `json:"kubernetes"`
		}
		if err := json.Unmarshal(r.Body, &v); err != nil {
			t.Fatalf("record %d: %v: %s", r.Seq, err, r.Body)
		}
		if want := fmt.Sprintf("backlog-0-%d", i); v.ID != want || v.Kubernetes.Pod == "" || r.Tag != "pod.x" {
			t.Fatalf("record %d: id %q (want %q), pod %q, tag %q", r.Seq, v.ID, want, v.Kubernetes.Pod, r.Tag)
		}
	}
	if code := run(context.Background(), []string{"backlog", "-data", dir}, &out, &errb); code != 2 {
		t.Errorf("without -bytes: exit %d, want 2", code)
	}
}
