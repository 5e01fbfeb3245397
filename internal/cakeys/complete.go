package cakeys

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// leafCertificates are the certificates kubeadm issues on a control plane from each authority,
// relative to PKIDirectory. After phase complete a component trusts the new authority alone, so
// each of them must be the new one's first (phase re-issue).
var leafCertificates = map[string][]string{
	v1alpha1.AuthorityCluster:    {"apiserver.crt", "apiserver-kubelet-client.crt"},
	v1alpha1.AuthorityEtcd:       {"etcd/server.crt", "etcd/peer.crt", "etcd/healthcheck-client.crt", "apiserver-etcd-client.crt"},
	v1alpha1.AuthorityFrontProxy: {"front-proxy-client.crt"},
}

// ErrOldStillPublished: a worker found the cluster still publishing the old cluster authority beside
// the new (kube-root-ca.crt): the control planes have not dropped it yet.
var ErrOldStillPublished = errors.New("the old authority is still published")

// removed is what a removed file trusts afterwards, in words.
var removed = []string{"(removed)"}

// step is one change phase complete makes: a file written atomically, or a path removed.
type step struct {
	path   string
	data   []byte
	mode   fs.FileMode
	remove bool
	change Change
}

// TrustNewOnly is phase complete, the reverse of TrustBoth once phase re-issue has put the new
// authorities in place (/etc/kubernetes/pki/ca.crt and the others ARE the new ones): every flag that
// names a bundle names the single file again, every kubeconfig trusts the new cluster authority alone,
// the kubelet's clientCAFile is ca.crt again, the bundles are removed, and last the staging directory
// (a second copy of the new keys, which would also make the next rotation's prepare refuse to run).
//
// It refuses, before writing anything, a node where a certificate the node needs was issued by an
// authority it would stop trusting (a leaf certificate, a kubeconfig's or the kubelet's client
// certificate not re-issued yet), and a control plane whose /etc/kubernetes/pki still holds the old
// authority while the staging directory holds the new: completing there would lock a component out.
// Every write leaves files that trust the new authority, each referenced file present, so an
// interruption anywhere leaves a working node and a re-run ends in the tree an uninterrupted run makes.
// A worker takes the new cluster authority from in.NewClusterCA (kube-root-ca.crt) and waits
// (ErrOldStillPublished) while that still holds the old one.
func TrustNewOnly(files host.Files, in TrustInput) ([]Change, error) {
	cp, staging, err := completeRole(files, in.Operation)
	if err != nil {
		return nil, err
	}
	var steps []step
	if cp {
		steps, err = completeControlPlane(files, in, staging)
	} else {
		steps, err = completeWorker(files, in)
	}
	if err != nil {
		return nil, err
	}
	var changes []Change
	for _, s := range steps {
		switch {
		case s.remove && s.path == v1alpha1.StagingDirectory:
			err = files.RemoveAll(s.path)
		case s.remove:
			err = files.Remove(s.path)
		default:
			err = files.WriteFileAtomic(s.path, s.data, s.mode)
		}
		if err != nil {
			return changes, err
		}
		changes = append(changes, s.change)
	}
	return changes, nil
}

// completeRole says whether the node is a control plane of the rotation (it holds the operation's
// staging directory, or runs static pods: its staging directory is gone once complete ran) and
// whether the staging directory is there; one without its marker is what an interrupted removal left.
func completeRole(files host.Files, operation string) (controlPlane, staging bool, err error) {
	switch got := Operation(files); got {
	case operation:
		return true, true, nil
	case "":
		staging = files.Exists(v1alpha1.StagingDirectory)
		for _, c := range StaticPodComponents {
			if files.Exists(host.Manifest(host.ManifestsDir, c)) || files.Exists(host.Manifest(host.MovedManifestsDir, c)) {
				return true, staging, nil
			}
		}
		return false, false, nil
	default:
		return false, false, fmt.Errorf("%s holds the authorities of operation %q, not %q", v1alpha1.StagingDirectory, got, operation)
	}
}

