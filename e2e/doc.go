// Package e2e runs the real forwarder binary end to end: the Fluent forward
// and HTTP inputs fed by clients that resend what was not acknowledged,
// the S3 and CloudWatch Logs sinks pointed at the project's emulators
// (run in the test process, so that they outlive the forwarder) or at
// moto_server, and an account of every acknowledged record read back
// through the AWS SDK.
//
// The package holds tests only. `go test -race ./e2e` is the short form
// (10 SIGKILLs, a few seconds of load per scenario); E2E_LONG=1 runs the
// long form (100 SIGKILLs, longer loads).
//
// What every scenario checks, from the records the clients saw
// acknowledged (a forward chunk's ack, an HTTP 200):
//   - S3: each acknowledged record exactly once (no duplicates at all; none
//     missing unless `forwarder wal dead-letters` lists it for the sink);
//   - CloudWatch Logs: each acknowledged record in the group and stream its
//     fields name, exactly once: the calls a kill leaves in doubt are
//     resolved at the next start by reading the stream back. With events
//     readable only after settle (TestKillLoopReadDelay), at least once,
//     with no more duplicates than the events the forwarder says it sent
//     again without finding them.
//
// TestDiskFull mounts a tmpfs as the data directory and so needs root (or
// CAP_SYS_ADMIN); without it, it skips and says why.
package e2e
