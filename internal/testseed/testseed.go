// Package testseed gives randomized tests a seed they print, and that an
// environment variable replays (README.md, Development).
package testseed

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed is the value of the environment variable env when it is set (a
// seed an earlier run printed), else a new one; either way the test's log
// says which, and how to replay it. what says what the seed decides.
func Seed(t testing.TB, env, what string) int64 {
	t.Helper()
	seed := time.Now().UnixNano()
	if v := os.Getenv(env); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q is not a seed (an integer): %v", env, v, err)
		}
		seed = n
	}
	t.Logf("seed %d (%s=%d replays %s)", seed, env, seed, what)
	return seed
}
