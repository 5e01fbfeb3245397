package cakeys

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// Unprepared says whether a control plane holds no staged authorities at all, as in a whole
// rotation's DryRun, where phase prepare wrote nothing: the later phases cannot compute the exact
// files they would write without the new authorities, and list them with UnpreparedDryRun instead.
func Unprepared(files host.Files) bool {
	if Operation(files) != "" {
		return false
	}
	for _, c := range StaticPodComponents {
		if files.Exists(host.Manifest(host.ManifestsDir, c)) {
			return true
		}
	}
	return false
}

// UnpreparedDryRun lists, for a DryRun on a control plane where prepare staged nothing (Unprepared),
// every file the step would change, each with its issuer or what it trusts now and afterwards; the
// new authorities are named by what prepare would stage, since none exists yet. step is
// "trust-both", "re-issue" or "complete".
func UnpreparedDryRun(files host.Files, step string, authorities []string, serviceAccountKey bool) ([]string, error) {
	var out []string
	switch step {
	case "trust-both", "complete":
		bundles := make([]trustBundle, 0, 4)
		for _, a := range v1alpha1.OrAllAuthorities(authorities) {
			bundles = append(bundles, trustBundles[a])
		}
		if serviceAccountKey {
			bundles = append(bundles, serviceAccountBundle)
		}
		for _, b := range bundles {
			old, err := files.ReadFile(pki(b.old))
			if err != nil {
				return nil, err
			}
			now := strings.Join(Trusted(old), ", ")
			if step == "trust-both" {
				out = append(out, fmt.Sprintf("%s: would be created: trusts %s and the new %s (staged by prepare)", pki(b.bundle), now, b.what()))
			} else {
				out = append(out, fmt.Sprintf("%s: would be removed once %s is the new %s alone", pki(b.bundle), pki(b.old), b.what()))
			}
			comps := make([]string, 0, len(b.flags))
			for c := range b.flags {
				comps = append(comps, c)
			}
			sort.Strings(comps)
			for _, c := range comps {
				if !files.Exists(host.Manifest(host.ManifestsDir, c)) {
					continue
				}
				for _, f := range b.flags[c] {
					from, to := pki(b.old), pki(b.bundle)
					if step == "complete" {
						from, to = to, from
					}
					out = append(out, fmt.Sprintf("%s: flag --%s: %s -> %s (where it names %s)", host.Manifest(host.ManifestsDir, c), f, from, to, from))
				}
			}
			if b.name != v1alpha1.AuthorityCluster {
				continue
			}
			for _, kc := range append(append([]string(nil), kubeconfigTargets...), KubeletKubeconfig) {
				if !files.Exists(kc) {
					continue
				}
				if step == "trust-both" {
					out = append(out, fmt.Sprintf("%s: certificate-authority-data: %s -> %s and the new cluster authority", kc, now, now))
				} else {
					out = append(out, fmt.Sprintf("%s: certificate-authority-data: the old and the new cluster authority -> the new alone", kc))
				}
			}
			if files.Exists(KubeletConfigFile) {
				out = append(out, fmt.Sprintf("%s: clientCAFile: would name the bundle in trust-both, %s again in complete", KubeletConfigFile, pki(b.old)))
			}
		}
	case "re-issue":
		targets, err := ControlPlaneTargets(files, authorities)
		if err != nil {
			return nil, err
		}
		for _, t := range targets {
			c, _, err := ReadTarget(files, t)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			out = append(out, fmt.Sprintf("%s (%s): issuer %s -> the new %s authority (staged by prepare); serial %s", t.Path, t.Name, describeIssuerOf(c, files), t.Authority, serial(c)))
		}
		want, err := Pairs(authorities, serviceAccountKey)
		if err != nil {
			return nil, err
		}
		for _, p := range want {
			what, after := p.Name+" authority", ""
			if p == serviceAccountPair {
				what = "service-account key"
				after = fmt.Sprintf("; the API server and the controller-manager sign tokens with the new key once restarted, and the API server verifies the old key's through %s until complete",
					pki(serviceAccountBundle.bundle))
			}
			out = append(out, fmt.Sprintf("%s, %s: the old %s -> the new (the old kept in %s)%s", pki(p.Cert), pki(p.Key), what, PreviousDirectory, after))
		}
	default:
		return nil, fmt.Errorf("no dry run listing for step %q", step)
	}
	return out, nil
}

// WorkerUntrusted says whether a worker has no bundle of the old and the new cluster authority, as in
// a whole rotation's DryRun, where trust-both wrote nothing: re-issue cannot name the new authority,
// and lists the kubelet's client certificate with UnpreparedWorkerDryRun instead.
func WorkerUntrusted(files host.Files) bool {
	return !files.Exists(pki(trustBundles[v1alpha1.AuthorityCluster].bundle))
}

// UnpreparedWorkerDryRun lists the kubelet's client certificate a worker's re-issue would replace,
// with its issuer now and the new cluster authority afterwards.
func UnpreparedWorkerDryRun(files host.Files, node string) ([]string, error) {
	t, err := KubeletClientTarget(files)
	if err != nil || t == nil {
		return nil, err
	}
	c, _, err := ReadTarget(files, *t)
	if err != nil {
		return nil, err
	}
	return []string{fmt.Sprintf("%s (%s): issuer %s -> the new cluster authority, asked of the cluster's signer for system:node:%s once trust-both ran; serial %s",
		t.Path, t.Name, describeIssuerOf(c, files), node, serial(c))}, nil
}
