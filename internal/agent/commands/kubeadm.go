package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
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

// KubeadmPatchesDir is the one directory of kubeadm patches on a node (kubeadm's --patches: files
// named target[suffix][+patchtype].yaml): the reconfigure operation keeps its changes there so that
// kubeadm regenerates them, and the drift reader passes it to kubeadm when the node has it. Documented
// in docs/how-to/drift.md; keep both in step.
const KubeadmPatchesDir = "/etc/kubernetes/patches"

// kubeadmTmp is where `kubeadm upgrade ... --dry-run` writes the files it would have written
// (kubeadm-upgrade-apply-dryrunNNN/, kubeadm-upgrade-node-dryrunNNN/) and leaves them.
const kubeadmTmp = "/etc/kubernetes/tmp"

// kubeadmDryRunMu runs the agent's kubeadm dry runs one at a time (kubeadmDryRun).
var kubeadmDryRunMu sync.Mutex

// kubeadmDryRun runs kubeadm with --dry-run, then removes what that run left in kubeadmTmp, so
// that a DryRun leaves the host as it found it. kubeadm really wrote those files, so they are
// removed from the acting host's files, not the reporting ones.
func kubeadmDryRun(ctx context.Context, env *Env, args ...string) error {
	// One dry run at a time in the agent: two at once (a DryRun task's and the drift reader's) each
	// note whether kubeadmTmp existed before it, and the one that made it could find it still holding
	// the other's files and leave it behind (make test saw cp-2/etc/kubernetes/tmp left so).
	kubeadmDryRunMu.Lock()
	defer kubeadmDryRunMu.Unlock()
	files := env.actingFiles()
	before, existed, err := dirNames(files, kubeadmTmp)
	if err != nil {
		return err
	}
	runErr := kubeadm(ctx, env, append(args, "--dry-run")...)
	removed, cleanErr := removeDryRunLeftovers(files, kubeadmTmp, before, existed)
	for _, r := range removed {
		env.printf("removed kubeadm's dry-run files %s/%s\n", kubeadmTmp, r)
	}
	return errors.Join(runErr, cleanErr)
}

// dirNames lists host directory dir's entries; a missing dir is empty and not an error.
func dirNames(files host.Files, dir string) (map[string]bool, bool, error) {
	entries, err := files.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("listing %s: %w", dir, err)
	}
	names := make(map[string]bool, len(entries))
	for _, e := range entries {
		names[e.Name()] = true
	}
	return names, true, nil
}

