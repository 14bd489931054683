// Package inspect holds manifests an operator applies by hand, beside the deployment of
// deploy/kubernetes: wal-stats-job.yaml reads what a kept volume's WAL holds. The test
// decodes it strictly into the Kubernetes API types and checks it against the
// StatefulSet, the kustomization's image, the configuration and the image's entrypoint.
package inspect

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/logfwd/forwarder/config"
)

// decodeStrict decodes one YAML document as the API server's strict field validation
// would: unknown and duplicate fields are errors.
func decodeStrict(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := sigsyaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	strict, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type kustomization struct {
	Namespace string `json:"namespace"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

func TestWALStatsJob(t *testing.T) {
	var job batchv1.Job
	decodeStrict(t, "wal-stats-job.yaml", &job)
	if job.APIVersion != "batch/v1" || job.Kind != "Job" {
		t.Fatalf("wal-stats-job.yaml is %s %s", job.APIVersion, job.Kind)
	}
	var sts appsv1.StatefulSet
	decodeStrict(t, "../statefulset.yaml", &sts)
	var kust kustomization
	data, err := os.ReadFile("../kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal(data, &kust); err != nil { // the kubernetes package's test decodes it strictly
		t.Fatal(err)
	}
	cfg, err := config.LoadWAL("../forwarder.yaml") // as the image holds it; no ${env.NAME} needed
	if err != nil {
		t.Fatalf("wal stats cannot read the image's configuration: %v", err)
	}

	if job.Namespace != kust.Namespace {
		t.Errorf("namespace %q, the deployment's is %q", job.Namespace, kust.Namespace)
	}
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 || job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Error("the Job is tried again: a failure (a volume still attached elsewhere, say) is to be read, once")
	}
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := sts.Spec.Template.Spec.Containers[0]

	// The image the StatefulSet runs, as the kustomization names it.
	want := ""
	for _, im := range kust.Images {
		if im.Name == sc.Image {
			want = im.NewName + ":" + im.NewTag
		}
	}
	if c.Image != want {
		t.Errorf("image %q, the StatefulSet runs %q", c.Image, want)
	}

	// wal stats, with the configuration the entrypoint reads.
	cf, err := os.ReadFile("../../container/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)", "run", "-c", "([^"]+)"\]$`).FindSubmatch(cf)
	if m == nil {
		t.Fatal("the Containerfile's ENTRYPOINT is not [binary, run, -c, file]")
	}
	if wantCmd := []string{string(m[1]), "wal", "stats", "-c", string(m[2])}; !slices.Equal(c.Command, wantCmd) || len(c.Args) != 0 {
		t.Errorf("command %q args %q, want %q", c.Command, c.Args, wantCmd)
	}

	// The volume of a replica scaled in first (the highest ordinal), mounted read-only
	// where data_dir is.
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.Replicas == nil {
		t.Fatal("the StatefulSet has not one volumeClaimTemplate and a replica count")
	}
	tmpl := sts.Spec.VolumeClaimTemplates[0].Name
	claim := fmt.Sprintf("%s-%s-%d", tmpl, sts.Name, *sts.Spec.Replicas-1)
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].PersistentVolumeClaim != nil {
			vol = &pod.Volumes[i]
		}
	}
	if vol == nil || vol.PersistentVolumeClaim.ClaimName != claim || !vol.PersistentVolumeClaim.ReadOnly {
		t.Fatalf("volumes %+v: want claim %s, read-only", pod.Volumes, claim)
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.Name == vol.Name {
			mounted = true
			if vm.MountPath != cfg.DataDir || !vm.ReadOnly {
				t.Errorf("the volume is mounted at %s (read-only %v), data_dir is %s: want it there, read-only", vm.MountPath, vm.ReadOnly, cfg.DataDir)
			}
		}
	}
	for _, vm := range sc.VolumeMounts {
		if vm.Name == tmpl && vm.MountPath != cfg.DataDir {
			t.Errorf("the StatefulSet mounts its volume at %s, data_dir is %s", vm.MountPath, cfg.DataDir)
		}
	}
	if !mounted {
		t.Error("the volume is not mounted")
	}
	if strings.Count(string(mustRead(t, "wal-stats-job.yaml")), "claimName: "+claim) != 1 {
		t.Errorf("the file does not name %s once", claim)
	}

	// The StatefulSet's user and restrictions: the volume's files are the service's.
	ps, ss := pod.SecurityContext, sts.Spec.Template.Spec.SecurityContext
	if ps == nil || !reflect.DeepEqual(ps.RunAsUser, ss.RunAsUser) || !reflect.DeepEqual(ps.RunAsGroup, ss.RunAsGroup) ||
		!reflect.DeepEqual(ps.RunAsNonRoot, ss.RunAsNonRoot) || !reflect.DeepEqual(ps.SeccompProfile, ss.SeccompProfile) {
		t.Errorf("pod securityContext %+v, the StatefulSet's %+v", ps, ss)
	}
	if !reflect.DeepEqual(c.SecurityContext, sc.SecurityContext) {
		t.Errorf("container securityContext %+v, the StatefulSet's %+v", c.SecurityContext, sc.SecurityContext)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the Job mounts a service account token it does not use")
	}
	if q := c.Resources.Limits.Memory(); q.IsZero() {
		t.Error("no memory limit")
	}

	// README says how to use it.
	readme := string(mustRead(t, "../../../README.md"))
	for _, s := range []string{"deploy/kubernetes/inspect/wal-stats-job.yaml", "job/" + job.Name} {
		if !strings.Contains(readme, s) {
			t.Errorf("README.md does not mention %s", s)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
