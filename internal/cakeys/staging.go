// Package cakeys makes a certificate authority rotation's new authorities on a control plane and
// carries them to the operation's other control planes, agent to agent: private keys never travel
// through the API (docs/design.md, rule 15; docs/operations/security.md says how and against whom).
//
// Generate writes the new authorities into the staging directory beside /etc/kubernetes/pki
// (v1alpha1.StagingDirectory: directories 0700, keys 0600). Server serves them over TLS to agents
// that prove, with their ServiceAccount token (a TokenReview), to be the agent of a control plane with
// an unfinished copyCertificateAuthorities task in the same operation; Fetch is the receiving side,
// which accepts only the server certificate whose fingerprint the generating task published in its
// status, and Write puts what it received into its own staging directory.
//
// It touches the host only through host.Files and the cluster only through the client it is given.
package cakeys

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// CAValidity is how long a new authority is valid: kubeadm's ten years.
const CAValidity = 10 * 365 * 24 * time.Hour

// keyBits is the size of the RSA keys, kubeadm's default (ClusterConfiguration encryptionAlgorithm RSA-2048).
const keyBits = 2048

// markerFile names the operation whose authorities the staging directory holds, so that a rotation
// never takes another's keys for its own.
const markerFile = "rotation"

// Pair is one authority's (or the service-account key's) files, relative to the staging directory
// as they are to /etc/kubernetes/pki.
type Pair struct {
	Name string
	// Cert is the certificate, or for the service-account key the public key.
	Cert string
	Key  string
	// CommonName of a new authority; empty for the service-account key, which has no certificate.
	CommonName string
}

// pairs are every authority kubeadm makes, by the name the API gives it.
var pairs = map[string]Pair{
	v1alpha1.AuthorityCluster:    {Name: v1alpha1.AuthorityCluster, Cert: "ca.crt", Key: "ca.key", CommonName: "kubernetes"},
	v1alpha1.AuthorityEtcd:       {Name: v1alpha1.AuthorityEtcd, Cert: "etcd/ca.crt", Key: "etcd/ca.key", CommonName: "etcd-ca"},
	v1alpha1.AuthorityFrontProxy: {Name: v1alpha1.AuthorityFrontProxy, Cert: "front-proxy-ca.crt", Key: "front-proxy-ca.key", CommonName: "front-proxy-ca"},
}

var serviceAccountPair = Pair{Name: "service-account", Cert: "sa.pub", Key: "sa.key"}

// Pairs are the files of the authorities asked for (all when none) and, with sa, of the
// service-account key, in a fixed order.
func Pairs(authorities []string, sa bool) ([]Pair, error) {
	var out []Pair
	for _, a := range v1alpha1.Authorities {
		if len(authorities) == 0 || slices.Contains(authorities, a) {
			out = append(out, pairs[a])
		}
	}
	for _, a := range authorities {
		if _, ok := pairs[a]; !ok {
			return nil, fmt.Errorf("authorities: %q is no authority (cluster, etcd, front-proxy)", a)
		}
	}
	if sa {
		out = append(out, serviceAccountPair)
	}
	return out, nil
}

// File is one staged file: its path relative to the staging directory, its mode and its content.
type File struct {
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"`
	Data []byte      `json:"data"`
}

func staged(rel string) string { return path.Join(v1alpha1.StagingDirectory, rel) }

// Generated says what Generate did, in words that hold no key.
type Generated struct {
	// Made and Kept are the pairs made now and those a complete earlier run of the same operation left.
	Made, Kept []string
	// Lines describe each staged certificate: its path, subject and SHA-256 fingerprint (public).
	Lines []string
}

// Generate makes the operation's new authorities in the staging directory. A pair already staged
// for the same operation, complete and matching, is kept (a re-run after an interruption makes
// nothing twice, so every control plane ends with the same keys); a staging directory of another
// operation is refused, never overwritten.
func Generate(files host.Files, operation string, authorities []string, sa bool, now time.Time) (Generated, error) {
	want, err := Pairs(authorities, sa)
	if err != nil {
		return Generated{}, err
	}
	if err := claim(files, operation); err != nil {
		return Generated{}, err
	}
	var g Generated
	for _, p := range want {
		if err := checkPair(files, p); err == nil {
			g.Kept = append(g.Kept, p.Name)
			continue
		}
		certPEM, keyPEM, err := newPair(p, currentKey(files, p), now)
		if err != nil {
			return Generated{}, err
		}
		if err := stagePair(files, p, keyPEM, certPEM); err != nil {
			return Generated{}, err
		}
		g.Made = append(g.Made, p.Name)
	}
	return finish(files, want, g)
}

