package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/logfwd/forwarder/config"
)

// awsSetup resolves, without calling AWS, what each sink's clients will use:
// the region (the sink's, else the SDK's environment and shared config; none is a
// problem: the sink cannot start) and where credentials come from (when nothing is
// found but the instance's role, a warning: such a role exists only where the
// service runs, on EC2). check and run both call it before the WAL is opened.
//
// notes say, per sink, the region and the credentials' source, for check to print.
func awsSetup(ctx context.Context, cfg *config.Config, path string) (problems config.Problems, ws []warning, notes []string) {
	problems = tlsProblems(cfg, path)
	if p := dataDirProblem(cfg, path); p != nil {
		problems = append(problems, *p)
	}
	for i, s := range cfg.Sinks {
		// line is that of the sink's key, or the sink's when it has none.
		line := func(key string) int {
			if l := cfg.Line(fmt.Sprintf("sinks[%d].%s", i, key)); l != 0 {
				return l
			}
			return s.Line
		}
		region, endpoint, service := "", "", ""
		switch {
		case s.S3 != nil:
			region, endpoint, service = s.S3.Region, s.S3.Endpoint, s3.ServiceID
		case s.CloudWatch != nil:
			region, endpoint, service = s.CloudWatch.Region, s.CloudWatch.Endpoint, cloudwatchlogs.ServiceID
		default:
			continue
		}
		var opts []func(*awsconfig.LoadOptions) error
		if region != "" {
			opts = append(opts, awsconfig.WithRegion(region))
		}
		ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			problems = append(problems, config.Problem{File: path, Line: s.Line, Msg: fmt.Sprintf("sink %q: load the AWS configuration (environment and shared config files): %v", s.Name, err)})
			continue
		}
		switch {
		case ac.Region == "":
			problems = append(problems, config.Problem{File: path, Line: s.Line, Msg: fmt.Sprintf("sink %q: no AWS region: set region in the sink, or AWS_REGION in the service's environment, or region in the shared config's profile", s.Name)})
		case endpoint == "" && !endpointConfigured(ctx, ac, service):
			// Bound for AWS itself: the region must be one of its names.
			if msg := config.RegionProblem(ac.Region); msg != "" {
				from, at := "region", line("region")
				if region == "" {
					from, at = "the region from the service's environment (AWS_REGION, AWS_DEFAULT_REGION) or the shared config's profile", s.Line
				}
				problems = append(problems, config.Problem{File: path, Line: at, Msg: fmt.Sprintf("sink %q: %s: %s; for a service other than AWS, set endpoint", s.Name, from, msg)})
			} else if msg := config.UnknownRegion(ac.Region); msg != "" {
				ws = append(ws, warning{msg: "region " + msg, about: "sink", name: s.Name})
			}
			var msgs []keyProblem
			if s.S3 != nil {
				msgs = s3Problems(s.S3)
			} else {
				msgs = cloudWatchProblems(s.CloudWatch)
			}
			for _, p := range msgs {
				problems = append(problems, config.Problem{File: path, Line: line(p.key), Msg: fmt.Sprintf("sink %q: %s; for a service other than AWS, set endpoint", s.Name, p.msg)})
			}
		}
		if msg := credentialsNote(ac); msg != "" {
			ws = append(ws, warning{msg: msg, about: "sink", name: s.Name})
		}
		notes = append(notes, fmt.Sprintf("sink %s: region %s, credentials from %s", s.Name, cmp.Or(ac.Region, "(none)"), credentialSources(ac)))
	}
	return problems, ws, notes
}

// keyProblem is a problem with the value of a sink's key.
type keyProblem struct{ key, msg string }

