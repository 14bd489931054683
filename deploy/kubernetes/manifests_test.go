// Tests of the Kubernetes manifests in this directory and of the image they run
// (../container/Containerfile): every manifest decodes strictly into the Kubernetes API
// types, and the facts that span files agree (ports and listeners, probes and the admin
// server's routes, the grace period and shutdown_timeout, the memory limit and
// memory_limit, the volume and data_dir, the image's user and runAsUser). README.md,
// section Kubernetes, describes the deployment these files make.
package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/logfwd/forwarder/admin"
	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/wal"
)

const (
	containerfilePath = "../container/Containerfile"
	readmePath        = "../../README.md"
	readmeSection     = "## Kubernetes"
)

// kustomization is the part of kustomize's Kustomization that kustomization.yaml uses;
// anything else in the file is an error.
type kustomization struct {
	APIVersion         string          `json:"apiVersion"`
	Kind               string          `json:"kind"`
	Namespace          string          `json:"namespace"`
	Resources          []string        `json:"resources"`
	ConfigMapGenerator []generator     `json:"configMapGenerator"`
	Images             []imageOverride `json:"images"`
}

type generator struct {
	Name  string   `json:"name"`
	Files []string `json:"files"`
}

type imageOverride struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// bundle is everything the checks look at, decoded once.
type bundle struct {
	kust       kustomization
	yamlFiles  []string // every YAML file in the directory but kustomization.yaml
	decodeErrs []string
	sts        *appsv1.StatefulSet
	services   []*corev1.Service
	account    *corev1.ServiceAccount
	pdb        *policyv1.PodDisruptionBudget
	configMap  *corev1.ConfigMap // as configMapGenerator builds it
	cfg        *config.Config    // the configuration the ConfigMap holds, loaded by the config package
	cfgErr     error
	cfgTree    *yaml.Node // the same, as YAML, for its ${env.NAME} references
	image      *containerfile
	readme     string // README.md's Kubernetes section
	adminURL   string // a real admin server, for the probes' paths
}

// kinds are the API types a manifest may hold, each with its apiVersion.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"StatefulSet":         {"apps/v1", func() any { return &appsv1.StatefulSet{} }},
	"Service":             {"v1", func() any { return &corev1.Service{} }},
	"ServiceAccount":      {"v1", func() any { return &corev1.ServiceAccount{} }},
	"PodDisruptionBudget": {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"ConfigMap":           {"v1", func() any { return &corev1.ConfigMap{} }},
}

// decodeStrict decodes one YAML document into v as the API server's strict field
// validation would: unknown fields, duplicate fields and fields in the wrong case are errors.
func decodeStrict(data []byte, v any) error {
	if n, err := countDocuments(data); err != nil {
		return err
	} else if n != 1 {
		return fmt.Errorf("%d YAML documents: want one per file", n)
	}
	j, err := sigsyaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("convert yaml: %w", err)
	}
	strict, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("decode: %w", errors.Join(strict...))
	}
	return nil
}

func countDocuments(data []byte) (int, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return n, nil
		} else if err != nil {
			return n, fmt.Errorf("parse yaml: %w", err)
		}
		n++
	}
}

