package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/logfwd/forwarder/config"
)

// loadConfig loads the configuration at path. When it cannot, it prints why to stderr,
// every problem on its own line with its file and line, and returns false.
func loadConfig(cmd, path string, stderr io.Writer) (*config.Config, bool) {
	cfg, err := config.Load(path)
	return reportLoad(cmd, path, stderr, cfg, err)
}

// loadWALConfig is loadConfig for the wal commands: only what they use (config.LoadWAL).
func loadWALConfig(cmd, path string, stderr io.Writer) (*config.Config, bool) {
	cfg, err := config.LoadWAL(path)
	return reportLoad(cmd, path, stderr, cfg, err)
}

// reportLoad returns cfg, or prints why it could not be loaded.
func reportLoad(cmd, path string, stderr io.Writer, cfg *config.Config, err error) (*config.Config, bool) {
	if err == nil {
		return cfg, true
	}
	var problems config.Problems
	if errors.As(err, &problems) {
		printProblems(stderr, path, problems)
		return nil, false
	}
	if path == defaultConfigPath && errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "%s: %v (the packaged service's configuration; give another with -c FILE)\n", cmd, err)
		return nil, false
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	return nil, false
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// printProblems prints every problem on its own line, then how many there are.
func printProblems(stderr io.Writer, path string, problems config.Problems) {
	fmt.Fprintln(stderr, problems.Error())
	fmt.Fprintf(stderr, "%s: %s\n", path, plural(len(problems), "problem", "problems"))
}