// s3Problems are the settings of an S3 sink bound for AWS that Amazon S3
// refuses, which would pause the sink at its first upload: a storage class
// it does not know, tags beyond its limits (10 a object, keys of 1 to 128
// characters and values of at most 256, none beginning aws:).
func s3Problems(c *config.S3) []keyProblem {
	var out []keyProblem
	if sc := c.StorageClass; sc != "" && !slices.Contains(types.StorageClass("").Values(), types.StorageClass(sc)) {
		var known []string
		for _, v := range types.StorageClass("").Values() {
			known = append(known, string(v))
		}
		out = append(out, keyProblem{"storage_class", fmt.Sprintf("storage_class: %q is not one of Amazon S3's: %s", sc, strings.Join(known, ", "))})
	}
	return append(out, tagProblems(c.Tags, "Amazon S3", "an object", 10, nil)...)
}

// cloudWatchTagRE is what CloudWatch Logs takes in a tag's key (one
// character or more) and value: letters, spaces, digits and _ . : / = + - @.
var cloudWatchTagRE = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$`)

// cloudWatchProblems are the settings of a CloudWatch sink bound for AWS
// that CloudWatch Logs refuses, which would hold every stream of a group
// the sink must create: tags beyond its limits (50 a log group, keys of
// 1 to 128 characters and values of at most 256, of letters, spaces,
// digits and _ . : / = + - @, no key beginning aws:).
func cloudWatchProblems(c *config.CloudWatch) []keyProblem {
	return tagProblems(c.Tags, "CloudWatch Logs", "a log group", 50, cloudWatchTagRE)
}

// tagProblems are the tags service refuses: more than most on one of
// what it tags (on), keys of other than 1 to 128 characters or beginning
// aws:, values of more than 256, and with pattern, keys or values it does
// not match.
func tagProblems(tags map[string]string, service, on string, most int, pattern *regexp.Regexp) []keyProblem {
	var out []keyProblem
	add := func(key, format string, args ...any) {
		out = append(out, keyProblem{key, fmt.Sprintf(format, args...)})
	}
	if len(tags) > most {
		add("tags", "tags: %d, %s takes at most %d on %s", len(tags), service, most, on)
	}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		switch v := tags[k]; {
		case utf8.RuneCountInString(k) < 1 || utf8.RuneCountInString(k) > 128:
			add("tags."+k, "tags: key %q has %d characters, %s takes 1 to 128", k, utf8.RuneCountInString(k), service)
		case strings.HasPrefix(strings.ToLower(k), "aws:"):
			add("tags."+k, "tags: key %q begins with aws:, which AWS keeps for its own", k)
		case pattern != nil && !pattern.MatchString(k):
			add("tags."+k, "tags: key %q: %s takes only letters, spaces, digits and _ . : / = + - @ in tags", k, service)
		case utf8.RuneCountInString(v) > 256:
			add("tags."+k, "tags: the value of %q has %d characters, %s takes at most 256", k, utf8.RuneCountInString(v), service)
		case pattern != nil && !pattern.MatchString(v):
			add("tags."+k, "tags: the value of %q, %q: %s takes only letters, spaces, digits and _ . : / = + - @ in tags", k, v, service)
		}
	}
	return out
}

// endpointConfigured reports whether ac points the clients of service (an
// SDK service id: s3.ServiceID) at an endpoint of their own, as the SDK
// resolves one: AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_<SERVICE>, or the
// shared config's endpoint_url, global or in a services section.
func endpointConfigured(ctx context.Context, ac aws.Config, service string) bool {
	if ac.BaseEndpoint != nil {
		return true
	}
	type serviceEndpoint interface {
		GetServiceBaseEndpoint(ctx context.Context, sdkID string) (string, bool, error)
	}
	for _, src := range ac.ConfigSources {
		if p, ok := src.(serviceEndpoint); ok {
			if v, found, err := p.GetServiceBaseEndpoint(ctx, service); err == nil && found && v != "" {
				return true
			}
		}
	}
	return false
}

// credentialsNote says what is wrong with where ac's credentials would come
// from, or "" when a source was found.
func credentialsNote(ac aws.Config) string {
	var sources []aws.CredentialSource
	if p, ok := ac.Credentials.(aws.CredentialProviderSource); ok {
		sources = p.ProviderSources()
	}
	if len(sources) > 0 && !slices.Equal(sources, []aws.CredentialSource{aws.CredentialSourceIMDS}) {
		return ""
	}
	return "no AWS credentials found: not in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), no web identity token (IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), no container credentials (EKS Pod Identity or ECS: AWS_CONTAINER_CREDENTIALS_FULL_URI), no shared config profile with credentials; only the instance's role (EC2 instance metadata) is left, which exists only on EC2. Elsewhere the sink pauses at its first request until credentials are given"
}

// credentialSources names where ac's credentials would come from, for people.
func credentialSources(ac aws.Config) string {
	p, ok := ac.Credentials.(aws.CredentialProviderSource)
	if !ok || len(p.ProviderSources()) == 0 {
		return "nowhere found"
	}
	var names []string
	for _, s := range p.ProviderSources() {
		names = append(names, credentialSourceName(s))
	}
	return strings.Join(names, ", ")
}

func credentialSourceName(s aws.CredentialSource) string {
	switch s {
	case aws.CredentialSourceEnvVars:
		return "environment"
	case aws.CredentialSourceEnvVarsSTSWebIDToken, aws.CredentialSourceSTSAssumeRoleWebID:
		return "web identity token (IRSA)"
	case aws.CredentialSourceHTTP:
		return "container credentials endpoint (EKS Pod Identity or ECS)"
	case aws.CredentialSourceIMDS:
		return "instance role (EC2 instance metadata)"
	case aws.CredentialSourceProfile, aws.CredentialSourceProfileSourceProfile, aws.CredentialSourceProfileNamedProvider,
		aws.CredentialSourceProfileSTSWebIDToken, aws.CredentialSourceProfileSSO, aws.CredentialSourceProfileSSOLegacy,
		aws.CredentialSourceProfileProcess, aws.CredentialSourceProfileLogin:
		return "shared config profile"
	case aws.CredentialSourceSTSAssumeRole:
		return "assumed role"
	}
	return fmt.Sprintf("source %d", s)
}

// tlsProblems loads the inputs' TLS files as they will when they start: a
// certificate, key or client CA file missing, unreadable or not matching
// is a problem check finds, and run before it starts anything.
func tlsProblems(cfg *config.Config, path string) (problems config.Problems) {
	add := func(input string, load func() (*tls.Config, error)) {
		if _, err := load(); err != nil {
			problems = append(problems, config.Problem{File: path, Line: cfg.Line("inputs." + input + ".tls"), Msg: fmt.Sprintf("inputs.%s.tls: %v", input, err)})
		}
	}
	if in := cfg.Inputs.Forward; in != nil && in.TLS.Enabled() {
		add("forward", in.TLS.ServerConfig)
	}
	if in := cfg.Inputs.HTTP; in != nil && in.TLS.Enabled() {
		add("http", in.TLS.ServerConfig)
	}
	return problems
}

// dataDirProblem says when data_dir cannot be the WAL's directory: it, or
// the nearest of its parents that exists, is a file. (Whether the service's
// user may write there is for run to find: check may run as another user.)
func dataDirProblem(cfg *config.Config, path string) *config.Problem {
	for d := filepath.Clean(cfg.DataDir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir() && d == filepath.Clean(cfg.DataDir):
			return &config.Problem{File: path, Line: cfg.Line("data_dir"), Msg: fmt.Sprintf("data_dir: %s is a file, not a directory", cfg.DataDir)}
		case err == nil && !fi.IsDir():
			return &config.Problem{File: path, Line: cfg.Line("data_dir"), Msg: fmt.Sprintf("data_dir: %s cannot be made: %s is a file, not a directory", cfg.DataDir, d)}
		case err == nil || !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) || d == filepath.Dir(d):
			return nil // a directory; or what the WAL's open will say
		}
	}
}
