package commands

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/kubeadmconfig"
)

// APIServerCertificateBackup is where kubeadmReissueAPIServerCertificate saves the API server's old
// serving certificate and key before it takes them out of the PKI directory: the record a resumed run
// reads (the pair is never lost), and what a person restores to go back. Beside kubeadm's own backups.
const APIServerCertificateBackup = kubeadmTmp + "/nodeops-apiserver-certificate"

// runKubeadmReissueAPIServerCertificate re-issues the API server's serving certificate from the
// cluster's kubeadm-config, which kubeadmUpdateConfig patched before; in a DryRun it issues one in a
// scratch directory from the configuration as patched and prints the names before and after.
func runKubeadmReissueAPIServerCertificate(ctx context.Context, env *Env, c *v1alpha1.KubeadmReissueAPIServerCertificateCommand) (Result, error) {
	if !env.Host.Files.Exists(kubeAPIServerManifest) {
		return Result{}, fmt.Errorf("%s has no %s: it is no kubeadm control plane", env.NodeName, kubeAPIServerManifest)
	}
	cl, err := adminClient(env)
	if err != nil {
		return Result{}, err
	}
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: kubeadmConfigMap}, &cm); err != nil {
		return Result{}, fmt.Errorf("reading kube-system/%s: %w", kubeadmConfigMap, err)
	}
	cluster, ok := cm.Data[kubeadmConfigKey]
	if !ok {
		return Result{}, fmt.Errorf("kube-system/%s has no %s", kubeadmConfigMap, kubeadmConfigKey)
	}
	patched, err := kubeadmconfig.PatchClusterConfiguration(cluster, sansPatch(c.CertSANs))
	if err != nil {
		return Result{}, fmt.Errorf("kube-system/%s: %w", kubeadmConfigMap, err)
	}
	if env.DryRun {
		// The DryRun's kubeadmUpdateConfig wrote nothing: render from the configuration as patched.
		return PreviewAPIServerCertificate(ctx, env, patched, c.CertSANs)
	}
	if patched != cluster {
		return Result{}, fmt.Errorf("kube-system/%s's apiServer.certSANs lack some of %s: kubeadm would issue a certificate without them (kubeadmUpdateConfig patches them first)",
			kubeadmConfigMap, strings.Join(c.CertSANs, ", "))
	}
	return ReissueAPIServerCertificate(ctx, env, cluster, c.CertSANs)
}

func sansPatch(sans []string) *v1alpha1.ClusterConfigurationPatch {
	return &v1alpha1.ClusterConfigurationPatch{APIServer: &v1alpha1.APIServerPatch{CertSANs: sans}}
}

