package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/logfwd/forwarder/config"
)

const checkUsage = `Usage: forwarder check [-c FILE]

Validate a configuration file, and load the inputs' TLS certificates and keys as run
would (run check where the service runs, with its environment). Print "FILE: OK" and a
summary of what it configures, and
on stderr a warning for each input other machines can reach without authentication or
without TLS, and for each S3 key without ${hostname} or ${uuid}; or every problem with its
line, on stderr, and exit 1.
`

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	f := newFlagSet("check", checkUsage)
	configPath := f.configFlag()
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if code, done := f.noArgs(pos, stderr); done {
		return code
	}
	cfg, ok := loadConfig("forwarder check", *configPath, stderr)
	if !ok {
		return exitFail
	}
	problems, awsWarnings, notes := awsSetup(context.Background(), cfg, *configPath)
	if len(problems) > 0 {
		printProblems(stderr, *configPath, problems)
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: OK\n%s\n", *configPath, summary(cfg))
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}
	for _, w := range append(configWarnings(cfg), awsWarnings...) {
		fmt.Fprintf(stderr, "%s: warning: %s\n", *configPath, w.text())
	}
	return exitOK
}

// summary describes a configuration on one line: its sinks, its inputs and where its data is.
func summary(cfg *config.Config) string {
	var b strings.Builder
	b.WriteString(plural(len(cfg.Sinks), "sink", "sinks"))
	buffers := cfg.SinkBuffers()
	for i, s := range cfg.Sinks {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s (%s, %s of memory)", sep, s.Name, s.Type, config.Size(buffers[s.Name]).Human())
	}
	var inputs []string
	if in := cfg.Inputs.Forward; in != nil {
		inputs = append(inputs, "forward on "+in.Listen+tlsNote(in.TLS.Enabled()))
	}
	if in := cfg.Inputs.HTTP; in != nil {
		inputs = append(inputs, "http on "+in.Listen+tlsNote(in.TLS.Enabled()))
	}
	if len(inputs) == 0 {
		inputs = append(inputs, "none")
	}
	pprof := ""
	if cfg.Admin.Pprof {
		pprof = " (with /debug/pprof/)"
	}
	fmt.Fprintf(&b, "; inputs: %s; admin on %s%s; data_dir: %s; memory_limit: %s", strings.Join(inputs, ", "), cfg.Admin.Listen, pprof, cfg.DataDir, cfg.MemoryLimit.Human())
	return b.String()
}

func tlsNote(enabled bool) string {
	if enabled {
		return " (tls)"
	}
	return ""
}
