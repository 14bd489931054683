package main

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/template"
)

// warning is a setting that works but leaves something open that an operator should
// know about: run logs it at start, check prints it.
type warning struct {
	msg   string
	about string // what it is about: "address" (a listener) or "sink"
	name  string // the listener's address, the sink's name
}

// text is the warning as check prints it: with what it is about.
// log logs the warning.
func (w warning) log(log *slog.Logger) {
	if w.about == "" {
		log.Warn(w.msg)
		return
	}
	log.Warn(w.msg, w.about, w.name)
}

func (w warning) text() string {
	if w.about == "" {
		return w.msg
	}
	return w.msg + " (" + w.about + " " + w.name + ")"
}

// configWarnings lists what cfg leaves open to other machines: an input they can reach
// without authentication, an input they can reach without TLS (whatever authenticates
// its clients, records and secrets then cross the network in clear), Go's profiles on
// an admin listener they can reach; and S3 keys that another forwarder could render too.
func configWarnings(cfg *config.Config) []warning {
	var ws []warning
	switch {
	case cfg.Inputs.Forward == nil && cfg.Inputs.HTTP == nil:
		ws = append(ws, warning{"no inputs: the service takes no records and only delivers what its WAL already holds; name inputs.forward or inputs.http to take records", "", ""})
	case len(cfg.Sinks) == 0:
		ws = append(ws, warning{"no sinks: every record the inputs take is acknowledged and dropped, since no sink's match takes its tag; add a sink", "", ""})
	}
	if c := cfg.Inputs.Forward; c != nil && c.SharedKey != strings.TrimSpace(c.SharedKey) {
		ws = append(ws, warning{"inputs.forward.shared_key begins or ends with white space (a newline left by the file or Secret it came from?): clients whose key lacks it fail the handshake", "address", c.Listen})
	}
	if c := cfg.Inputs.Forward; c != nil && !loopback(c.Listen) {
		if c.SharedKey == "" && c.TLS.ClientCAFile == "" {
			ws = append(ws, warning{"the forward input accepts records from anyone who can reach it: set inputs.forward.shared_key (the handshake) or tls.client_ca_file, or listen on a loopback address", "address", c.Listen})
		}
		if !c.TLS.Enabled() {
			ws = append(ws, warning{"the forward input has no TLS: records, and the handshake that authenticates clients, cross the network in clear for anyone on the path to read or replay; set inputs.forward.tls.cert_file and key_file, or listen on a loopback address", "address", c.Listen})
		}
	}
	if c := cfg.Inputs.HTTP; c != nil && !loopback(c.Listen) {
		if c.Token == "" {
			ws = append(ws, warning{"the HTTP input accepts records from anyone who can reach it: set inputs.http.token, or listen on a loopback address", "address", c.Listen})
		}
		if !c.TLS.Enabled() {
			ws = append(ws, warning{"the HTTP input has no TLS: records and the bearer token cross the network in clear for anyone on the path to read and reuse; set inputs.http.tls.cert_file and key_file, or listen on a loopback address", "address", c.Listen})
		}
	}
	if cfg.Admin.Pprof && !loopback(cfg.Admin.Listen) {
		ws = append(ws, warning{"admin.pprof serves Go's profiles to anyone who can reach the admin listener: listen on a loopback address, or turn admin.pprof off", "address", cfg.Admin.Listen})
	}
	shellRefs := map[string]string{}
	if c := cfg.Inputs.Forward; c != nil {
		shellRefs["inputs.forward.shared_key"] = c.SharedKey
		for i, u := range c.Users {
			shellRefs[fmt.Sprintf("inputs.forward.users[%d].password", i)] = u.Password
		}
	}
	if c := cfg.Inputs.HTTP; c != nil {
		shellRefs["inputs.http.token"] = c.Token
	}
	for _, s := range cfg.Sinks {
		if s.S3 != nil {
			shellRefs[fmt.Sprintf("sinks[%s].bucket", s.Name)] = s.S3.Bucket
		}
	}
	for _, key := range slices.Sorted(maps.Keys(shellRefs)) {
		if name := config.ShellRef(shellRefs[key]); name != "" {
			ws = append(ws, warning{fmt.Sprintf("%s is %q, taken as it is: for the environment variable write ${env.%s}", key, shellRefs[key], name), "", ""})
		}
	}
	for _, s := range cfg.Sinks {
		if s.S3 == nil || s.S3.Endpoint != "" || len(s.S3.Bucket) < 3 || len(s.S3.Bucket) > 63 || config.ShellRef(s.S3.Bucket) != "" {
			continue
		}
		if msg := config.BucketNameProblem(s.S3.Bucket); msg != "" {
			ws = append(ws, warning{fmt.Sprintf("sinks[%s].bucket %q %s by Amazon S3's naming rules: unless it is a bucket made in us-east-1 before those rules, or the endpoint set by AWS_ENDPOINT_URL or the shared config is another service, uploads will fail and the sink pause", s.Name, s.S3.Bucket, msg), "sink", s.Name})
		}
	}
	dest := map[string]string{} // a destination's description -> the first sink writing to it
	for _, s := range cfg.Sinks {
		var d string
		switch {
		case s.S3 != nil:
			d = fmt.Sprintf("s3 %s %s %s", s.S3.Endpoint, s.S3.Bucket, s.S3.Key)
		case s.CloudWatch != nil:
			d = fmt.Sprintf("cloudwatch %s %s %s %s", s.CloudWatch.Endpoint, s.CloudWatch.Region, s.CloudWatch.LogGroup, s.CloudWatch.LogStream)
			for _, kv := range [][2]string{{"log_group", s.CloudWatch.LogGroup}, {"log_stream", s.CloudWatch.LogStream}} {
				key, v := kv[0], kv[1]
				if t, err := template.Parse(v, template.Options{}); err == nil && t.Finest() > 0 && t.Finest() < time.Hour {
					ws = append(ws, warning{fmt.Sprintf("sinks[%s].%s has %%M or %%S: every minute (second) of event time names a new %s, each made with a creation call paced at create_rate a second; use %%Y, %%m, %%d or %%H at most", s.Name, key, strings.ReplaceAll(key, "_", " ")), "sink", s.Name})
				}
			}
			if !perReplicaStreams(s.CloudWatch) {
				ws = append(ws, warning{fmt.Sprintf("sinks[%s]: neither log_group nor log_stream has ${hostname} (or an ${env.NAME} of the replica's own): replicas would write the same streams, so a call whose answer is lost (a crash, a timeout) is sent again rather than read back, and may be stored twice (README: Guarantees); put ${hostname} in the stream for exactly once", s.Name), "sink", s.Name})
			}
		}
		if first, ok := dest[d]; ok && d != "" {
			ws = append(ws, warning{fmt.Sprintf("sinks[%s] writes where sinks[%s] does (the same destination and name templates): records both take would be written twice, and S3 keys would collide (the second writer pauses); give each its own key, stream or destination", s.Name, first), "sink", s.Name})
		} else if d != "" {
			dest[d] = s.Name
		}
		if s.S3 != nil {
			if ext, want := keyExtension(s.S3.Key), config.CompressionExtension(s.S3.Compression); ext != "" && ext != want {
				ws = append(ws, warning{fmt.Sprintf("sinks[%s].key ends in %q, but the objects are compressed with %s: readers that pick the codec by the extension (Athena, Spark, zcat) would fail to read them; end the key in %q", s.Name, ext, s.S3.Compression, ".json"+want), "sink", s.Name})
			}
		}
		if s.S3 != nil && !perReplicaKey(s.S3) {
			ws = append(ws, warning{fmt.Sprintf("sinks[%s].key has neither ${hostname} nor ${uuid}, so its keys are this forwarder's alone only while no other forwarder writes to bucket %s: "+
				"replicas sharing the bucket would render the same keys for their own records, and the conditional writes would then pause the second writer "+
				"(nothing is overwritten; its records wait in its WAL until the key changes); put ${hostname} in the key", s.Name, s.S3.Bucket), "sink", s.Name})
		}
	}
	return ws
}

