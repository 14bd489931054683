package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/logfwd/forwarder/config"
)

// newLogger returns the service's logger: log.level and log.format of the configuration,
// written to w (stderr, which the systemd journal captures). When w is the journal's
// stream (JOURNAL_STREAM names it), each line begins with its syslog priority, <3> for
// an error, <4> a warning, <6> info, <7> debug, which journald takes as the entry's
// priority and strips: `journalctl -p warning` shows the warnings and errors.
func newLogger(c config.Log, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevel(c.Level)}
	handler := func(w io.Writer) slog.Handler {
		if c.Format == config.FormatJSON {
			jopts := *opts
			jopts.ReplaceAttr = durationText
			return slog.NewJSONHandler(w, &jopts)
		}
		return slog.NewTextHandler(w, opts)
	}
	if f, ok := w.(*os.File); ok && onJournal(f) {
		buf := new(bytes.Buffer)
		return slog.New(&priorityHandler{mu: new(sync.Mutex), buf: buf, out: w, inner: handler(buf)})
	}
	return slog.New(handler(w))
}

// durationText writes a duration as the text handler does ("1m0s"), not
// as the JSON handler's integer of nanoseconds, which reads as a count.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// journalErrors is w for what run writes before its logger exists (a
// configuration's problems): under the journal each line begins with <3>,
// an error's priority, so that `journalctl -p warning` shows why a start
// failed; elsewhere w itself.
func journalErrors(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && onJournal(f) {
		return &prefixLines{w: w, prefix: []byte("<3>"), start: true}
	}
	return w
}

// prefixLines writes prefix at the start of each line.
type prefixLines struct {
	w      io.Writer
	prefix []byte
	start  bool // the next byte begins a line
}

func (p *prefixLines) Write(b []byte) (int, error) {
	var out []byte
	for _, c := range b {
		if p.start {
			out = append(out, p.prefix...)
		}
		out = append(out, c)
		p.start = c == '\n'
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// priorityHandler writes each record as inner formats it, after its syslog
// priority. inner writes into buf, which mu guards with the handlers
// WithAttrs and WithGroup derive.
type priorityHandler struct {
	mu    *sync.Mutex
	buf   *bytes.Buffer
	out   io.Writer
	inner slog.Handler
}

func (h *priorityHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf.Reset()
	switch {
	case r.Level >= slog.LevelError:
		h.buf.WriteString("<3>")
	case r.Level >= slog.LevelWarn:
		h.buf.WriteString("<4>")
	case r.Level >= slog.LevelInfo:
		h.buf.WriteString("<6>")
	default:
		h.buf.WriteString("<7>")
	}
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	_, err := h.out.Write(h.buf.Bytes())
	return err
}

func (h *priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &priorityHandler{mu: h.mu, buf: h.buf, out: h.out, inner: h.inner.WithAttrs(as)}
}

func (h *priorityHandler) WithGroup(name string) slog.Handler {
	return &priorityHandler{mu: h.mu, buf: h.buf, out: h.out, inner: h.inner.WithGroup(name)}
}

func logLevel(level string) slog.Level {
	switch level {
	case config.LevelDebug:
		return slog.LevelDebug
	case config.LevelWarn:
		return slog.LevelWarn
	case config.LevelError:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// toolLogger is for the WAL's own warnings (a damaged meta page) in the inspection commands:
// warnings and errors, without timestamps, on stderr.
func toolLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}
