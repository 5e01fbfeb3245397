package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func ignorePreflight(errs []string) []string {
	if len(errs) == 0 {
		return nil
	}
	return []string{"--ignore-preflight-errors=" + strings.Join(errs, ",")}
}

func kubeadm(ctx context.Context, env *Env, args ...string) error {
	return env.Host.Kubeadm.Kubeadm(ctx, env.Out, args...)
}

// runKubeadmUpgradePlan only reads, so it runs in DryRun as it is.
func runKubeadmUpgradePlan(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradePlanCommand) (Result, error) {
	args := append([]string{"upgrade", "plan", c.KubernetesVersion}, ignorePreflight(c.IgnorePreflightErrors)...)
	if err := kubeadm(ctx, env, args...); err != nil {
		return Result{}, err
	}
	return Result{Message: fmt.Sprintf("kubeadm upgrade plan %s passed", c.KubernetesVersion)}, nil
}

func runKubeadmUpgradeApply(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradeApplyCommand) (Result, error) {
	args := append([]string{"upgrade", "apply", c.KubernetesVersion, "--yes"}, ignorePreflight(c.IgnorePreflightErrors)...)
	if env.DryRun {
		args = append(args, "--dry-run")
	}
	if err := kubeadm(ctx, env, args...); err != nil {
		return Result{}, err
	}
	return Result{Message: dryRunPrefix(env) + fmt.Sprintf("kubeadm upgrade apply %s succeeded", c.KubernetesVersion)}, nil
}

func runKubeadmUpgradeNode(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradeNodeCommand) (Result, error) {
	args := append([]string{"upgrade", "node"}, ignorePreflight(c.IgnorePreflightErrors)...)
	if env.DryRun {
		args = append(args, "--dry-run")
	}
	if err := kubeadm(ctx, env, args...); err != nil {
		return Result{}, err
	}
	return Result{Message: dryRunPrefix(env) + "kubeadm upgrade node succeeded"}, nil
}

// runKubeadmRenewCertificates renews the certificates (kubeadm certs renew has no dry run, so DryRun
// renews nothing) and reports every certificate's expiry from `kubeadm certs check-expiration`.
func runKubeadmRenewCertificates(ctx context.Context, env *Env, c *v1alpha1.KubeadmRenewCertificatesCommand) (Result, error) {
	certs := c.Certificates
	if len(certs) == 0 {
		certs = []string{"all"}
	}
	for _, cert := range certs {
		if env.DryRun {
			env.printf("dry run: would run kubeadm certs renew %s\n", cert)
			continue
		}
		if err := kubeadm(ctx, env, "certs", "renew", cert); err != nil {
			return Result{}, err
		}
	}
	var out bytes.Buffer
	w := io.Writer(&out)
	if env.Out != nil {
		w = io.MultiWriter(&out, env.Out)
	}
	if err := env.Host.Kubeadm.Kubeadm(ctx, w, "certs", "check-expiration", "-o", "json"); err != nil {
		return Result{}, err
	}
	expiry, err := ParseCheckExpiration(out.Bytes())
	if err != nil {
		return Result{}, err
	}
	return Result{
		Message:      dryRunPrefix(env) + fmt.Sprintf("renewed %s; %d certificates checked", strings.Join(certs, ", "), len(expiry)),
		Certificates: expiry,
	}, nil
}

func dryRunPrefix(env *Env) string {
	if env.DryRun {
		return "dry run: "
	}
	return ""
}

// ParseCheckExpiration reads the certificates table of `kubeadm certs check-expiration` (JSON output
// or the text table); certificate authorities are not included.
func ParseCheckExpiration(out []byte) ([]v1alpha1.CertificateExpiry, error) {
	if i := bytes.Index(out, []byte("{\n")); i >= 0 {
		var doc struct {
			Certificates []struct {
				Name           string    `json:"name"`
				ExpirationDate time.Time `json:"expirationDate"`
				Missing        bool      `json:"missing"`
			} `json:"certificates"`
		}
		if err := json.Unmarshal(out[i:], &doc); err == nil && len(doc.Certificates) > 0 {
			var res []v1alpha1.CertificateExpiry
			for _, c := range doc.Certificates {
				if !c.Missing {
					res = append(res, v1alpha1.CertificateExpiry{Name: c.Name, NotAfter: metav1.NewTime(c.ExpirationDate)})
				}
			}
			return res, nil
		}
	}
	var res []v1alpha1.CertificateExpiry
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 2 && fields[0] == "CERTIFICATE" && fields[1] == "EXPIRES":
			in = true
			continue
		case len(fields) >= 2 && fields[0] == "CERTIFICATE" && fields[1] == "AUTHORITY":
			in = false
			continue
		case !in || len(fields) < 6:
			continue
		}
		// name  Mon DD, YYYY HH:MM UTC  residual  ca  externally-managed
		t, err := time.Parse("Jan 02, 2006 15:04 MST", strings.Join(fields[1:6], " "))
		if err != nil {
			continue
		}
		res = append(res, v1alpha1.CertificateExpiry{Name: fields[0], NotAfter: metav1.NewTime(t)})
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("kubeadm certs check-expiration reported no certificates")
	}
	return res, nil
}