// ReissueAPIServerCertificate issues this control plane's apiserver.crt and apiserver.key with
// `kubeadm init phase certs apiserver --config` from cluster (a ClusterConfiguration) unless the
// certificate already has every name in sans. kubeadm keeps an existing certificate signed by the CA
// whatever its names, so the old pair is taken out first; it is saved to APIServerCertificateBackup
// before anything moves, and each state an interruption can leave is resumed from what is on disk:
//
//	certificate with every name        -> kept (issued already, or never needed): nothing issued twice
//	certificate lacking a name         -> the pair saved (overwriting an older record), taken out, issued
//	no certificate, a saved pair       -> interrupted after taking it out: any key left is kubeadm's
//	                                      half-written one or the saved one; removed, then issued
//	no certificate, no saved pair      -> refused: the node lost its certificate some other way
func ReissueAPIServerCertificate(ctx context.Context, env *Env, cluster string, sans []string) (Result, error) {
	files := env.Host.Files
	initCfg, pki, err := certConfig(env, cluster)
	if err != nil {
		return Result{}, err
	}
	crtPath, keyPath := pki+"/apiserver.crt", pki+"/apiserver.key"
	savedCrt, savedKey := APIServerCertificateBackup+"/apiserver.crt", APIServerCertificateBackup+"/apiserver.key"
	old, err := readCertificate(files, crtPath)
	if err != nil {
		return Result{}, err
	}
	switch {
	case old != nil && len(missingNames(old, sans)) == 0:
		env.printf("%s %s already has %s: kept\n", env.NodeName, crtPath, strings.Join(sans, ", "))
		return Result{Message: fmt.Sprintf("%s already has every name (%s): kept, not re-issued", crtPath, certificateNames(old))}, nil
	case old != nil:
		env.printf("%s %s names: %s\n", env.NodeName, crtPath, certificateNames(old))
		crt, err := files.ReadFile(crtPath)
		if err != nil {
			return Result{}, err
		}
		key, err := files.ReadFile(keyPath)
		if err != nil {
			return Result{}, fmt.Errorf("reading %s beside %s: %w", keyPath, crtPath, err)
		}
		// The record first, complete, and only then the pair is moved: the key before the
		// certificate, so a saved certificate always has its key saved beside it.
		if err := files.WriteFileAtomic(savedKey, key, 0o600); err != nil {
			return Result{}, fmt.Errorf("saving the old pair: %w", err)
		}
		if err := files.WriteFileAtomic(savedCrt, crt, 0o644); err != nil {
			return Result{}, fmt.Errorf("saving the old pair: %w", err)
		}
		env.printf("saved the old pair to %s\n", APIServerCertificateBackup)
		// The certificate goes first: a key without its certificate is read below as a move cut short.
		if err := files.Remove(crtPath); err != nil {
			return Result{}, err
		}
	default:
		if !files.Exists(savedCrt) || !files.Exists(savedKey) {
			return Result{}, fmt.Errorf("%s is missing and no old pair is saved in %s: this is no interrupted re-issue, so nothing is issued; restore the pair first", crtPath, APIServerCertificateBackup)
		}
		env.printf("%s is missing and the old pair is saved in %s: resuming an interrupted re-issue\n", crtPath, APIServerCertificateBackup)
	}
	if err := files.Remove(keyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Result{}, err
	}
	var out bytes.Buffer
	if err := runCertsAPIServer(ctx, env, &out, initCfg+"---\n"+cluster); err != nil {
		return Result{}, err
	}
	env.printf("%s", out.String())
	issued, err := readCertificate(files, crtPath)
	if err != nil {
		return Result{}, err
	}
	if issued == nil {
		return Result{}, fmt.Errorf("kubeadm issued no %s:\n%s", crtPath, out.String())
	}
	if missing := missingNames(issued, sans); len(missing) > 0 {
		return Result{}, fmt.Errorf("kubeadm issued %s without %s", crtPath, strings.Join(missing, ", "))
	}
	env.printf("%s %s re-issued with names: %s\n", env.NodeName, crtPath, certificateNames(issued))
	return Result{Message: fmt.Sprintf("re-issued %s with %s (the old pair is in %s); the API server serves it once restarted",
		crtPath, strings.Join(sans, ", "), APIServerCertificateBackup)}, nil
}

// PreviewAPIServerCertificate prints the names this control plane's serving certificate has and
// those kubeadm would issue it with from cluster: kubeadm issues one in a scratch directory holding
// a copy of the CA (as kubeadm's own dry runs do), which is removed afterwards. The node's PKI is
// read, never written.
func PreviewAPIServerCertificate(ctx context.Context, env *Env, cluster string, sans []string) (Result, error) {
	initCfg, pki, err := certConfig(env, cluster)
	if err != nil {
		return Result{}, err
	}
	crtPath := pki + "/apiserver.crt"
	old, err := readCertificate(env.Host.Files, crtPath)
	if err != nil {
		return Result{}, err
	}
	if old != nil && len(missingNames(old, sans)) == 0 {
		env.printf("dry run: %s apiserver.crt already has %s: would be kept\n", env.NodeName, strings.Join(sans, ", "))
		return Result{Message: "dry run: apiserver.crt already has every name"}, nil
	}
	files := env.actingFiles()
	_, existed, err := dirNames(files, kubeadmTmp)
	if err != nil {
		return Result{}, err
	}
	scratch := kubeadmTmp + "/nodeops-apiserver-certificate-dryrun"
	// A copy of the CA left by a DryRun stopped midway goes before anything else.
	if err := files.RemoveAll(scratch); err != nil {
		return Result{}, err
	}
	issued, runErr := issueInScratch(ctx, env, files, scratch, pki, initCfg, cluster)
	cleanErr := files.RemoveAll(scratch)
	if !existed && cleanErr == nil {
		if now, _, err := dirNames(files, kubeadmTmp); err == nil && len(now) == 0 {
			cleanErr = files.Remove(kubeadmTmp)
		}
	}
	if err := errors.Join(runErr, cleanErr); err != nil {
		return Result{}, err
	}
	before := "(none)"
	if old != nil {
		before = certificateNames(old)
	}
	env.printf("dry run: %s apiserver.crt would be re-issued:\n  names: %s\n      -> %s\n", env.NodeName, before, certificateNames(issued))
	return Result{Message: "dry run: apiserver.crt would be re-issued with " + strings.Join(sans, ", ")}, nil
}