// decodeManifest decodes a manifest into the API type its kind names.
func decodeManifest(data []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("read kind: %w", err)
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return nil, fmt.Errorf("kind %q is not one this test knows", tm.Kind)
	}
	if tm.APIVersion != k.apiVersion {
		return nil, fmt.Errorf("%s: apiVersion %q, want %q", tm.Kind, tm.APIVersion, k.apiVersion)
	}
	obj := k.new()
	if err := decodeStrict(data, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// load reads this directory, the Containerfile and README, loads the ConfigMap's
// configuration with the config package (with the container's environment variables set,
// a placeholder for each that comes from a Secret), and starts an admin server.
func load(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{}
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeStrict(data, &b.kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); (ext == ".yaml" || ext == ".yml") && e.Name() != "kustomization.yaml" {
			b.yamlFiles = append(b.yamlFiles, e.Name())
		}
	}
	for _, r := range b.kust.Resources {
		data, err := os.ReadFile(r)
		if err != nil {
			b.decodeErrs = append(b.decodeErrs, fmt.Sprintf("resource %s: %v", r, err))
			continue
		}
		obj, err := decodeManifest(data)
		if err != nil {
			b.decodeErrs = append(b.decodeErrs, fmt.Sprintf("%s: %v", r, err))
			continue
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			if b.sts != nil {
				b.decodeErrs = append(b.decodeErrs, r+": a second StatefulSet")
			}
			b.sts = o
		case *corev1.Service:
			b.services = append(b.services, o)
		case *corev1.ServiceAccount:
			b.account = o
		case *policyv1.PodDisruptionBudget:
			b.pdb = o
		case *corev1.ConfigMap:
			b.decodeErrs = append(b.decodeErrs, r+": the ConfigMap comes from configMapGenerator, not from a resource")
		}
	}
	if b.sts == nil || len(b.sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one StatefulSet with one container; decode problems: %v", b.decodeErrs)
	}
	if b.image, err = parseContainerfile(containerfilePath); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	if _, after, ok := strings.Cut(string(readme), "\n"+readmeSection+"\n"); ok {
		b.readme, _, _ = strings.Cut(after, "\n## ")
	}

	if len(b.kust.ConfigMapGenerator) > 0 {
		g := b.kust.ConfigMapGenerator[0]
		b.configMap = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: g.Name}, Data: map[string]string{}}
		for _, f := range g.Files {
			data, err := os.ReadFile(f)
			if err != nil {
				b.decodeErrs = append(b.decodeErrs, fmt.Sprintf("configMapGenerator %s: %v", g.Name, err))
				continue
			}
			b.configMap.Data[filepath.Base(f)] = string(data)
		}
	}
	c := container(b)
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "placeholder-for-" + strings.ToLower(e.Name)
		}
		t.Setenv(e.Name, v)
	}
	name := filepath.Base(b.image.configPath())
	text, ok := "", false
	if b.configMap != nil {
		text, ok = b.configMap.Data[name]
	}
	if !ok {
		b.cfgErr = fmt.Errorf("no %s in the generated ConfigMap", name)
	} else {
		b.cfg, b.cfgErr = config.Parse([]byte(text), name)
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatal(err)
		}
		b.cfgTree = &doc
	}
	b.adminURL = startAdmin(t)
	return b
}

// startAdmin runs the forwarder's admin server on a fresh WAL, as run does.
func startAdmin(t *testing.T) string {
	t.Helper()
	w, err := wal.Open(t.TempDir(), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := admin.New("127.0.0.1:0", admin.Sources{WAL: w, MaxBytes: 1 << 30, Listening: func() bool { return true }, Gatherer: reg},
		slog.New(slog.DiscardHandler))
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	})
	return "http://" + s.Addr().String()
}

func container(b *bundle) *corev1.Container { return &b.sts.Spec.Template.Spec.Containers[0] }

func listenPort(listen string) (int, error) {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// configPorts are the configuration's listeners by the container port name each must have.
func configPorts(cfg *config.Config) (inputs, all map[string]int, problems []string) {
	inputs, all = map[string]int{}, map[string]int{}
	add := func(name, listen string, input bool) {
		p, err := listenPort(listen)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s listen %q: %v", name, listen, err))
			return
		}
		all[name] = p
		if input {
			inputs[name] = p
		}
	}
	if f := cfg.Inputs.Forward; f != nil {
		add("forward", f.Listen, true)
	}
	if h := cfg.Inputs.HTTP; h != nil {
		add("http", h.Listen, true)
	}
	add("admin", cfg.Admin.Listen, false)
	return inputs, all, problems
}