// completeControlPlane plans phase complete on a control plane, checking first that nothing the
// node needs still depends on the old authorities.
func completeControlPlane(files host.Files, in TrustInput, staging bool) ([]step, error) {
	want, err := Pairs(in.Authorities, in.ServiceAccountKey)
	if err != nil {
		return nil, err
	}
	var lockouts []string
	unconfirmed := false
	var bundles []trustBundle
	newPEM := map[string][]byte{}
	for _, p := range want {
		b := serviceAccountBundle
		if p.CommonName != "" {
			b = trustBundles[p.Name]
		}
		bundles = append(bundles, b)
		inUse, err := files.ReadFile(pki(b.old))
		if err != nil {
			return nil, fmt.Errorf("the %s authority in use: %w", b.name, err)
		}
		if _, err := pemBlocks(inUse, pki(b.old)); err != nil {
			return nil, err
		}
		newPEM[b.name] = inUse
		switch stagedPEM, err := files.ReadFile(staged(p.Cert)); {
		case errors.Is(err, fs.ErrNotExist):
			unconfirmed = true
		case err != nil:
			return nil, err
		case !samePEM(stagedPEM, inUse):
			return nil, fmt.Errorf("%s is not the rotation's new %s (%s holds %s, %s holds %s): phase re-issue (reissueCertificates) has not run on this node; completing now would make it trust the old authority alone",
				pki(b.old), b.name, pki(b.old), strings.Join(Trusted(inUse), ", "), staged(p.Cert), strings.Join(Trusted(stagedPEM), ", "))
		}
		if p.CommonName == "" {
			key, err := files.ReadFile(pki(p.Key))
			if err != nil {
				return nil, err
			}
			if err := matches(p, inUse, key); err != nil {
				lockouts = append(lockouts, fmt.Sprintf("the service-account signing key %s is not the key of %s (%v): tokens it signs would be refused", pki(p.Key), pki(p.Cert), err))
			}
			continue
		}
		for _, leaf := range leafCertificates[p.Name] {
			if msg := notIssuedBy(files, pki(leaf), inUse); msg != "" {
				lockouts = append(lockouts, msg)
			}
		}
	}

	var steps []step
	if slices.ContainsFunc(want, func(p Pair) bool { return p.Name == v1alpha1.AuthorityCluster }) {
		caPEM := newPEM[v1alpha1.AuthorityCluster]
		rotation, err := rotationBlocks(files, pki("ca-bundle.crt"), caPEM)
		if err != nil {
			return nil, err
		}
		for _, kc := range Kubeconfigs {
			s, lockout, err := kubeconfigNewOnly(files, kc, rotation, caPEM)
			if err != nil {
				return nil, err
			}
			if lockout != "" {
				lockouts = append(lockouts, lockout)
			}
			if s != nil {
				steps = append(steps, *s)
			}
		}
		s, err := pointBack(files, KubeletConfigFile, clientCAFileLine, trustBundles[v1alpha1.AuthorityCluster], caPEM)
		if err != nil {
			return nil, err
		}
		if s != nil {
			steps = append(steps, *s)
		}
	}
	for _, comp := range StaticPodComponents {
		s, err := flagsBack(files, comp, bundles, newPEM)
		if err != nil {
			return nil, err
		}
		if s != nil {
			steps = append(steps, *s)
		}
	}
	for _, b := range bundles {
		if s := removeStep(files, pki(b.bundle)); s != nil {
			steps = append(steps, *s)
		}
	}
	if len(lockouts) > 0 {
		return nil, fmt.Errorf("completing would lock this node's components out; nothing changed:\n- %s", strings.Join(lockouts, "\n- "))
	}
	if unconfirmed && len(steps) > 0 {
		return nil, fmt.Errorf("%s lacks the rotation's new authorities, so nothing shows that phase re-issue ran on this node, yet the node still trusts a bundle: refusing to drop the old authorities", v1alpha1.StagingDirectory)
	}
	if staging {
		steps = append(steps, step{path: v1alpha1.StagingDirectory, remove: true,
			change: Change{Path: v1alpha1.StagingDirectory, Before: []string{"the rotation's staged authorities (certificates and keys)"}, After: removed}})
	}
	return steps, nil
}

