package v1alpha1

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnotationCertificates is the node annotation in which a control plane's agent records its
// certificates' expiry as `kubeadm certs check-expiration` reports them, its certificate authorities'
// too (CertificateAuthorityNames), read on a slow jittered interval and written only when it changed
// (docs/design.md, "ClusterTarget"). The value is
// EncodeCertificates' JSON: a list of {name, notAfter}, sorted by name, whole seconds.
const AnnotationCertificates = "nodeops.io/certificates"

// CertificateAuthorityNames are the names `kubeadm certs check-expiration` gives the certificate
// authorities, which a control plane's agent records in AnnotationCertificates beside the leaf
// certificates: renewing keeps them, a rotation replaces them.
var CertificateAuthorityNames = []string{"ca", "etcd-ca", "front-proxy-ca"}

// SplitCertificateAuthorities separates a reading's certificate authorities from its leaf certificates.
func SplitCertificateAuthorities(certs []CertificateExpiry) (leaves, authorities []CertificateExpiry) {
	for _, c := range certs {
		if slices.Contains(CertificateAuthorityNames, c.Name) {
			authorities = append(authorities, c)
		} else {
			leaves = append(leaves, c)
		}
	}
	return leaves, authorities
}

// EncodeCertificates is the value of AnnotationCertificates for a reading: sorted by name and
// rounded to whole seconds, so that the same certificates always give the same text.
func EncodeCertificates(certs []CertificateExpiry) string {
	out := make([]CertificateExpiry, len(certs))
	for i, c := range certs {
		out[i] = CertificateExpiry{Name: c.Name, NotAfter: metav1.NewTime(c.NotAfter.UTC().Truncate(time.Second))}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	b, err := json.Marshal(out)
	if err != nil { // a list of strings and times always marshals
		panic(err)
	}
	return string(b)
}

// DecodeCertificates reads a value of AnnotationCertificates.
func DecodeCertificates(value string) ([]CertificateExpiry, error) {
	var out []CertificateExpiry
	if err := json.Unmarshal([]byte(value), &out); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationCertificates, err)
	}
	for _, c := range out {
		if c.Name == "" || c.NotAfter.IsZero() {
			return nil, fmt.Errorf("annotation %s: every certificate needs a name and a notAfter", AnnotationCertificates)
		}
	}
	return out, nil
}
