package kubernetes

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/logfwd/forwarder/config"
)

func ptr[T any](v T) *T { return &v }

// TestChecksCatchBrokenManifests breaks the loaded manifests one way at a time and expects
// the check for that fact to say so: no check passes whatever the files say.
func TestChecksCatchBrokenManifests(t *testing.T) {
	byName := map[string]check{}
	for _, c := range checks {
		byName[c.name] = c
	}
	cases := []struct {
		check, name string
		breakIt     func(b *bundle)
		want        string
	}{
		{"kustomization", "a manifest not listed", func(b *bundle) { b.kust.Resources = b.kust.Resources[1:] }, "is not listed in kustomization.yaml"},
		{"kustomization", "a listed file missing", func(b *bundle) { b.kust.Resources = append(b.kust.Resources, "ingress.yaml") }, "lists ingress.yaml: no such file"},
		{"kustomization", "a manifest that does not decode", func(b *bundle) { b.decodeErrs = append(b.decodeErrs, "x.yaml: unknown field") }, "x.yaml: unknown field"},
		{"config", "the configuration does not load", func(b *bundle) { b.cfgErr = errors.New("forwarder.yaml:3: bad") }, "does not load"},
		{"config", "drain_on_shutdown off", func(b *bundle) { b.cfg.DrainOnShutdown = false }, "drain_on_shutdown is false"},
		{"config", "an input on loopback", func(b *bundle) { b.cfg.Inputs.Forward.Listen = "127.0.0.1:24224" }, "inputs.forward.listen"},
		{"config", "admin on loopback", func(b *bundle) { b.cfg.Admin.Listen = "127.0.0.1:9880" }, "admin.listen"},
		{"config", "an S3 key without the replica", func(b *bundle) { sink(b, config.SinkS3).S3.Key = "logs/${tag}/${seq}.json.gz" }, "lacks ${hostname}"},
		{"config", "a stream without the replica", func(b *bundle) { sink(b, config.SinkCloudWatch).CloudWatch.LogStream = "${tag}" }, "lacks ${hostname}"},
		{"ports", "a container port unlike the listener", func(b *bundle) { container(b).Ports[0].ContainerPort = 24225 }, "container ports"},
		{"ports", "a listener unlike the ports", func(b *bundle) { b.cfg.Inputs.HTTP.Listen = "0.0.0.0:8081" }, "container ports"},
		{"ports", "a Service port unlike the listener", func(b *bundle) { service(b, false).Spec.Ports[1].Port = 80 }, "ports map"},
		{"ports", "a targetPort naming no container port", func(b *bundle) { service(b, false).Spec.Ports[0].TargetPort = intstr.FromString("fwd") }, "targetPort fwd"},
		{"ports", "the headless Service without admin", func(b *bundle) {
			s := service(b, true)
			s.Spec.Ports = s.Spec.Ports[:2]
		}, "Service forwarder-headless ports"},
		{"ports", "EXPOSE unlike the listeners", func(b *bundle) { b.image.exposed = []string{"24224/tcp", "8080/tcp"} }, "the Containerfile exposes"},
		{"selectors", "a Service selecting other pods", func(b *bundle) { service(b, false).Spec.Selector = map[string]string{"app": "other"} }, "selects"},
		{"selectors", "serviceName not the headless Service", func(b *bundle) { b.sts.Spec.ServiceName = "forwarder" }, "not the StatefulSet's serviceName"},
		{"selectors", "a PDB selecting other pods", func(b *bundle) { b.pdb.Spec.Selector.MatchLabels = map[string]string{"app": "x"} }, "PodDisruptionBudget's selector"},
		{"probes", "readiness on a path the admin server lacks", func(b *bundle) { container(b).ReadinessProbe.HTTPGet.Path = "/ready" }, "answers /ready with 404"},
		{"probes", "liveness on /readyz", func(b *bundle) { container(b).LivenessProbe.HTTPGet.Path = "/readyz" }, "livenessProbe: path /readyz, want /healthz"},
		{"probes", "a probe on an input port", func(b *bundle) { container(b).StartupProbe.HTTPGet.Port = intstr.FromString("http") }, "admin.listen is port 9880"},
		{"probes", "no readiness probe", func(b *bundle) { container(b).ReadinessProbe = nil }, "readinessProbe: missing"},
		{"shutdown", "a grace period equal to shutdown_timeout", func(b *bundle) {
			b.sts.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(int64(60))
		}, "is not above the preStop sleep"},
		{"shutdown", "a shutdown_timeout above the grace period", func(b *bundle) { b.cfg.ShutdownTimeout = config.Duration(100e9) }, "is not above the preStop sleep"},
		{"shutdown", "a preStop sleep that eats the grace period", func(b *bundle) { container(b).Lifecycle.PreStop.Sleep.Seconds = 40 }, "is not above the preStop sleep 40s"},
		{"shutdown", "no preStop sleep", func(b *bundle) { container(b).Lifecycle = nil }, "no preStop sleep"},
		{"memory", "a memory limit equal to memory_limit", func(b *bundle) {
			container(b).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("256Mi")
		}, "is not above memory_limit"},
		{"memory", "no memory limit", func(b *bundle) { delete(container(b).Resources.Limits, corev1.ResourceMemory) }, "no memory limit"},
		{"data volume", "the volume elsewhere than data_dir", func(b *bundle) { mount(b, "data").MountPath = "/data" }, "data_dir is"},
		{"data volume", "an image VOLUME elsewhere", func(b *bundle) { b.image.volumes = []string{"/data"} }, "the Containerfile's VOLUME"},
		{"data volume", "the image's data_dir owned by root", func(b *bundle) { delete(b.image.chowned, "/var/lib/forwarder/") }, "the image's data_dir is owned by"},
		{"data volume", "a volume smaller than the WAL", func(b *bundle) {
			b.sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("10Gi")
		}, "need"},
		{"config mount", "the ConfigMap elsewhere", func(b *bundle) { mount(b, "config").MountPath = "/config" }, "is not mounted at /etc/forwarder"},
		{"config mount", "args that replace the entrypoint's", func(b *bundle) { container(b).Args = []string{"run", "-c", "/config.yaml"} }, "the container sets command"},
		{"config mount", "a volume of another ConfigMap", func(b *bundle) { b.configMap.Name = "forwarder-settings" }, "no volume of the ConfigMap"},
		{"env", "a variable the configuration reads missing", func(b *bundle) { dropEnv(b, "S3_BUCKET") }, "${env.S3_BUCKET}"},
		{"env", "a secret written in the manifest", func(b *bundle) {
			e := env(b, "FORWARDER_SHARED_KEY")
			e.ValueFrom, e.Value = nil, "hunter2"
		}, "FORWARDER_SHARED_KEY looks like a secret"},
		{"tls", "the TLS Secret mounted elsewhere", func(b *bundle) { mount(b, "tls").MountPath = "/tls" }, "is in no mounted Secret"},
		{"security", "runAsUser not the image's user", func(b *bundle) { b.sts.Spec.Template.Spec.SecurityContext.RunAsUser = ptr(int64(1000)) }, "pod: runAsUser 1000"},
		{"security", "an image user unlike runAsUser", func(b *bundle) { b.image.uid = 1001 }, "the image's USER is 1001"},
		{"security", "an image running as root", func(b *bundle) { b.image.uid = 0 }, "is root"},
		{"security", "a writable root file system", func(b *bundle) { container(b).SecurityContext.ReadOnlyRootFilesystem = ptr(false) }, "readOnlyRootFilesystem"},
		{"security", "privilege escalation", func(b *bundle) { container(b).SecurityContext.AllowPrivilegeEscalation = nil }, "allowPrivilegeEscalation"},
		{"security", "capabilities kept", func(b *bundle) { container(b).SecurityContext.Capabilities.Drop = nil }, "capabilities"},
		{"security", "no seccomp profile", func(b *bundle) { b.sts.Spec.Template.Spec.SecurityContext.SeccompProfile = nil }, "seccompProfile"},
		{"security", "root allowed", func(b *bundle) { b.sts.Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil }, "pod: runAsNonRoot"},
		{"security", "no fsGroup", func(b *bundle) { b.sts.Spec.Template.Spec.SecurityContext.FSGroup = nil }, "fsGroup"},
		{"identity", "no IRSA annotation", func(b *bundle) { delete(b.account.Annotations, "eks.amazonaws.com/role-arn") }, "eks.amazonaws.com/role-arn"},
		{"identity", "another ServiceAccount", func(b *bundle) { b.sts.Spec.Template.Spec.ServiceAccountName = "default" }, "run as ServiceAccount"},
		{"disruption budget", "all replicas at once", func(b *bundle) { b.pdb.Spec.MaxUnavailable = ptr(intstr.FromInt32(3)) }, "maxUnavailable"},
		{"disruption budget", "unready replicas block drains", func(b *bundle) { b.pdb.Spec.UnhealthyPodEvictionPolicy = nil }, "unhealthyPodEvictionPolicy"},
		{"image", "an image kustomize does not set", func(b *bundle) { container(b).Image = "forwarder-dev" }, "has no images entry"},
		{"image", "a tag that moves", func(b *bundle) { b.kust.Images[0].NewTag = "latest" }, "moves"},
		{"readme", "a replica missing from the Upstream", func(b *bundle) { replicas := int32(4); b.sts.Spec.Replicas = &replicas }, "forwarder-3.forwarder-headless"},
		{"readme", "a Secret README does not create", func(b *bundle) { env(b, "FORWARDER_HTTP_TOKEN").ValueFrom.SecretKeyRef.Key = "token" }, "Secret forwarder with key token"},
		{"readme", "no Kubernetes section", func(b *bundle) { b.readme = "" }, "has no ## Kubernetes section"},
	}
	for _, tc := range cases {
		t.Run(tc.check+"/"+tc.name, func(t *testing.T) {
			c, ok := byName[tc.check]
			if !ok {
				t.Fatalf("no check %q", tc.check)
			}
			b := load(t)
			if p := c.run(b); len(p) > 0 {
				t.Fatalf("fails before it is broken: %v", p)
			}
			tc.breakIt(b)
			p := c.run(b)
			if !strings.Contains(strings.Join(p, "\n"), tc.want) {
				t.Fatalf("broken, it says %q; want a problem with %q", p, tc.want)
			}
		})
	}
}

