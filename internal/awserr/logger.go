package awserr

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/smithy-go/logging"
)

// Logger is a logger for the SDK (awsconfig.WithLogger) that writes to
// log, in the service's format and at its level: without it the SDK
// prints its own lines ("SDK 2026/01/02 15:04:05 WARN ...") to stderr,
// whatever log.format says. Its warnings are warnings; the rest is debug.
func Logger(log *slog.Logger) logging.Logger { return sdkLogger{log} }

type sdkLogger struct{ log *slog.Logger }

func (l sdkLogger) Logf(c logging.Classification, format string, v ...any) {
	level := slog.LevelDebug
	if c == logging.Warn {
		level = slog.LevelWarn
	}
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, "AWS SDK: "+fmt.Sprintf(format, v...))
}
