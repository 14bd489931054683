package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/logfwd/forwarder/admin"
	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

var walCommands = []command{
	{"stats", "print what the WAL holds and where each sink's cursor is", cmdWALStats},
	{"verify", "check every entry's checksum and the file's consistency", cmdWALVerify},
	{"dump", "print records as JSON lines", cmdWALDump},
	{"dead-letters", "print the records a sink's destination refused for good", cmdWALDeadLetters},
	{"drop-cursor", "remove the cursor of a sink that is gone, so it no longer pins records", cmdWALDropCursor},
}

const walUsage = `Usage: forwarder wal <command> [flags]

Inspect the write-ahead log in data_dir. They read only data_dir, wal, admin and the
sinks' names of the configuration. verify, dump and drop-cursor work on a stopped service
(a running one holds the WAL); stats and dead-letters read a running one through its
admin server (admin.listen: /wal and /dead-letters).
`

func cmdWAL(args []string, stdout, stderr io.Writer) int {
	return dispatch("forwarder wal", walUsage, walCommands, args, stdout, stderr)
}

// openForInspection does what every read-only wal subcommand does first: parse its flags
// (it takes no other arguments), load the configuration, open the WAL read-only. When done
// is true, the subcommand returns code at once; the failure was already printed.
//
// live, if set, answers instead when a running service holds the WAL: it reads what the
// command prints from the service's admin server, and returns the command's exit status.
func openForInspection(cmd string, f *flagSet, configPath *string, args []string, stdout, stderr io.Writer, live func(cfg *config.Config) int) (*config.Config, *wal.WAL, int, bool) {
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return nil, nil, code, true
	}
	if code, done := f.noArgs(pos, stderr); done {
		return nil, nil, code, true
	}
	cfg, ok := loadWALConfig(cmd, *configPath, stderr)
	if !ok {
		return nil, nil, exitFail, true
	}
	if live != nil && walLocked(cfg) {
		return nil, nil, live(cfg), true
	}
	w := openWAL(cmd, cfg, true, stderr)
	if w == nil {
		return nil, nil, exitFail, true
	}
	return cfg, w, exitOK, false
}

// walLocked reports whether a running service holds cfg's WAL.
func walLocked(cfg *config.Config) bool {
	path := filepath.Join(cfg.DataDir, wal.FileName)
	if _, err := os.Stat(path); err != nil {
		return false
	}
	w, err := wal.Open(cfg.DataDir, wal.Options{ReadOnly: true, Logger: toolLogger(io.Discard)})
	if err == nil {
		w.Close()
	}
	return errors.Is(err, wal.ErrLocked)
}

// adminGet fetches path from the admin server of the service that runs with cfg.
func adminGet(cfg *config.Config, path string) (*http.Response, error) {
	base, ok := adminBase(cfg.Admin.Listen)
	if !ok {
		return nil, fmt.Errorf("admin.listen %s names no fixed port to reach the running service at", cfg.Admin.Listen)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	// The token the service wrote to its data_dir (admin.TokenFileName),
	// which /dead-letters asks for: readable by who may read the records.
	if token, err := os.ReadFile(filepath.Join(cfg.DataDir, admin.TokenFileName)); err == nil {
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the running service's admin server: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("the running service's admin server answered %s for %s: %s", resp.Status, base+path, strings.TrimSpace(string(body)))
	}
	return resp, nil
}

// adminBase is the URL of the admin server listening on listen, as reachable from here.
func adminBase(listen string) (string, bool) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port == "0" {
		return "", false
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port), true
}

// openWAL opens the WAL of cfg for a wal subcommand: read-only, except for the commands
// that change it. When it cannot, it prints why to stderr and returns nil.
func openWAL(cmd string, cfg *config.Config, readOnly bool, stderr io.Writer) *wal.WAL {
	path := filepath.Join(cfg.DataDir, wal.FileName)
	// Checked here because a read-write Open would create an empty WAL.
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "%s: there is no WAL at %s (data_dir %s): the service has not run with this configuration\n", cmd, path, cfg.DataDir)
		return nil
	}
	opts := wal.Options{ReadOnly: true, Logger: toolLogger(stderr)}
	if !readOnly {
		// The dedup window matters: the writer expires chunk ids older than it.
		opts = walOptions(cfg, toolLogger(stderr))
		opts.CompactRatio = -1 // an inspection tool does not rewrite the file
	}
	w, err := wal.Open(cfg.DataDir, opts)
	switch {
	case errors.Is(err, wal.ErrLocked):
		next := "stop it first, or read the live state from " + statusURL(cfg.Admin.Listen)
		if !readOnly {
			// drop-cursor: the service itself drops what wal.drop_cursors names.
			next = "stop it first, or list the cursor under wal.drop_cursors in the configuration, which the service drops at its next start"
		}
		fmt.Fprintf(stderr, "%s: %s is in use by a running forwarder; %s\n", cmd, path, next)
		return nil
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return nil
	}
	return w
}

// statusURL is where the admin server listening on listen shows the live state.
func statusURL(listen string) string {
	base, ok := adminBase(listen)
	if !ok {
		return "the admin server's /status endpoint"
	}
	return base + "/status"
}

// closeWAL closes a WAL opened by openWAL; a failure is printed and makes the command fail.
func closeWAL(cmd string, w *wal.WAL, stderr io.Writer, code int) int {
	if err := w.Close(); err != nil {
		fmt.Fprintf(stderr, "%s: close wal: %v\n", cmd, err)
		return exitFail
	}
	return code
}