// stagePair writes p's key (0600), then its certificate, so that a certificate is never staged
// without its key.
func stagePair(files host.Files, p Pair, keyPEM, certPEM []byte) error {
	if err := files.WriteFileAtomic(staged(p.Key), keyPEM, 0o600); err != nil {
		return err
	}
	return files.WriteFileAtomic(staged(p.Cert), certPEM, 0o644)
}

// finish locks the staging directory down and describes what it holds.
func finish(files host.Files, want []Pair, g Generated) (Generated, error) {
	if err := lockDown(files); err != nil {
		return Generated{}, err
	}
	g.Lines = describe(files, want)
	return g, nil
}

// claim makes the staging directory (0700) with its marker for operation, or checks that it is
// operation's.
func claim(files host.Files, operation string) error {
	marker := staged(markerFile)
	if data, err := files.ReadFile(marker); err == nil {
		if got := strings.TrimSpace(string(data)); got != operation {
			return fmt.Errorf("%s holds the authorities of operation %q, not %q: finish or back out that rotation first (docs/how-to/rotate-cas.md)", v1alpha1.StagingDirectory, got, operation)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	} else if err := files.WriteFileAtomic(marker, []byte(operation+"\n"), 0o600); err != nil {
		return err
	}
	return lockDown(files)
}

// lockDown makes the staging directories 0700: only root reads them, as only root reads the keys.
func lockDown(files host.Files) error {
	for _, d := range []string{v1alpha1.StagingDirectory, staged("etcd")} {
		if err := files.Chmod(d, 0o700); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Operation is the operation whose authorities the staging directory holds, "" when none.
func Operation(files host.Files) string {
	data, err := files.ReadFile(staged(markerFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// Read is the staged pairs of operation, each checked (the key matches its certificate), as Server
// sends them.
func Read(files host.Files, operation string, authorities []string, sa bool) ([]File, error) {
	want, err := Pairs(authorities, sa)
	if err != nil {
		return nil, err
	}
	if got := Operation(files); got != operation {
		return nil, fmt.Errorf("%s holds no authorities of operation %q (it holds %q)", v1alpha1.StagingDirectory, operation, got)
	}
	var out []File
	for _, p := range want {
		if err := checkPair(files, p); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			rel  string
			mode fs.FileMode
		}{{p.Cert, 0o644}, {p.Key, 0o600}} {
			data, err := files.ReadFile(staged(f.rel))
			if err != nil {
				return nil, err
			}
			out = append(out, File{Path: f.rel, Mode: f.mode, Data: data})
		}
	}
	return out, nil
}

// Write stages what Fetch received for operation: every pair asked for must be there and match
// (a key for its certificate) before anything is written; keys 0600.
func Write(files host.Files, operation string, authorities []string, sa bool, got []File) (Generated, error) {
	want, err := Pairs(authorities, sa)
	if err != nil {
		return Generated{}, err
	}
	byPath := map[string][]byte{}
	for _, f := range got {
		byPath[f.Path] = f.Data
	}
	for _, p := range want {
		if err := matches(p, byPath[p.Cert], byPath[p.Key]); err != nil {
			return Generated{}, fmt.Errorf("received %s: %w", p.Name, err)
		}
	}
	if err := claim(files, operation); err != nil {
		return Generated{}, err
	}
	var g Generated
	for _, p := range want {
		if err := stagePair(files, p, byPath[p.Key], byPath[p.Cert]); err != nil {
			return Generated{}, err
		}
		g.Made = append(g.Made, p.Name)
	}
	return finish(files, want, g)
}

// checkPair fails unless p's certificate and key are staged and match.
func checkPair(files host.Files, p Pair) error {
	cert, err := files.ReadFile(staged(p.Cert))
	if err != nil {
		return err
	}
	key, err := files.ReadFile(staged(p.Key))
	if err != nil {
		return err
	}
	return matches(p, cert, key)
}

// matches fails unless key is the private key of cert (for the service-account pair: of the public key).
func matches(p Pair, certPEM, keyPEM []byte) error {
	key, err := parseAnyKey(keyPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Key, err)
	}
	pub, err := publicHalf(p, certPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Cert, err)
	}
	if !keyOf(key, pub) {
		return fmt.Errorf("%s does not match %s", p.Key, p.Cert)
	}
	return nil
}

// publicHalf is the public key in the data of p's Cert file: a CA certificate's, or for the
// service-account pair the PEM public key itself.
func publicHalf(p Pair, data []byte) (crypto.PublicKey, error) {
	if p.CommonName == "" {
		b, _ := pem.Decode(data)
		if b == nil || b.Type != "PUBLIC KEY" {
			return nil, errors.New("no PEM public key")
		}
		return x509.ParsePKIXPublicKey(b.Bytes)
	}
	c, err := parseCert(data)
	if err != nil {
		return nil, err
	}
	if !c.IsCA {
		return nil, errors.New("not a CA certificate")
	}
	return c.PublicKey, nil
}

// keyOf says whether key is the private key of pub.
func keyOf(key crypto.Signer, pub crypto.PublicKey) bool {
	k, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(pub)
}

func parseCert(data []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// currentKey is the public key of the pair p replaces in the node's PKI directory: its private key's,
// else its certificate's (the service-account pair: its public key); nil when neither is readable.
func currentKey(files host.Files, p Pair) crypto.PublicKey {
	if data, err := files.ReadFile(pki(p.Key)); err == nil {
		if k, err := parseAnyKey(data); err == nil {
			return k.Public()
		}
	}
	data, err := files.ReadFile(pki(p.Cert))
	if err != nil {
		return nil
	}
	pub, err := publicHalf(p, data)
	if err != nil {
		return nil
	}
	return pub
}

// newPair makes one pair as kubeadm would: a key of like's kind (the pair it replaces, which
// kubeadm made in the cluster's encryptionAlgorithm; RSA-2048, kubeadm's default, when there is
// none) and, for an authority, a self-signed CA certificate valid for ten years; for the
// service-account key, its public key.
func newPair(p Pair, like crypto.PublicKey, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, keyPEM, err := newKeyOfKind(like)
	if err != nil {
		return nil, nil, err
	}
	if p.CommonName == "" {
		der, err := x509.MarshalPKIXPublicKey(key.Public())
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), keyPEM, nil
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 63))
	if err != nil {
		return nil, nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, nil, err
	}
	ski := sha256.Sum256(pubDER)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: p.CommonName},
		NotBefore:             now.Add(-5 * time.Minute).UTC(),
		NotAfter:              now.Add(CAValidity).UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ski[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// describe says of each staged pair what a person may see: its certificate's subject, expiry and
// fingerprint, and the key's mode. Never the key.
func describe(files host.Files, want []Pair) []string {
	var out []string
	for _, p := range want {
		mode := "?"
		if fi, err := files.Stat(staged(p.Key)); err == nil {
			mode = fmt.Sprintf("%04o", fi.Mode().Perm())
		}
		data, err := files.ReadFile(staged(p.Cert))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %s (key %s)", p.Name, staged(p.Cert), mode))
			continue
		}
		sum := sha256.Sum256(pemBytes(data))
		what, kind := "public key", "?"
		if c, err := parseCert(data); err == nil {
			what = fmt.Sprintf("CA %q, self-signed (new issuer), valid until %s", c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339))
		}
		if pub, err := publicHalf(p, data); err == nil {
			kind = keyKind(pub)
		}
		out = append(out, fmt.Sprintf("%s: %s: %s, sha256 %s; key %s %s mode %s", p.Name, staged(p.Cert), what, hex.EncodeToString(sum[:]), kind, staged(p.Key), mode))
	}
	return out
}

// keyKind names pub's kind as kubeadm's encryptionAlgorithm does (RSA-2048, ECDSA-P256).
func keyKind(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA-%d", k.N.BitLen())
	case *ecdsa.PublicKey:
		return "ECDSA-" + strings.ReplaceAll(k.Curve.Params().Name, "-", "")
	default:
		return fmt.Sprintf("%T", pub)
	}
}

// pemBytes is the DER inside a PEM block, or the data itself when it holds none.
func pemBytes(data []byte) []byte {
	if b, _ := pem.Decode(data); b != nil {
		return b.Bytes
	}
	return bytes.TrimSpace(data)
}
