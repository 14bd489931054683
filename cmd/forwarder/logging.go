package main

import (
	"io"
	"log/slog"

	"github.com/logfwd/forwarder/config"
)

// newLogger returns the service's logger: log.level and log.format of the configuration,
// written to w (stderr, which the systemd journal captures).
func newLogger(c config.Log, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevel(c.Level)}
	if c.Format == config.FormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
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
