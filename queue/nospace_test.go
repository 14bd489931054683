package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/logfwd/forwarder/internal/syncbuf"
	"github.com/logfwd/forwarder/wal"
)

// A damaged entry whose replacement a full disk refuses is tried again
// after a pause (the read is made again, and meets the damage again),
// not given up for good, which failed the sink and stopped the service;
// once it is replaced, the same entry is not replaced twice.
func TestRepairWaitsOutAFullDisk(t *testing.T) {
	damage := fmt.Errorf("read: %w", &wal.CorruptionError{FirstSeq: 201, LastSeq: 300, Err: errors.New("checksum mismatch")})
	calls := 0
	replace := func(_ context.Context, seq uint64) (uint64, error) {
		calls++
		if seq != 201 {
			t.Errorf("replaced entry %d, want 201", seq)
		}
		if calls < 3 {
			return 0, fmt.Errorf("commit: %w", wal.ErrNoSpace)
		}
		return 300, nil
	}
	var repaired uint64
	for i := range 3 {
		if !repairWith(context.Background(), replace, damage, &repaired, time.Millisecond) {
			t.Fatalf("try %d: not to be read again", i+1)
		}
	}
	if calls != 3 || repaired != 201 {
		t.Fatalf("%d tries, repaired %d; want 3 and 201", calls, repaired)
	}
	if repairWith(context.Background(), replace, damage, &repaired, time.Millisecond) || calls != 3 {
		t.Errorf("the same entry replaced again (%d tries)", calls)
	}
	// Without a wait (a read with no context to end it), a full disk is
	// returned as it is; so is the end of the reader's context.
	repaired, calls = 0, 0
	if repairWith(context.Background(), replace, damage, &repaired, 0) {
		t.Error("without a wait: to be read again")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	repaired, calls = 0, 0
	if repairWith(ctx, replace, damage, &repaired, time.Hour) {
		t.Error("after the reader's context ended: to be read again")
	}
}

// A new cursor's registration a full disk refuses is tried again, with
// a warning, until it fits or the drainer stops.
func TestRegisterWaitsOutAFullDisk(t *testing.T) {
	calls := 0
	register := func(context.Context, string) (uint64, error) {
		if calls++; calls < 3 {
			return 0, wal.ErrNoSpace
		}
		return 7, nil
	}
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if pos, err := registerWaiting(context.Background(), register, "s3", log, time.Millisecond); err != nil || pos != 7 || calls != 3 {
		t.Fatalf("%d, %v after %d tries; want 7 after 3", pos, err, calls)
	}
	if n := strings.Count(logs.String(), "cannot register the sink's cursor: the WAL's disk is full; retrying"); n != 2 {
		t.Errorf("%d warnings, want 2:\n%s", n, logs.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	if _, err := registerWaiting(ctx, register, "s3", log, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("stopped while waiting: %v", err)
	}
}

// A sink's ReadRange (Recover's reads of calls in doubt and interrupted
// uploads) that meets a damaged entry whose replacement a full disk
// refuses returns the full disk, which the drainer waits out (Recover is
// tried again), not the damage alone, which stopped the sink; once
// there is room the entry is replaced and the read passes it.
func TestReadRangeDamageOnAFullDisk(t *testing.T) {
	w, last := damagedWAL(t)
	defer w.Close()
	full := true
	st := &sinkState{w: w, name: "s", replaceDamaged: func(ctx context.Context, first uint64) (uint64, error) {
		if full {
			return 0, fmt.Errorf("commit: %w", wal.ErrNoSpace)
		}
		return w.ReplaceDamaged(ctx, first)
	}}
	_, err := st.ReadRange(1, last, nil)
	var ce *wal.CorruptionError
	if !errors.Is(err, wal.ErrNoSpace) || !errors.As(err, &ce) || ce.FirstSeq != 101 {
		t.Fatalf("read with the disk full: %v; want the damage of entry 101 and wal.ErrNoSpace", err)
	}
	full = false
	got, err := st.ReadRange(1, last, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 200 || got[99].Seq != 100 || got[100].Seq != 201 {
		t.Fatalf("%d records after room was found, want 200 (1-100, 201-300)", len(got))
	}
}