// resolvePort gives the container port a probe's or a Service's port refers to, by name or
// number; 0 when it names none.
func resolvePort(c *corev1.Container, p intstr.IntOrString) int {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func isTrue(p *bool) bool { return p != nil && *p }

// check is one fact the manifests must hold; it returns what is wrong.
type check struct {
	name string
	run  func(b *bundle) []string
}

var checks = []check{
	{"kustomization", checkKustomization},
	{"config", checkConfig},
	{"ports", checkPorts},
	{"selectors", checkSelectors},
	{"probes", checkProbes},
	{"shutdown", checkShutdown},
	{"memory", checkMemory},
	{"data volume", checkDataVolume},
	{"config mount", checkConfigMount},
	{"env", checkEnv},
	{"tls", checkTLS},
	{"security", checkSecurity},
	{"identity", checkIdentity},
	{"disruption budget", checkPDB},
	{"image", checkImage},
	{"readme", checkReadme},
}

// checkKustomization: the kustomization lists every manifest in the directory and the
// generated ConfigMap's file, each exists and decodes strictly, and nothing else is there.
func checkKustomization(b *bundle) []string {
	p := slices.Clone(b.decodeErrs)
	if b.kust.APIVersion != "kustomize.config.k8s.io/v1beta1" || b.kust.Kind != "Kustomization" {
		p = append(p, fmt.Sprintf("kustomization.yaml is %s %s", b.kust.APIVersion, b.kust.Kind))
	}
	listed := map[string]int{}
	for _, r := range b.kust.Resources {
		listed[r]++
	}
	for _, g := range b.kust.ConfigMapGenerator {
		for _, f := range g.Files {
			listed[f]++
		}
	}
	for name, n := range listed {
		if n > 1 {
			p = append(p, fmt.Sprintf("%s is listed %d times", name, n))
		}
		if _, err := os.Stat(name); err != nil {
			p = append(p, fmt.Sprintf("kustomization lists %s: no such file", name))
		}
	}
	for _, f := range b.yamlFiles {
		if listed[f] == 0 {
			p = append(p, fmt.Sprintf("%s is not listed in kustomization.yaml (resources or configMapGenerator)", f))
		}
	}
	if len(b.kust.ConfigMapGenerator) != 1 {
		p = append(p, fmt.Sprintf("%d configMapGenerators, want one (the configuration)", len(b.kust.ConfigMapGenerator)))
	}
	if b.kust.Namespace == "" {
		p = append(p, "kustomization.yaml sets no namespace (README's DNS names assume one)")
	}
	return p
}

// checkConfig: the configuration loads, drains on shutdown, listens where other pods and
// the kubelet reach it, and names every S3 key and CloudWatch stream after the replica.
func checkConfig(b *bundle) []string {
	if b.cfgErr != nil {
		return []string{fmt.Sprintf("the ConfigMap's configuration does not load: %v", b.cfgErr)}
	}
	var p []string
	if !b.cfg.DrainOnShutdown {
		p = append(p, "drain_on_shutdown is false: a scaled-in replica's records would wait on its volume")
	}
	listeners := map[string]string{"admin.listen": b.cfg.Admin.Listen}
	if f := b.cfg.Inputs.Forward; f != nil {
		listeners["inputs.forward.listen"] = f.Listen
	} else {
		p = append(p, "no forward input")
	}
	if h := b.cfg.Inputs.HTTP; h != nil {
		listeners["inputs.http.listen"] = h.Listen
	}
	for key, l := range listeners {
		host, _, err := net.SplitHostPort(l)
		if err != nil || host != "0.0.0.0" {
			p = append(p, fmt.Sprintf("%s is %q: want 0.0.0.0, reachable from other pods and the kubelet", key, l))
		}
	}
	for _, s := range b.cfg.Sinks {
		switch {
		case s.S3 != nil && !strings.Contains(s.S3.Key, "${hostname}"):
			p = append(p, fmt.Sprintf("sink %s: key %q lacks ${hostname}: replicas would write the same keys", s.Name, s.S3.Key))
		case s.CloudWatch != nil && !strings.Contains(s.CloudWatch.LogStream, "${hostname}"):
			p = append(p, fmt.Sprintf("sink %s: log_stream %q lacks ${hostname}: replicas would write the same streams", s.Name, s.CloudWatch.LogStream))
		}
	}
	return p
}

// checkPorts: the container's ports, both Services' ports and the image's EXPOSE are the
// configuration's listeners.
func checkPorts(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	inputs, all, p := configPorts(b.cfg)
	c := container(b)
	got := map[string]int{}
	for _, cp := range c.Ports {
		got[cp.Name] = int(cp.ContainerPort)
		if cp.Protocol != corev1.ProtocolTCP {
			p = append(p, fmt.Sprintf("container port %s: protocol %q, want TCP", cp.Name, cp.Protocol))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(all) {
		p = append(p, fmt.Sprintf("container ports %v, the configuration listens on %v", got, all))
	}
	var exposed []string
	for _, port := range all {
		exposed = append(exposed, fmt.Sprintf("%d/tcp", port))
	}
	sort.Strings(exposed)
	if img := slices.Sorted(slices.Values(b.image.exposed)); !slices.Equal(img, exposed) {
		p = append(p, fmt.Sprintf("the Containerfile exposes %v, the configuration listens on %v", img, exposed))
	}
	for _, svc := range b.services {
		want := inputs
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			want = all // the headless Service also names each replica's admin port, for scraping
		}
		got := map[string]int{}
		for _, sp := range svc.Spec.Ports {
			got[sp.Name] = int(sp.Port)
			if target := resolvePort(c, sp.TargetPort); target != want[sp.Name] {
				p = append(p, fmt.Sprintf("Service %s port %s: targetPort %s is container port %d, the configuration listens on %d",
					svc.Name, sp.Name, sp.TargetPort.String(), target, want[sp.Name]))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			p = append(p, fmt.Sprintf("Service %s ports %v, want %v", svc.Name, got, want))
		}
	}
	return p
}

// checkSelectors: one client Service and one headless Service (the StatefulSet's
// serviceName), and every selector picks the StatefulSet's pods.
func checkSelectors(b *bundle) []string {
	var p []string
	labels := b.sts.Spec.Template.Labels
	if b.sts.Spec.Selector == nil || !subset(b.sts.Spec.Selector.MatchLabels, labels) {
		p = append(p, "the StatefulSet's selector does not match its pod template's labels")
	}
	headless, client := 0, 0
	for _, svc := range b.services {
		if !subset(svc.Spec.Selector, labels) {
			p = append(p, fmt.Sprintf("Service %s selects %v, not the pods (%v)", svc.Name, svc.Spec.Selector, labels))
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			headless++
			if svc.Name != b.sts.Spec.ServiceName {
				p = append(p, fmt.Sprintf("headless Service %s is not the StatefulSet's serviceName %q", svc.Name, b.sts.Spec.ServiceName))
			}
		} else {
			client++
		}
	}
	if headless != 1 || client != 1 {
		p = append(p, fmt.Sprintf("%d headless and %d other Services: want one of each", headless, client))
	}
	if b.pdb != nil && (b.pdb.Spec.Selector == nil || !subset(b.pdb.Spec.Selector.MatchLabels, labels)) {
		p = append(p, "the PodDisruptionBudget's selector does not match the pods")
	}
	return p
}

// checkProbes: readiness on /readyz and liveness (and start-up) on /healthz, on the admin
// port, and the admin server answers 200 on each path. Liveness must not be /readyz: a full
// WAL makes a replica unready, and restarting it would not empty it.
func checkProbes(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	var p []string
	c := container(b)
	adminPort, _ := listenPort(b.cfg.Admin.Listen)
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}, {"startupProbe", c.StartupProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			p = append(p, pr.name+": missing, or not an httpGet")
			continue
		}
		g := pr.probe.HTTPGet
		if g.Path != pr.path {
			p = append(p, fmt.Sprintf("%s: path %s, want %s", pr.name, g.Path, pr.path))
		}
		if port := resolvePort(c, g.Port); port != adminPort {
			p = append(p, fmt.Sprintf("%s: port %s is container port %d, admin.listen is port %d", pr.name, g.Port.String(), port, adminPort))
		}
		res, err := http.Get(b.adminURL + g.Path)
		if err != nil {
			p = append(p, fmt.Sprintf("%s: GET %s: %v", pr.name, g.Path, err))
			continue
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			p = append(p, fmt.Sprintf("%s: the admin server answers %s with %d", pr.name, g.Path, res.StatusCode))
		}
	}
	return p
}

// checkShutdown: the kubelet waits longer than the forwarder's own shutdown_timeout.
func checkShutdown(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	// A pod leaves the Services' endpoints as it begins to stop; clients and nodes learn
	// of it over seconds, which the preStop sleep waits out before SIGTERM.
	c := container(b)
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
		return []string{"no preStop sleep: connections routed to a stopping pod before its endpoints were removed everywhere would be refused"}
	}
	sleep := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	grace := b.sts.Spec.Template.Spec.TerminationGracePeriodSeconds
	timeout := time.Duration(b.cfg.ShutdownTimeout)
	if grace == nil || time.Duration(*grace)*time.Second <= sleep+timeout {
		return []string{fmt.Sprintf("terminationGracePeriodSeconds %v is not above the preStop sleep %s and shutdown_timeout %s: the SIGKILL would cut the drain", derefInt(grace), sleep, timeout)}
	}
	return nil
}

