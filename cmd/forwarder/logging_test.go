package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/logfwd/forwarder/config"
)

// Under the journal (JOURNAL_STREAM names the stream the log goes to) each
// line begins with its syslog priority, which journald takes as the
// entry's; written anywhere else, lines are as they are.
func TestJournalPriorities(t *testing.T) {
	dir := t.TempDir()
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	journal, other := open("journal"), open("other")
	var st syscall.Stat_t
	if err := syscall.Fstat(int(journal.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	for _, format := range []string{config.FormatText, config.FormatJSON} {
		for _, f := range []*os.File{journal, other} {
			if err := f.Truncate(0); err != nil {
				t.Fatal(err)
			}
			f.Seek(0, 0)
			log := newLogger(config.Log{Level: config.LevelDebug, Format: format}, f).With("sink", "archive")
			log.Error("e")
			log.WithGroup("g").Warn("w", "k", 1)
			log.Info("i")
			log.Debug("d")
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			if len(lines) != 4 {
				t.Fatalf("%s, %s: %d lines:\n%s", format, f.Name(), len(lines), b)
			}
			for i, prio := range []string{"<3>", "<4>", "<6>", "<7>"} {
				if got := strings.HasPrefix(lines[i], prio); got != (f == journal) {
					t.Errorf("%s, %s: line %q begins with %s: %v", format, filepath.Base(f.Name()), lines[i], prio, got)
				}
				if !strings.Contains(lines[i], "archive") {
					t.Errorf("%s: line %q lacks the logger's attributes", format, lines[i])
				}
			}
		}
	}
}

// A start that fails on its configuration says why at an error's priority
// under the journal, before any logger exists: `journalctl -p warning`
// shows the cause, not only the exit status.
func TestRunConfigProblemsUnderTheJournal(t *testing.T) {
	dir := t.TempDir()
	journal, err := os.Create(filepath.Join(dir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer journal.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(journal.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("wal:\n  sync: sometimes\nlog: {level: loud}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := cmdRun([]string{"-c", bad}, os.Stdout, journal); code != exitFail {
		t.Fatalf("exit %d, want %d", code, exitFail)
	}
	b, err := os.ReadFile(journal.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) < 3 || !strings.Contains(string(b), `wal.sync: "sometimes"`) {
		t.Fatalf("want both problems and the count:\n%s", b)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "<3>") {
			t.Errorf("line %q lacks the error priority", l)
		}
	}
}
