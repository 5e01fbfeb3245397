package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCertificatesAnnotationRoundTrip(t *testing.T) {
	at := time.Date(2027, 12, 1, 12, 30, 15, 999, time.FixedZone("x", 3600))
	in := []CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(at)}, {Name: "admin.conf", NotAfter: metav1.NewTime(at.Add(time.Hour))}}
	v := EncodeCertificates(in)
	if want := `[{"name":"admin.conf","notAfter":"2027-12-01T12:30:15Z"},{"name":"apiserver","notAfter":"2027-12-01T11:30:15Z"}]`; v != want {
		t.Fatalf("encoded %s, want %s", v, want)
	}
	if v2 := EncodeCertificates([]CertificateExpiry{in[1], in[0]}); v2 != v {
		t.Fatalf("the same reading in another order encodes differently: %s", v2)
	}
	out, err := DecodeCertificates(v)
	if err != nil || len(out) != 2 || out[1].Name != "apiserver" || !out[1].NotAfter.Equal(&metav1.Time{Time: at.Truncate(time.Second)}) {
		t.Fatalf("decoded %+v, %v", out, err)
	}
	for _, bad := range []string{"", "{}", `[{"name":""}]`, `[{"name":"a"}]`} {
		if _, err := DecodeCertificates(bad); err == nil {
			t.Errorf("%q decoded without an error", bad)
		}
	}
}