// completeWorker plans phase complete on a worker: its kubelet.conf, ca.crt and clientCAFile trust
// the cluster authority kube-root-ca.crt publishes once the control planes trust it alone.
func completeWorker(files host.Files, in TrustInput) ([]step, error) {
	if !slices.Contains(v1alpha1.OrAllAuthorities(in.Authorities), v1alpha1.AuthorityCluster) {
		return nil, nil
	}
	cluster := trustBundles[v1alpha1.AuthorityCluster]
	published, err := pemBlocks(in.NewClusterCA, "the published cluster CA bundle (kube-root-ca.crt)")
	if err != nil {
		return nil, err
	}
	var newPEM bytes.Buffer
	for _, b := range published {
		if err := pem.Encode(&newPEM, b); err != nil {
			return nil, err
		}
	}
	caPEM := newPEM.Bytes()
	current := pki(cluster.bundle)
	if !files.Exists(current) {
		current = pki(cluster.old)
	}
	trustedPEM, err := files.ReadFile(current)
	if err != nil {
		return nil, fmt.Errorf("the cluster authority in use: %w", err)
	}
	trusted, err := pemBlocks(trustedPEM, current)
	if err != nil {
		return nil, err
	}
	if !subset(published, trusted) {
		return nil, fmt.Errorf("the cluster's published CA bundle (kube-root-ca.crt: %s) holds an authority this node does not trust (%s: %s): phase trust-both has not run on this node, or this is not this cluster's rotation",
			strings.Join(Trusted(caPEM), ", "), current, strings.Join(Trusted(trustedPEM), ", "))
	}
	if current == pki(cluster.bundle) && subset(trusted, published) {
		return nil, fmt.Errorf("%w: kube-root-ca.crt holds %s, as this node's bundle does; the controller-managers publish the new authority alone once every control plane completed (group ca-complete-control-planes)",
			ErrOldStillPublished, strings.Join(Trusted(caPEM), ", "))
	}

	var lockouts []string
	var steps []step
	s, lockout, err := kubeconfigNewOnly(files, "/etc/kubernetes/kubelet.conf", trusted, caPEM)
	if err != nil {
		return nil, err
	}
	if lockout != "" {
		lockouts = append(lockouts, lockout)
	}
	if s != nil {
		steps = append(steps, *s)
	}
	if len(lockouts) > 0 {
		return nil, fmt.Errorf("completing would lock this node's kubelet out; nothing changed:\n- %s", strings.Join(lockouts, "\n- "))
	}
	// ca.crt becomes the new authority before the kubelet is pointed back at it.
	old, err := files.ReadFile(pki(cluster.old))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if !samePEM(old, caPEM) {
		steps = append(steps, step{path: pki(cluster.old), data: caPEM, mode: modeOf(files, pki(cluster.old), 0o644),
			change: Change{Path: pki(cluster.old), Before: Trusted(old), After: Trusted(caPEM)}})
	}
	if s, err := pointBack(files, KubeletConfigFile, clientCAFileLine, cluster, caPEM); err != nil {
		return nil, err
	} else if s != nil {
		steps = append(steps, *s)
	}
	if s := removeStep(files, pki(cluster.bundle)); s != nil {
		steps = append(steps, *s)
	}
	return steps, nil
}

// samePEM says whether a and b hold the same certificates or keys, whatever their encoding.
func samePEM(a, b []byte) bool {
	ab, errA := pemBlocks(a, "a")
	bb, errB := pemBlocks(b, "b")
	return errA == nil && errB == nil && subset(ab, bb) && subset(bb, ab)
}

// subset says whether every block of a is in b.
func subset(a, b []*pem.Block) bool {
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y *pem.Block) bool { return bytes.Equal(x.Bytes, y.Bytes) }) {
			return false
		}
	}
	return true
}

// rotationBlocks are the authorities of the rotation: those of the bundle trust-both wrote (old and
// new) and the new one; a kubeconfig trusting only some of these is this cluster's.
func rotationBlocks(files host.Files, bundle string, newPEM []byte) ([]*pem.Block, error) {
	out, err := pemBlocks(newPEM, "the new authority")
	if err != nil {
		return nil, err
	}
	data, err := files.ReadFile(bundle)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	blocks, err := pemBlocks(data, bundle)
	if err != nil {
		return nil, err
	}
	return append(blocks, out...), nil
}

// notIssuedBy says, in words, why the certificate at p would not verify against caPEM alone; "" when
// it does or when the node has no such file (an external etcd, a worker).
func notIssuedBy(files host.Files, p string, caPEM []byte) string {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("%s: %v", p, err)
	}
	return verifyAgainst(p, data, caPEM)
}

