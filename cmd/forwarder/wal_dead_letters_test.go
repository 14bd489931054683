package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/queue"
	"github.com/logfwd/forwarder/sinks"
	"github.com/logfwd/forwarder/wal"
)

// refusingSink refuses every record for good, as a destination does with
// events that are too old.
type refusingSink struct{}

func (refusingSink) Limits() sinks.Limits {
	return sinks.Limits{MaxRecords: 10, MaxBytes: 1 << 20, MaxAge: time.Millisecond, Concurrency: 1}
}
func (refusingSink) Partition(r *sinks.Record) string { return r.Tag }
func (refusingSink) Size(r *sinks.Record) int         { return len(r.Body) }
func (refusingSink) Send(context.Context, *sinks.Batch) (sinks.Outcome, error) {
	return sinks.Outcome{}, sinks.NewRecordPermanent("too_old", nil)
}

func TestWALDeadLetters(t *testing.T) {
	t.Parallel()
	path, dataDir := writeConfig(t, inputsYAML, adminYAML, sinkYAML)
	fillWAL(t, dataDir)
	// A real drainer dead-letters the records.
	w, err := wal.Open(dataDir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := queue.New(w, "archive", refusingSink{}, queue.Options{})
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	last := w.Stats().NextSeq - 1
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if pos, _ := w.Cursor("archive"); pos == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drainer did not dead-letter the records")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	r := forwarderCmd(t, "wal", "dead-letters", "-c", path)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != exitOK || len(lines) != len(testRecords) || !strings.Contains(r.stderr, "3 dead letters") {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	for i, l := range lines {
		var got struct {
			Sink   string          `json:"sink"`
			Seq    uint64          `json:"seq"`
			Tag    string          `json:"tag"`
			Reason string          `json:"reason"`
			Body   json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		rec := testRecords[i]
		if got.Sink != "archive" || got.Seq != uint64(i+1) || got.Tag != rec.Tag || got.Reason != "too_old" || len(got.Body) == 0 {
			t.Errorf("line %d: %+v, record %+v", i, got, rec)
		}
	}
	if r := forwarderCmd(t, "wal", "dead-letters", "--sink", "nope", "-c", path); r.code != exitFail || !strings.Contains(r.stderr, `has no sink "nope"`) {
		t.Errorf("unknown sink: exit %d, stderr %q", r.code, r.stderr)
	}

	// A dead letter whose bytes do not decode (damaged in the file) is
	// left out and said; the others are listed.
	w, err = wal.Open(dataDir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b wal.Batch
	b.Put("archive", []byte("d/\x00\x00\x00\x00\x00\x00\x00\x02"), []byte(`{"seq":2,"tag":"x","dead_lett\xffred_at":`))
	if err := w.Commit(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r = forwarderCmd(t, "wal", "dead-letters", "-c", path)
	lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != exitFail || len(lines) != len(testRecords)-1 || !strings.Contains(r.stderr, `1 dead letter of sink "archive" is damaged and was left out (the first of record 2: `) ||
		!strings.Contains(r.stderr, "2 dead letters") {
		t.Errorf("a damaged dead letter: exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
}