// removeDryRunLeftovers removes the kubeadm-*dryrun* entries of host directory dir that are not in
// before, and dir itself when it did not exist before and is empty now. It returns the names it removed.
func removeDryRunLeftovers(files host.Files, dir string, before map[string]bool, existed bool) ([]string, error) {
	now, _, err := dirNames(files, dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for name := range now {
		if before[name] || !strings.HasPrefix(name, "kubeadm-") || !strings.Contains(name, "dryrun") {
			continue
		}
		if err := files.RemoveAll(dir + "/" + name); err != nil {
			return removed, fmt.Errorf("removing kubeadm's dry-run files %s: %w", name, err)
		}
		removed = append(removed, name)
	}
	if !existed && len(now) == len(removed) {
		if err := files.Remove(dir); err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// runKubeadmUpgradePlan only reads, so it runs in DryRun as it is.
func runKubeadmUpgradePlan(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradePlanCommand) (Result, error) {
	args := append([]string{"upgrade", "plan", c.KubernetesVersion}, ignorePreflight(c.IgnorePreflightErrors)...)
	if err := kubeadm(ctx, env, args...); err != nil {
		return Result{}, err
	}
	return Result{Message: fmt.Sprintf("kubeadm upgrade plan %s passed", c.KubernetesVersion)}, nil
}

// runUpgrade runs a kubeadm upgrade command, in its dry-run form in DryRun: there a DryRun is a
// different real invocation rather than a side effect left out. It is one of four handler branches
// on DryRun, with certs renew below, the drain's wait for evicted pods and wait-node-ready's
// static-pod versions; every other difference comes from the reporting host and client in env.
func runUpgrade(ctx context.Context, env *Env, args []string) error {
	if env.DryRun {
		return kubeadmDryRun(ctx, env, args...)
	}
	return kubeadm(ctx, env, args...)
}

// The upgrades pass the node's kubeadm patches directory when it has one, as the drift reader and
// reconfigure do: without it kubeadm would regenerate the manifests and undo the patches kept there.
func runKubeadmUpgradeApply(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradeApplyCommand) (Result, error) {
	patches, err := patchesArgs(env)
	if err != nil {
		return Result{}, err
	}
	args := append(append([]string{"upgrade", "apply", c.KubernetesVersion, "--yes"}, ignorePreflight(c.IgnorePreflightErrors)...), patches...)
	if err := runUpgrade(ctx, env, args); err != nil {
		return Result{}, err
	}
	return Result{Message: fmt.Sprintf("kubeadm upgrade apply %s succeeded", c.KubernetesVersion)}, nil
}

func runKubeadmUpgradeNode(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpgradeNodeCommand) (Result, error) {
	patches, err := patchesArgs(env)
	if err != nil {
		return Result{}, err
	}
	args := append(append([]string{"upgrade", "node"}, ignorePreflight(c.IgnorePreflightErrors)...), patches...)
	if err := runUpgrade(ctx, env, args); err != nil {
		return Result{}, err
	}
	return Result{Message: "kubeadm upgrade node succeeded"}, nil
}

// runKubeadmRenewCertificates renews the certificates and reports every certificate's expiry from
// `kubeadm certs check-expiration`. certs renew has no dry run, so DryRun renews nothing: the other
// explicit check, as the host's kubeadm stays real for check-expiration and upgrade --dry-run.
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
		Message:      fmt.Sprintf("renewed %s; %d certificates checked", strings.Join(certs, ", "), len(expiry)),
		Certificates: expiry,
	}, nil
}

// ParseCheckExpirationAuthorities reads the certificate authorities of `kubeadm certs
// check-expiration` (JSON output or the text table).
func ParseCheckExpirationAuthorities(out []byte) ([]v1alpha1.CertificateExpiry, error) {
	res := parseCheckExpiration(out, "certificateAuthorities", "AUTHORITY")
	if len(res) == 0 {
		return nil, fmt.Errorf("kubeadm certs check-expiration reported no certificate authorities")
	}
	return res, nil
}

// ParseCheckExpiration reads the certificates table of `kubeadm certs check-expiration` (JSON output
// or the text table); certificate authorities are not included.
func ParseCheckExpiration(out []byte) ([]v1alpha1.CertificateExpiry, error) {
	res := parseCheckExpiration(out, "certificates", "EXPIRES")
	if len(res) == 0 {
		return nil, fmt.Errorf("kubeadm certs check-expiration reported no certificates")
	}
	return res, nil
}

// parseCheckExpiration reads one list of `kubeadm certs check-expiration`'s output: from its JSON
// (the list named jsonList, missing entries left out) or, when there is none, from the text table
// whose header is "CERTIFICATE <header>" (the certificates' table is headed "CERTIFICATE EXPIRES",
// the authorities' "CERTIFICATE AUTHORITY"), up to the other table's header.
func parseCheckExpiration(out []byte, jsonList, header string) []v1alpha1.CertificateExpiry {
	if i := bytes.Index(out, []byte("{\n")); i >= 0 {
		type entry struct {
			Name           string    `json:"name"`
			ExpirationDate time.Time `json:"expirationDate"`
			Missing        bool      `json:"missing"`
		}
		var doc map[string]json.RawMessage
		var entries []entry
		if err := json.Unmarshal(out[i:], &doc); err == nil && json.Unmarshal(doc[jsonList], &entries) == nil && len(entries) > 0 {
			var res []v1alpha1.CertificateExpiry
			for _, c := range entries {
				if !c.Missing {
					res = append(res, v1alpha1.CertificateExpiry{Name: c.Name, NotAfter: metav1.NewTime(c.ExpirationDate)})
				}
			}
			return res
		}
	}
	var res []v1alpha1.CertificateExpiry
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 2 && fields[0] == "CERTIFICATE" && (fields[1] == "EXPIRES" || fields[1] == "AUTHORITY"):
			in = fields[1] == header
			continue
		case !in || len(fields) < 6:
			continue
		}
		// name  Mon DD, YYYY HH:MM UTC  residual  [ca]  externally-managed
		t, err := time.Parse("Jan 02, 2006 15:04 MST", strings.Join(fields[1:6], " "))
		if err != nil {
			continue
		}
		res = append(res, v1alpha1.CertificateExpiry{Name: fields[0], NotAfter: metav1.NewTime(t)})
	}
	return res
}

// KubeadmRender runs kubeadm args with --dry-run on h, its output (which holds the files it would
// write) into out, and removes what the run left in /etc/kubernetes/tmp, as a DryRun does: the drift
// reader's way of asking kubeadm what it generates without changing the node.
func KubeadmRender(ctx context.Context, h *host.Host, out io.Writer, args ...string) error {
	return kubeadmDryRun(ctx, &Env{Host: h, Out: out}, args...)
}
