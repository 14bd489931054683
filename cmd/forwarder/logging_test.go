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