// keyExtension is the compression extension an S3 key template ends with: ".gz", ".zst"
// or "" for neither.
func keyExtension(key string) string {
	for _, ext := range []string{".gz", ".zst"} {
		if strings.HasSuffix(key, ext) {
			return ext
		}
	}
	return ""
}

// perReplicaStreams reports whether a CloudWatch sink's names keep replicas apart: its
// log group or its log stream holds ${hostname}, or an environment variable's value
// that holds the host name (a pod's name from the downward API is its host name).
func perReplicaStreams(cw *config.CloudWatch) bool {
	return usesHostname(cw.LogGroup) || usesHostname(cw.LogStream) || holdsHostname(cw.NamesEnv)
}

// holdsHostname reports whether one of values holds this machine's host name.
func holdsHostname(values []string) bool {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return false
	}
	for _, v := range values {
		if strings.Contains(v, host) {
			return true
		}
	}
	return false
}

// usesHostname reports whether a name template holds ${hostname}. A template that does not
// parse is reported by validation, not here.
func usesHostname(src string) bool {
	t, err := template.Parse(src, template.Options{})
	return err != nil || t.UsesHostname()
}

// perReplicaKey reports whether an S3 key template renders keys no other forwarder
// renders: with ${hostname} (each replica has its own), an environment variable's value
// that holds the host name, or ${uuid}. A template that does
// not parse is reported by validation, not here.
func perReplicaKey(s3 *config.S3) bool {
	t, err := template.Parse(s3.Key, template.Options{AllowSeq: true})
	return err != nil || t.UsesHostname() || t.UsesUUID() || holdsHostname(s3.KeyEnv)
}

// loopback reports whether a listen address is reachable from this machine only.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