// TestDecodeIsStrict: a manifest with a field the API type lacks, a field in the wrong
// case, a duplicate field, a wrong apiVersion or a second document does not decode.
func TestDecodeIsStrict(t *testing.T) {
	good, err := os.ReadFile("statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeManifest(good); err != nil {
		t.Fatalf("statefulset.yaml: %v", err)
	}
	edit := func(old, new string) []byte {
		if !strings.Contains(string(good), old) {
			t.Fatalf("statefulset.yaml has no %q", old)
		}
		return []byte(strings.Replace(string(good), old, new, 1))
	}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"unknown field":   {edit("  replicas: 3\n", "  replicas: 3\n  replica: 3\n"), `unknown field "spec.replica"`},
		"wrong case":      {edit("  serviceName:", "  servicename:"), "servicename"},
		"nested unknown":  {edit("            readOnlyRootFilesystem: true\n", "            readOnlyRootFilesystem: true\n            readOnlyRootFS: true\n"), "readOnlyRootFS"},
		"duplicate field": {edit("  replicas: 3\n", "  replicas: 3\n  replicas: 2\n"), "replicas"},
		"api version":     {edit("apiVersion: apps/v1", "apiVersion: apps/v1beta1"), `apiVersion "apps/v1beta1"`},
		"two documents":   {append(append(slices.Clone(good), "---\n"...), good...), "2 YAML documents"},
		"unknown kind":    {edit("kind: StatefulSet", "kind: Deployment"), `kind "Deployment"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodeManifest(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func sink(b *bundle, typ string) *config.Sink {
	for i := range b.cfg.Sinks {
		if b.cfg.Sinks[i].Type == typ {
			return &b.cfg.Sinks[i]
		}
	}
	panic("no sink of type " + typ)
}

func service(b *bundle, headless bool) *corev1.Service {
	for _, s := range b.services {
		if (s.Spec.ClusterIP == corev1.ClusterIPNone) == headless {
			return s
		}
	}
	panic("no such Service")
}

func mount(b *bundle, name string) *corev1.VolumeMount {
	c := container(b)
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	panic("no mount " + name)
}

func env(b *bundle, name string) *corev1.EnvVar {
	c := container(b)
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	panic("no env " + name)
}

func dropEnv(b *bundle, name string) {
	c := container(b)
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env = append(c.Env[:i], c.Env[i+1:]...)
			return
		}
	}
	panic("no env " + name)
}
