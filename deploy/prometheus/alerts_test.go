// Package prometheus holds the forwarder's alerting rules (alerts.yaml);
// its test checks them against the metrics the code registers and
// README.md documents.
package prometheus

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var metricName = regexp.MustCompile(`\bforwarder_[a-z0-9_]+\b`)

// TestAlerts: alerts.yaml decodes strictly as rule groups; every rule has a
// unique name, a severity, a summary and a duration Prometheus reads; and
// every metric it names is one the code registers and README.md documents.
func TestAlerts(t *testing.T) {
	data, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	code := registered(t, "../..")
	seen := map[string]bool{}
	n := 0
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			n++
			switch {
			case rule.Alert == "" || seen[rule.Alert]:
				t.Errorf("rule %q: no name, or one taken", rule.Alert)
			case strings.TrimSpace(rule.Expr) == "":
				t.Errorf("%s: no expr", rule.Alert)
			case rule.Labels["severity"] != "warning" && rule.Labels["severity"] != "critical":
				t.Errorf("%s: severity %q", rule.Alert, rule.Labels["severity"])
			case rule.Annotations["summary"] == "":
				t.Errorf("%s: no summary", rule.Alert)
			}
			seen[rule.Alert] = true
			if rule.For != "" {
				if _, err := time.ParseDuration(rule.For); err != nil {
					t.Errorf("%s: for %q: %v", rule.Alert, rule.For, err)
				}
			}
			if strings.Count(rule.Expr, "(") != strings.Count(rule.Expr, ")") {
				t.Errorf("%s: unbalanced parentheses in %q", rule.Alert, rule.Expr)
			}
			for _, m := range metricName.FindAllString(rule.Expr, -1) {
				if !code[m] {
					t.Errorf("%s: %s is no metric the code registers", rule.Alert, m)
				}
				if !regexp.MustCompile("\\b" + m + "\\b").Match(readme) {
					t.Errorf("%s: %s is not in README.md", rule.Alert, m)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("%d rules", n)
	}
	// Each rule has its scenarios in alerts_test.yaml, which make alerts
	// runs with promtool: one where it fires, at least.
	scenarios, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name := range seen {
		fires := regexp.MustCompile(`(?m)^\s*alertname: ` + name + `\n\s*exp_alerts:\n\s*- exp_labels:`)
		if !fires.Match(scenarios) {
			t.Errorf("%s: no scenario of alerts_test.yaml where it fires", name)
		}
	}
	if !bytes.Contains(readme, []byte("deploy/prometheus/alerts.yaml")) {
		t.Error("README.md does not name deploy/prometheus/alerts.yaml")
	}
}

// registered is the metric names the code's Go files (not tests) spell.
func registered(t *testing.T, root string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`"(forwarder_[a-z0-9_]+)"`).FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("%d metric names found in the code", len(names))
	}
	return names
}
