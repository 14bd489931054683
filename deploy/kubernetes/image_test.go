//go:build imagetest

// The image test runs only under make image-test (go test -tags imagetest, with
// FORWARDER_IMAGE naming the image make image built): it needs podman and a static build
// of the binary, which make test does not make. README.md, section Kubernetes, says why the
// image is inspected rather than run.

package kubernetes

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// imageConfig is the part of podman image inspect's answer the test reads.
type imageConfig struct {
	Os           string `json:"Os"`
	Architecture string `json:"Architecture"`
	Config       struct {
		User         string              `json:"User"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		Volumes      map[string]struct{} `json:"Volumes"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		Labels       map[string]string   `json:"Labels"`
	} `json:"Config"`
}

// layerFile is one path of the image's file system, after every layer is applied.
type layerFile struct {
	hdr  *tar.Header
	data []byte // regular files only
}

func podman(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("podman", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// TestImage inspects the image's configuration and reads its layers: the entrypoint, a
// numeric non-root user, the data_dir volume, the ports, exactly the files it should hold
// (a static binary, the host's CA bundle, the default configuration, the data_dir owned by
// its user), and runs the binary taken out of it on the host (version, check).
func TestImage(t *testing.T) {
	ref := os.Getenv("FORWARDER_IMAGE")
	if ref == "" {
		t.Fatal("FORWARDER_IMAGE is not set: run make image-test, which builds the image and names it")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: make image-test installs it (Debian package podman)")
	}
	cf, err := parseContainerfile(containerfilePath)
	if err != nil {
		t.Fatal(err)
	}

	var inspected []imageConfig
	if err := json.Unmarshal(podman(t, "image", "inspect", ref), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect %s: %v (%d images)", ref, err, len(inspected))
	}
	img := inspected[0]
	if want := fmt.Sprintf("%d:%d", cf.uid, cf.gid); img.Config.User != want || cf.uid == 0 {
		t.Errorf("user %q, want the Containerfile's non-root %s", img.Config.User, want)
	}
	if !slices.Equal(img.Config.Entrypoint, cf.entrypoint) || len(img.Config.Cmd) > 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and no cmd", img.Config.Entrypoint, img.Config.Cmd, cf.entrypoint)
	}
	if got := slices.Sorted(maps.Keys(img.Config.Volumes)); !slices.Equal(got, cf.volumes) {
		t.Errorf("volumes %v, want %v", got, cf.volumes)
	}
	if got, want := slices.Sorted(maps.Keys(img.Config.ExposedPorts)), slices.Sorted(slices.Values(cf.exposed)); !slices.Equal(got, want) {
		t.Errorf("exposed ports %v, want %v", got, want)
	}
	if img.Os != "linux" {
		t.Errorf("os %q", img.Os)
	}

	files := imageFiles(t, ref)
	var regular []string
	for name, f := range files {
		if f.hdr.Typeflag == tar.TypeReg {
			regular = append(regular, name)
		}
	}
	slices.Sort(regular)
	configPath := strings.TrimPrefix(cf.configPath(), "/")
	want := slices.Sorted(slices.Values([]string{"forwarder", "etc/ssl/certs/ca-certificates.crt", configPath}))
	if !slices.Equal(regular, want) {
		t.Errorf("the image's files are %v, want %v", regular, want)
	}

	bin, ok := files["forwarder"]
	if !ok {
		t.Fatal("no /forwarder in the image")
	}
	if bin.hdr.Mode&0o777 != 0o755 || bin.hdr.Uid != 0 {
		t.Errorf("/forwarder: mode %o owner %d, want 755 owned by root (the forwarder's user cannot change it)", bin.hdr.Mode&0o777, bin.hdr.Uid)
	}
	dir := t.TempDir()
	binPath := filepath.Join(dir, "forwarder")
	if err := os.WriteFile(binPath, bin.data, 0o755); err != nil {
		t.Fatal(err)
	}
	checkStatic(t, binPath)

	host, err := os.ReadFile(caBundle)
	if err != nil {
		t.Fatal(err)
	}
	ca := files["etc/ssl/certs/ca-certificates.crt"]
	if ca == nil || !bytes.Equal(ca.data, host) {
		t.Errorf("the image's CA bundle is not the host's %s", caBundle)
	} else if n := countCertificates(t, ca.data); n < 50 {
		t.Errorf("the CA bundle holds %d certificates", n)
	}

	own, err := os.ReadFile("forwarder.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := files[configPath]
	if cfgFile == nil || !bytes.Equal(cfgFile.data, own) {
		t.Errorf("the image's %s is not deploy/kubernetes/forwarder.yaml", cf.configPath())
	}

	if data := files[strings.TrimPrefix(cf.volumes[0], "/")]; data == nil {
		t.Errorf("no data_dir %s in the image", cf.volumes[0])
	} else if data.hdr.Typeflag != tar.TypeDir || data.hdr.Uid != cf.uid || data.hdr.Gid != cf.gid {
		t.Errorf("the data_dir %s is not a directory owned by %d:%d (type %c, owner %d:%d)", cf.volumes[0], cf.uid, cf.gid,
			data.hdr.Typeflag, data.hdr.Uid, data.hdr.Gid)
	}

	// The container cannot run here; the binary it would run can.
	out, err := exec.Command(binPath, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("forwarder version: %v\n%s", err, out)
	}
	label := img.Config.Labels["org.opencontainers.image.version"]
	if label == "" || !strings.HasPrefix(string(out), "forwarder "+label+" (") {
		t.Errorf("forwarder version says %q; the image's version label is %q", out, label)
	}
	// The Secret forwarder-tls, mounted where the pod has it: check loads
	// the inputs' certificate and key.
	tlsDir := filepath.Join(dir, "forwarder-tls")
	writeTLSSecret(t, tlsDir)
	cfgPath := filepath.Join(dir, "forwarder.yaml")
	if err := os.WriteFile(cfgPath, bytes.ReplaceAll(cfgFile.data, []byte(tlsMount+"/"), []byte(tlsDir+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	load(t) // sets the container's environment variables, as the pod has them
	// What EKS injects for the ServiceAccount's IAM role (IRSA), and none of this
	// machine's own AWS configuration.
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("web-identity-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := exec.Command(binPath, "check", "-c", cfgPath)
	check.Env = append(os.Environ(), "AWS_ROLE_ARN=arn:aws:iam::111122223333:role/forwarder", "AWS_WEB_IDENTITY_TOKEN_FILE="+token,
		"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_PROFILE=", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	out, err = check.CombinedOutput()
	if err != nil || !strings.Contains(string(out), cfgPath+": OK") || !strings.Contains(string(out), "credentials from web identity token (IRSA)") {
		t.Errorf("forwarder check on the image's configuration: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "warning") {
		t.Errorf("forwarder check warns about the image's configuration:\n%s", out)
	}
	t.Logf("%s: %s/%s, %d files, binary %d bytes: %s", ref, img.Os, img.Architecture, len(files), len(bin.data), strings.TrimSpace(string(out)))
}

// tlsMount is where the pod mounts the Secret forwarder-tls.
const tlsMount = "/etc/forwarder-tls"

// writeTLSSecret writes what the Secret forwarder-tls holds, tls.crt and
// tls.key, a self-signed certificate, into dir.
func writeTLSSecret(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "forwarder"},
		DNSNames: []string{"forwarder"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// caBundle is the host's CA bundle, which make image copies in.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// imageFiles saves the image as an OCI layout and applies its layers in order.
func imageFiles(t *testing.T, ref string) map[string]*layerFile {
	t.Helper()
	layout := filepath.Join(t.TempDir(), "oci")
	podman(t, "save", "--quiet", "--format", "oci-dir", "-o", layout, ref)
	blob := func(digest string) []byte {
		algo, hex, ok := strings.Cut(digest, ":")
		if !ok {
			t.Fatalf("digest %q", digest)
		}
		data, err := os.ReadFile(filepath.Join(layout, "blobs", algo, hex))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests", err, len(index.Manifests))
	}
	var manifest struct {
		Layers []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	files := map[string]*layerFile{}
	for _, l := range manifest.Layers {
		var r io.Reader = bytes.NewReader(blob(l.Digest))
		switch {
		case strings.HasSuffix(l.MediaType, "+gzip"):
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		case strings.HasSuffix(l.MediaType, ".tar"):
		default:
			t.Fatalf("layer media type %s", l.MediaType)
		}
		tr := tar.NewReader(r)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
			if base := filepath.Base(name); strings.HasPrefix(base, ".wh.") {
				delete(files, filepath.Join(filepath.Dir(name), strings.TrimPrefix(base, ".wh.")))
				continue
			}
			f := &layerFile{hdr: hdr}
			if hdr.Typeflag == tar.TypeReg {
				if f.data, err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
			files[name] = f
		}
	}
	return files
}

// checkStatic: an ELF executable with no interpreter and no shared libraries, which runs
// on scratch.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/forwarder has an ELF interpreter: it is not static (built without CGO_ENABLED=0?)")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("/forwarder needs shared libraries %v (%v)", libs, err)
	}
}

func countCertificates(t *testing.T, data []byte) int {
	n := 0
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return n
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Errorf("CA bundle: certificate %d: %v", n+1, err)
		}
		n++
	}
}