// issueInScratch has kubeadm issue an API server certificate into scratch from a copy of the CA in pki.
func issueInScratch(ctx context.Context, env *Env, files host.Files, scratch, pki, initCfg, cluster string) (*x509.Certificate, error) {
	for _, f := range []string{"ca.crt", "ca.key"} {
		b, err := files.ReadFile(pki + "/" + f)
		if err != nil {
			return nil, fmt.Errorf("reading the cluster CA: %w", err)
		}
		if err := files.WriteFileAtomic(scratch+"/"+f, b, 0o600); err != nil {
			return nil, err
		}
	}
	inScratch, err := withCertificatesDir(cluster, scratch)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := runCertsAPIServer(ctx, env, &out, initCfg+"---\n"+inScratch); err != nil {
		return nil, err
	}
	issued, err := readCertificate(files, scratch+"/apiserver.crt")
	if err == nil && issued == nil {
		err = fmt.Errorf("kubeadm issued no certificate:\n%s", out.String())
	}
	return issued, err
}

// runCertsAPIServer runs `kubeadm init phase certs apiserver --config` with config, written for the
// run beside kubeadm's own scratch files and removed after it.
func runCertsAPIServer(ctx context.Context, env *Env, out *bytes.Buffer, config string) error {
	files := env.actingFiles()
	cfgPath := kubeadmTmp + "/nodeops-certs-apiserver.yaml"
	if err := files.WriteFileAtomic(cfgPath, []byte(config), 0o600); err != nil {
		return fmt.Errorf("writing kubeadm's configuration: %w", err)
	}
	args := []string{"init", "phase", "certs", "apiserver", "--config", cfgPath}
	runErr := env.Host.Kubeadm.Kubeadm(ctx, out, args...)
	cleanErr := files.Remove(cfgPath)
	if runErr != nil {
		return fmt.Errorf("kubeadm %s: %w\n%s", strings.Join(args, " "), runErr, out.String())
	}
	return cleanErr
}

// certConfig is the InitConfiguration of this control plane (its name and advertise address, which
// the certificate names) and the certificates directory cluster says.
func certConfig(env *Env, cluster string) (string, string, error) {
	manifest, err := env.Host.Files.ReadFile(kubeAPIServerManifest)
	if err != nil {
		return "", "", err
	}
	initCfg, err := initConfiguration(env.NodeName, manifest)
	if err != nil {
		return "", "", err
	}
	var doc struct {
		CertificatesDir string `json:"certificatesDir"`
	}
	if err := yaml.Unmarshal([]byte(cluster), &doc); err != nil {
		return "", "", fmt.Errorf("ClusterConfiguration unreadable: %w", err)
	}
	pki := doc.CertificatesDir
	if pki == "" {
		pki = "/etc/kubernetes/pki" // kubeadm's default
	}
	return initCfg, path.Clean(pki), nil
}

// withCertificatesDir is cluster with its certificatesDir set to dir.
func withCertificatesDir(cluster, dir string) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(cluster), &doc); err != nil {
		return "", fmt.Errorf("ClusterConfiguration unreadable: %w", err)
	}
	doc["certificatesDir"] = dir
	out, err := yaml.Marshal(doc)
	return string(out), err
}

// readCertificate reads the first certificate of a PEM file; a missing file is (nil, nil).
func readCertificate(files host.Files, p string) (*x509.Certificate, error) {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", p)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return cert, nil
}

// missingNames are the names of sans the certificate lacks: an IP address among its IP addresses,
// anything else among its DNS names, as kubeadm sorts certSANs.
func missingNames(cert *x509.Certificate, sans []string) []string {
	var missing []string
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
				missing = append(missing, s)
			}
			continue
		}
		if !slices.ContainsFunc(cert.DNSNames, func(n string) bool { return strings.EqualFold(n, s) }) {
			missing = append(missing, s)
		}
	}
	return missing
}

// certificateNames lists a certificate's DNS names, then its IP addresses, sorted.
func certificateNames(cert *x509.Certificate) string {
	dns := slices.Sorted(slices.Values(cert.DNSNames))
	ips := make([]string, 0, len(cert.IPAddresses))
	for _, ip := range cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	slices.Sort(ips)
	return "DNS " + strings.Join(dns, ", ") + "; IP " + strings.Join(ips, ", ")
}