func derefInt(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// checkMemory: the container's memory limit is above memory_limit, the runtime's soft
// limit, which the process may pass by what the runtime does not count.
func checkMemory(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	c := container(b)
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return []string{"no memory limit"}
	}
	if limit.Value() <= int64(b.cfg.MemoryLimit) {
		return []string{fmt.Sprintf("memory limit %s is not above memory_limit %s", limit.String(), b.cfg.MemoryLimit)}
	}
	return nil
}

// checkDataVolume: the volumeClaimTemplate is mounted at data_dir, which is the image's
// VOLUME and owned by the image's user there, and it holds wal.max_bytes as the WAL file
// stores it (about 1.25 times) plus wal.min_free_bytes, twice with S3 staging, and the
// staging.
func checkDataVolume(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	var p []string
	if len(b.sts.Spec.VolumeClaimTemplates) != 1 {
		return []string{fmt.Sprintf("%d volumeClaimTemplates, want one for data_dir", len(b.sts.Spec.VolumeClaimTemplates))}
	}
	pvc := b.sts.Spec.VolumeClaimTemplates[0]
	mounted := ""
	for _, m := range container(b).VolumeMounts {
		if m.Name == pvc.Name {
			mounted = m.MountPath
			if m.ReadOnly {
				p = append(p, "the data volume is mounted read-only")
			}
		}
	}
	if mounted != b.cfg.DataDir {
		p = append(p, fmt.Sprintf("volume %s is mounted at %q, data_dir is %q", pvc.Name, mounted, b.cfg.DataDir))
	}
	if !slices.Equal(b.image.volumes, []string{b.cfg.DataDir}) {
		p = append(p, fmt.Sprintf("the Containerfile's VOLUME is %v, data_dir is %q", b.image.volumes, b.cfg.DataDir))
	}
	if owner := b.image.chowned[b.cfg.DataDir+"/"]; owner != fmt.Sprintf("%d:%d", b.image.uid, b.image.gid) {
		p = append(p, fmt.Sprintf("the image's data_dir is owned by %q, not by its USER %d:%d", owner, b.image.uid, b.image.gid))
	}
	if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
		p = append(p, fmt.Sprintf("access modes %v, want ReadWriteOnce: one replica's WAL", pvc.Spec.AccessModes))
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	var staging int64 // the S3 sinks' staged objects share the volume (README.md, Kubernetes)
	for _, s := range b.cfg.Sinks {
		if s.S3 != nil {
			staging += int64(s.S3.StagingMaxBytes)
		}
	}
	need := int64(b.cfg.WAL.MaxBytes)*5/4 + int64(b.cfg.WAL.MinFreeBytes) + staging
	if staging > 0 {
		need += int64(b.cfg.WAL.MinFreeBytes) // staging stops short of twice it
	}
	if size.Value() < need {
		p = append(p, fmt.Sprintf("volume of %s: wal.max_bytes %s stored (x1.25) plus min_free_bytes %s (twice with staging) plus the S3 sinks' staging_max_bytes (%d bytes) need %s",
			size.String(), b.cfg.WAL.MaxBytes, b.cfg.WAL.MinFreeBytes, staging, resource.NewQuantity(need, resource.BinarySI)))
	}
	return p
}

