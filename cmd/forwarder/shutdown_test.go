package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

// The report at stop counts the records that wal.sync: interval has
// acknowledged but not committed yet: the WAL's close commits them, and
// the sink has not delivered them.
func TestLeftoverReportCountsUncommittedRecords(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.Options{Sync: wal.SyncInterval, SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.RegisterCursor(context.Background(), "archive"); err != nil {
		t.Fatal(err)
	}
	recs := make([]wal.Record, 25)
	for i := range recs {
		recs[i] = wal.Record{Time: time.Now().UnixNano(), Tag: "app", Body: []byte(`{"log":"x"}`)}
	}
	if _, err := w.Append(context.Background(), recs, wal.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if w.Stats().Records != 0 {
		t.Fatal("the records are committed already: the test measures nothing")
	}
	var logs syncbuf.Buffer
	cfg := &config.Config{Sinks: []config.Sink{{Name: "archive", Type: config.SinkS3}}}
	a := leftoverActor(w, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := a.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "records left in the WAL for the sink") || !strings.Contains(out, "records=25") {
		t.Fatalf("report at stop:\n%s\nwant the 25 records acknowledged and not delivered", out)
	}
}
