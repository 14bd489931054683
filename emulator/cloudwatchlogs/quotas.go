package cloudwatchlogs

import (
	"sort"
	"time"
)

// AWSQuota is CloudWatch Logs' default quota, in calls a second per account
// and Region, for operation op in region, as the CloudWatch Logs quotas page
// of the CloudWatch Logs User Guide lists it ("<Operation> throttle limit in
// transactions per second"); 0 for an operation this package does not
// serve. Only GetLogEvents and FilterLogEvents differ by Region.
func AWSQuota(op, region string) int {
	switch op {
	case "CreateLogGroup", "DeleteLogGroup", "DescribeLogGroups":
		return 10
	case "CreateLogStream":
		return 50
	case "DeleteLogStream":
		return 15
	case "DescribeLogStreams":
		return 25
	case "PutRetentionPolicy", "DeleteRetentionPolicy":
		return 5
	case "PutLogEvents":
		return 5000
	case "GetLogEvents":
		switch region {
		case "us-west-2", "ap-northeast-3", "ap-southeast-3", "ca-west-1", "eu-central-1", "eu-west-1", "il-central-1":
			return 10
		case "eu-west-3":
			return 30
		}
		return 25
	case "FilterLogEvents":
		switch region {
		case "us-east-1":
			return 25
		case "ap-northeast-3", "ap-southeast-3", "ca-west-1", "eu-central-1", "il-central-1":
			return 5
		}
		return 10
	}
	return 0
}

// AWSQuotas is AWSQuota for every operation the server serves.
func AWSQuotas(region string) map[string]int {
	m := make(map[string]int, len(operations))
	for op := range operations {
		m[op] = AWSQuota(op, region)
	}
	return m
}

// bucket is one operation's token bucket: rate calls a second, holding at
// most one second's worth, refilled continuously on the real clock.
type bucket struct {
	rate   int
	tokens float64
	at     time.Time
}

// SetQuota limits operation op to callsPerSecond (a token bucket holding
// one second's worth of calls, refilled continuously on the real clock);
// calls above it get 400 ThrottlingException "Rate exceeded" and do
// nothing. 0 or less turns op's quota off. SetQuota("PutLogEvents", n) is
// SetThrottle(n).
func (s *Server) SetQuota(op string, callsPerSecond int) {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	if callsPerSecond <= 0 {
		delete(s.quotas, op)
		return
	}
	s.quotas[op] = &bucket{rate: callsPerSecond, tokens: float64(callsPerSecond), at: time.Now()}
}

// Quotas returns the operations that have a quota and their calls a second.
func (s *Server) Quotas() map[string]int {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	out := make(map[string]int, len(s.quotas))
	for op, b := range s.quotas {
		out[op] = b.rate
	}
	return out
}

// allow takes a token from op's bucket; an operation without a quota is
// always allowed.
func (s *Server) allow(op string) bool {
	s.swMu.Lock()
	defer s.swMu.Unlock()
	b := s.quotas[op]
	if b == nil {
		return true
	}
	now := time.Now()
	rate := float64(b.rate)
	b.tokens = min(rate, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Throttled returns how many requests named op the server answered with
// ThrottlingException for its quota (SetQuota, SetThrottle); SetDenyAll
// answers are not counted.
func (s *Server) Throttled(op string) int {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	return s.throttled[op]
}

func (s *Server) countThrottled(op string) {
	s.callsMu.Lock()
	s.throttled[op]++
	s.callsMu.Unlock()
}

// initQuotas applies Options' quotas.
func (s *Server) initQuotas(opts Options) {
	s.quotas = map[string]*bucket{}
	q := map[string]int{}
	if opts.AWSQuotas {
		q = AWSQuotas(s.region)
	}
	for op, n := range opts.Quotas {
		q[op] = n
	}
	if opts.ThrottlePerSecond != 0 {
		q["PutLogEvents"] = opts.ThrottlePerSecond
	}
	ops := make([]string, 0, len(q))
	for op := range q {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		s.SetQuota(op, q[op])
	}
}