// checkConfigMount: the generated ConfigMap is mounted where the image's entrypoint reads
// its configuration, and the container leaves the entrypoint's arguments alone.
func checkConfigMount(b *bundle) []string {
	var p []string
	c := container(b)
	path := b.image.configPath()
	if path == "" {
		return []string{"the Containerfile's ENTRYPOINT has no -c FILE"}
	}
	if len(c.Command) > 0 || len(c.Args) > 0 {
		p = append(p, fmt.Sprintf("the container sets command %v and args %v: the image's entrypoint reads %s", c.Command, c.Args, path))
	}
	if b.configMap == nil {
		return append(p, "no configMapGenerator")
	}
	vol := ""
	for _, v := range b.sts.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == b.configMap.Name {
			vol = v.Name
		}
	}
	if vol == "" {
		return append(p, fmt.Sprintf("no volume of the ConfigMap %s", b.configMap.Name))
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == vol && m.MountPath == filepath.Dir(path) && m.SubPath == "" {
			mounted = true
		}
	}
	if !mounted {
		p = append(p, fmt.Sprintf("volume %s (ConfigMap %s) is not mounted at %s, where the entrypoint reads %s", vol, b.configMap.Name, filepath.Dir(path), path))
	}
	if b.image.copies[path] != filepath.Base(path) {
		p = append(p, fmt.Sprintf("the image does not copy its default configuration to %s", path))
	}
	return p
}