// verifyAgainst checks the first certificate of certPEM against the authorities of caPEM.
func verifyAgainst(what string, certPEM, caPEM []byte) string {
	var b *pem.Block
	for rest := certPEM; ; {
		b, rest = pem.Decode(rest)
		if b == nil || b.Type == "CERTIFICATE" {
			break
		}
	}
	if b == nil {
		return fmt.Sprintf("%s holds no certificate", what)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return fmt.Sprintf("%s: %v", what, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Sprintf("%s (%q, issued by %q) does not verify against the new authority %s alone: re-issue it first (phase re-issue)",
			what, c.Subject.CommonName, c.Issuer.CommonName, strings.Join(Trusted(caPEM), ", "))
	}
	return ""
}

// kubeconfigNewOnly plans the kubeconfig at p to trust caPEM alone in every cluster that trusts only
// rotation authorities (or names the bundle file); its client certificate must verify against caPEM,
// or the node's component would be refused once the API servers trust the new authority alone.
func kubeconfigNewOnly(files host.Files, p string, rotation []*pem.Block, caPEM []byte) (*step, string, error) {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", p, err)
	}
	var lockouts []string
	for name, u := range cfg.AuthInfos {
		if msg := clientCertificateLockout(files, p, name, u, caPEM); msg != "" {
			lockouts = append(lockouts, msg)
		}
	}
	var before []string
	changed := false
	for name, c := range cfg.Clusters {
		switch {
		case c.CertificateAuthority == pki("ca-bundle.crt"):
			before = append(before, "certificate-authority "+c.CertificateAuthority)
			c.CertificateAuthority = pki("ca.crt")
		case len(c.CertificateAuthorityData) > 0:
			blocks, err := pemBlocks(c.CertificateAuthorityData, p+" cluster "+name)
			if err != nil {
				return nil, "", err
			}
			if !subset(blocks, rotation) || samePEM(c.CertificateAuthorityData, caPEM) {
				continue
			}
			before = append(before, Trusted(c.CertificateAuthorityData)...)
			c.CertificateAuthorityData = caPEM
		default:
			continue
		}
		changed = true
	}
	lockout := strings.Join(lockouts, "\n- ")
	if !changed {
		return nil, lockout, nil
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", p, err)
	}
	return &step{path: p, data: out, mode: modeOf(files, p, 0o600), change: Change{Path: p, Before: before, After: Trusted(caPEM)}}, lockout, nil
}

// clientCertificateLockout checks a kubeconfig user's client certificate (inline or a file, as
// kubelet.conf names /var/lib/kubelet/pki/kubelet-client-current.pem) against caPEM.
func clientCertificateLockout(files host.Files, kubeconfig, name string, u *clientcmdapi.AuthInfo, caPEM []byte) string {
	what := fmt.Sprintf("%s user %s's client certificate", kubeconfig, name)
	switch {
	case len(u.ClientCertificateData) > 0:
		return verifyAgainst(what, u.ClientCertificateData, caPEM)
	case u.ClientCertificate != "":
		p := u.ClientCertificate
		if !path.IsAbs(p) {
			p = path.Join(path.Dir(kubeconfig), p)
		}
		data, err := files.ReadFile(p)
		if err != nil {
			return fmt.Sprintf("%s %s: %v", what, p, err)
		}
		return verifyAgainst(what+" "+p, data, caPEM)
	}
	return ""
}

// pointBack plans the lines of p matching re that name b's bundle to name b's single file again.
func pointBack(files host.Files, p string, re *regexp.Regexp, b trustBundle, newPEM []byte) (*step, error) {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil && m[2] == pki(b.bundle) {
			lines[i] = m[1] + pki(b.old)
			changed = true
		}
	}
	if !changed {
		return nil, nil
	}
	return &step{path: p, data: []byte(strings.Join(lines, "\n")), mode: modeOf(files, p, 0o644),
		change: Change{Path: p, Before: []string{pki(b.bundle)}, After: []string{pki(b.old) + ": " + strings.Join(Trusted(newPEM), ", ")}}}, nil
}

// flagsBack plans comp's flags that name a bundle to name the single (now new) file again.
func flagsBack(files host.Files, comp string, bundles []trustBundle, newPEM map[string][]byte) (*step, error) {
	p := host.Manifest(host.ManifestsDir, comp)
	if !files.Exists(p) {
		p = host.Manifest(host.MovedManifestsDir, comp)
	}
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	var before, after []string
	for _, b := range bundles {
		for i, l := range lines {
			m := flagLine.FindStringSubmatch(l)
			if m == nil || m[3] != pki(b.bundle) {
				continue
			}
			lines[i] = m[1] + m[2] + "=" + pki(b.old) + m[4]
			before = append(before, "--"+m[2]+"="+pki(b.bundle))
			after = append(after, "--"+m[2]+"="+pki(b.old)+" ("+strings.Join(Trusted(newPEM[b.name]), ", ")+")")
		}
	}
	if len(before) == 0 {
		return nil, nil
	}
	return &step{path: p, data: []byte(strings.Join(lines, "\n")), mode: modeOf(files, p, 0o600), change: Change{Path: p, Before: before, After: after}}, nil
}

// removeStep plans the removal of the bundle at p, which nothing names any more; nil when it is gone.
func removeStep(files host.Files, p string) *step {
	data, err := files.ReadFile(p)
	if err != nil {
		return nil
	}
	return &step{path: p, remove: true, change: Change{Path: p, Before: Trusted(data), After: removed}}
}