// envRefs are the NAMEs of the ${env.NAME} references in the configuration's values.
func envRefs(n *yaml.Node) []string {
	re := regexp.MustCompile(`(^|[^$])\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}`)
	var out []string
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.ScalarNode {
			for _, m := range re.FindAllStringSubmatch(n.Value, -1) {
				out = append(out, m[2])
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	return out
}

var secretLike = regexp.MustCompile(`(?i)(KEY|TOKEN|PASSWORD|SECRET)$`)

// checkEnv: every ${env.NAME} of the configuration is set in the container, and every
// value that is a secret comes from a Secret, not from the manifest.
func checkEnv(b *bundle) []string {
	if b.cfgTree == nil {
		return []string{"no configuration to compare with"}
	}
	var p []string
	env := map[string]corev1.EnvVar{}
	for _, e := range container(b).Env {
		env[e.Name] = e
	}
	for _, name := range envRefs(b.cfgTree) {
		if _, ok := env[name]; !ok {
			p = append(p, fmt.Sprintf("the configuration reads ${env.%s}, which the container does not set", name))
		}
	}
	for _, e := range container(b).Env {
		if secretLike.MatchString(e.Name) && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			p = append(p, fmt.Sprintf("env %s looks like a secret and is not from a Secret", e.Name))
		}
	}
	return p
}

// checkTLS: every TLS file the configuration names is in a mounted Secret.
func checkTLS(b *bundle) []string {
	if b.cfg == nil {
		return []string{"no configuration to compare with"}
	}
	var files []string
	if f := b.cfg.Inputs.Forward; f != nil {
		files = append(files, f.TLS.CertFile, f.TLS.KeyFile, f.TLS.ClientCAFile)
	}
	if h := b.cfg.Inputs.HTTP; h != nil {
		files = append(files, h.TLS.CertFile, h.TLS.KeyFile)
	}
	secretVolumes := map[string]bool{}
	for _, v := range b.sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	var p []string
	for _, f := range files {
		if f == "" {
			continue
		}
		in := false
		for _, m := range container(b).VolumeMounts {
			if secretVolumes[m.Name] && strings.HasPrefix(f, strings.TrimSuffix(m.MountPath, "/")+"/") {
				in = true
			}
		}
		if !in {
			p = append(p, fmt.Sprintf("TLS file %s is in no mounted Secret", f))
		}
	}
	return p
}

// checkSecurity: the restricted Pod Security Standard, and the image's numeric non-root
// user as runAsUser.
func checkSecurity(b *bundle) []string {
	var p []string
	if b.image.uid == 0 || b.image.gid == 0 {
		p = append(p, fmt.Sprintf("the image's USER %d:%d is root", b.image.uid, b.image.gid))
	}
	pod := b.sts.Spec.Template.Spec.SecurityContext
	if pod == nil {
		return append(p, "no pod securityContext")
	}
	if !isTrue(pod.RunAsNonRoot) {
		p = append(p, "pod: runAsNonRoot is not true")
	}
	if pod.RunAsUser == nil || *pod.RunAsUser != int64(b.image.uid) {
		p = append(p, fmt.Sprintf("pod: runAsUser %v, the image's USER is %d", derefInt(pod.RunAsUser), b.image.uid))
	}
	if pod.RunAsGroup == nil || *pod.RunAsGroup != int64(b.image.gid) {
		p = append(p, fmt.Sprintf("pod: runAsGroup %v, the image's group is %d", derefInt(pod.RunAsGroup), b.image.gid))
	}
	if pod.FSGroup == nil || *pod.FSGroup != int64(b.image.gid) {
		p = append(p, fmt.Sprintf("pod: fsGroup %v, want the image's group %d so that the volume is writable", derefInt(pod.FSGroup), b.image.gid))
	}
	if pod.SeccompProfile == nil || pod.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p = append(p, "pod: seccompProfile is not RuntimeDefault")
	}
	sc := container(b).SecurityContext
	if sc == nil {
		return append(p, "no container securityContext")
	}
	if !isTrue(sc.RunAsNonRoot) {
		p = append(p, "container: runAsNonRoot is not true")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser != int64(b.image.uid) {
		p = append(p, fmt.Sprintf("container: runAsUser %d, the image's USER is %d", *sc.RunAsUser, b.image.uid))
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		p = append(p, "container: allowPrivilegeEscalation is not false")
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		p = append(p, "container: readOnlyRootFilesystem is not true")
	}
	if sc.Privileged != nil && *sc.Privileged {
		p = append(p, "container: privileged")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		p = append(p, "container: capabilities are not drop [ALL] with none added")
	}
	if sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p = append(p, "container: seccompProfile is not RuntimeDefault")
	}
	return p
}

// checkIdentity: the pods run as the ServiceAccount that carries the IRSA role annotation.
func checkIdentity(b *bundle) []string {
	if b.account == nil {
		return []string{"no ServiceAccount"}
	}
	var p []string
	spec := b.sts.Spec.Template.Spec
	if spec.ServiceAccountName != b.account.Name {
		p = append(p, fmt.Sprintf("the pods run as ServiceAccount %q, the manifest is %q", spec.ServiceAccountName, b.account.Name))
	}
	if arn := b.account.Annotations["eks.amazonaws.com/role-arn"]; !strings.HasPrefix(arn, "arn:aws:iam::") {
		p = append(p, fmt.Sprintf("ServiceAccount: eks.amazonaws.com/role-arn is %q, want an IAM role ARN", arn))
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p = append(p, "the pods mount a Kubernetes API token they never use")
	}
	return p
}

// checkPDB: voluntary disruptions take one replica at a time, and never all.
func checkPDB(b *bundle) []string {
	if b.pdb == nil {
		return []string{"no PodDisruptionBudget"}
	}
	replicas := int32(1)
	if b.sts.Spec.Replicas != nil {
		replicas = *b.sts.Spec.Replicas
	}
	mu := b.pdb.Spec.MaxUnavailable
	if mu == nil || mu.Type != intstr.Int || mu.IntVal < 1 || mu.IntVal >= replicas {
		return []string{fmt.Sprintf("maxUnavailable %v: want a number of replicas from 1 to %d", mu, replicas-1)}
	}
	// Unready replicas (full WALs) must not block drains: their records are on their volumes.
	if pol := b.pdb.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
		return []string{"unhealthyPodEvictionPolicy is not AlwaysAllow: replicas whose WALs are full would block node drains"}
	}
	return nil
}

// checkImage: the container's image is the one kustomization.yaml's images entry sets.
func checkImage(b *bundle) []string {
	for _, im := range b.kust.Images {
		if im.Name == container(b).Image && im.NewName != "" {
			// A node keeps the image it pulled first under a tag that moves.
			if (im.NewTag == "" || im.NewTag == "latest") && container(b).ImagePullPolicy != corev1.PullAlways {
				return []string{fmt.Sprintf("image tag %q moves, and imagePullPolicy %s keeps each node's first pull of it", im.NewTag, container(b).ImagePullPolicy)}
			}
			return nil
		}
	}
	return []string{fmt.Sprintf("image %q has no images entry in kustomization.yaml", container(b).Image)}
}

// checkReadme: README's Kubernetes section names the Secrets the pods need, with their keys,
// and its Fluent Bit Upstream has a node for every replica, by its headless DNS name.
func checkReadme(b *bundle) []string {
	if b.readme == "" {
		return []string{"README.md has no " + readmeSection + " section"}
	}
	var p []string
	for _, want := range []string{"kubectl apply -k deploy/kubernetes", "make image"} {
		if !strings.Contains(b.readme, want) {
			p = append(p, fmt.Sprintf("README's Kubernetes section does not say %q", want))
		}
	}
	spec := b.sts.Spec.Template.Spec
	for _, e := range container(b).Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			if !strings.Contains(b.readme, "secret generic "+ref.Name) || !strings.Contains(b.readme, "--from-literal="+ref.Key+"=") {
				p = append(p, fmt.Sprintf("README does not say how to create Secret %s with key %s", ref.Name, ref.Key))
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil && !strings.Contains(b.readme, "secret tls "+v.Secret.SecretName) {
			p = append(p, fmt.Sprintf("README does not say how to create Secret %s", v.Secret.SecretName))
		}
	}
	replicas := int32(1)
	if b.sts.Spec.Replicas != nil {
		replicas = *b.sts.Spec.Replicas
	}
	forward := 0
	if b.cfg != nil && b.cfg.Inputs.Forward != nil {
		forward, _ = listenPort(b.cfg.Inputs.Forward.Listen)
	}
	for i := range replicas {
		host := fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local", b.sts.Name, i, b.sts.Spec.ServiceName, b.kust.Namespace)
		re := regexp.MustCompile(`(?m)^\s*host\s+` + regexp.QuoteMeta(host) + `\s*\n\s*port\s+` + strconv.Itoa(forward) + `\s*$`)
		if !re.MatchString(b.readme) {
			p = append(p, fmt.Sprintf("README's Fluent Bit Upstream has no node with host %s and port %d", host, forward))
		}
	}
	return p
}

// TestManifests runs every check on the files as they are.
func TestManifests(t *testing.T) {
	b := load(t)
	for _, c := range checks {
		for _, problem := range c.run(b) {
			t.Errorf("%s: %s", c.name, problem)
		}
	}
}

// TestKustomizeBuild builds the directory with kubectl's kustomize, as kubectl apply -k
// does, and decodes what it gives strictly: the generated ConfigMap holds forwarder.yaml, the
// StatefulSet mounts it by its hashed name, every object is in the namespace, and the
// container runs the image the images entry names. kubectl is part of the development
// machine's image but is not a Debian package; without it the test skips, saying so
// (README.md, section Kubernetes).
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the kustomize build is not checked (kubectl kustomize deploy/kubernetes)")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", ".")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	b := load(t)
	dec := yaml.NewDecoder(bytes.NewReader(out))
	var (
		sts       *appsv1.StatefulSet
		configMap *corev1.ConfigMap
		n         int
	)
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		data, err := yaml.Marshal(&doc)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeManifest(data)
		if err != nil {
			t.Fatalf("kustomize output, document %d: %v", n+1, err)
		}
		n++
		meta := obj.(metav1.Object)
		if meta.GetNamespace() != b.kust.Namespace {
			t.Errorf("%s is in namespace %q, want %q", meta.GetName(), meta.GetNamespace(), b.kust.Namespace)
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			sts = o
		case *corev1.ConfigMap:
			configMap = o
		}
	}
	if want := len(b.kust.Resources) + len(b.kust.ConfigMapGenerator); n != want {
		t.Errorf("kustomize gave %d objects, want %d", n, want)
	}
	if sts == nil || configMap == nil {
		t.Fatalf("kustomize gave no StatefulSet or no ConfigMap")
	}
	if !strings.HasPrefix(configMap.Name, b.configMap.Name+"-") {
		t.Errorf("generated ConfigMap %s, want %s with a hash", configMap.Name, b.configMap.Name)
	}
	if fmt.Sprint(configMap.Data) != fmt.Sprint(b.configMap.Data) {
		t.Errorf("the generated ConfigMap's data differs from %v", slices.Collect(maps.Keys(b.configMap.Data)))
	}
	mounted := false
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == configMap.Name {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the built StatefulSet does not mount ConfigMap %s", configMap.Name)
	}
	im := b.kust.Images[0]
	if got, want := sts.Spec.Template.Spec.Containers[0].Image, im.NewName+":"+im.NewTag; got != want {
		t.Errorf("the built StatefulSet runs %s, want %s", got, want)
	}
}
