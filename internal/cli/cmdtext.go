package cli

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// commandText says what a command does on the node, in one line.
func commandText(c *nodeopsv1.Command) string {
	var s string
	switch {
	case c.KubeadmUpgradeApply != nil:
		s = "kubeadm upgrade apply " + c.KubeadmUpgradeApply.KubernetesVersion + ignoring(c.KubeadmUpgradeApply.IgnorePreflightErrors)
	case c.KubeadmUpgradeNode != nil:
		s = "kubeadm upgrade node" + ignoring(c.KubeadmUpgradeNode.IgnorePreflightErrors)
	case c.KubeadmUpgradePlan != nil:
		s = "kubeadm upgrade plan " + c.KubeadmUpgradePlan.KubernetesVersion + ignoring(c.KubeadmUpgradePlan.IgnorePreflightErrors)
	case c.KubeadmRenewCertificates != nil:
		certs := c.KubeadmRenewCertificates.Certificates
		if len(certs) == 0 {
			certs = []string{"all"}
		}
		s = "kubeadm certs renew " + strings.Join(certs, " ")
	case c.RestartStaticPods != nil:
		comps := c.RestartStaticPods.Components
		if len(comps) == 0 {
			comps = []string{"all"}
		}
		s = "restart static pods: " + strings.Join(comps, ", ")
	case c.InstallBinaries != nil:
		s = fmt.Sprintf("install %s %s from %s", strings.Join(c.InstallBinaries.Components, ", "),
			c.InstallBinaries.Version, c.InstallBinaries.Source.BaseURL)
	case c.RestartService != nil:
		s = "restart service " + c.RestartService.Name
	case c.Cordon != nil:
		s = "cordon the node"
	case c.Uncordon != nil:
		s = "uncordon the node (if cordon found it schedulable)"
	case c.Drain != nil:
		s = "drain the node" + drainText(c.Drain)
	case c.WaitNodeReady != nil:
		s = "wait for the node to be Ready" + durationText(" within ", c.WaitNodeReady.Timeout)
	case c.Preflight != nil:
		s = "preflight checks" + preflightText(c.Preflight.Checks)
	case c.InstallFile != nil:
		if c.InstallFile.Remove {
			s = "remove " + c.InstallFile.Path
		} else {
			s = fmt.Sprintf("install %s from %s", c.InstallFile.Path, c.InstallFile.URL)
		}
	case c.ContainerdRuntime != nil:
		r := c.ContainerdRuntime
		if r.Remove {
			s = "remove containerd runtime " + r.Name
		} else {
			s = fmt.Sprintf("add containerd runtime %s (%s)", r.Name, r.RuntimeType)
		}
		if !r.SkipRestart {
			s += ", restart containerd"
		}
	case c.Script != nil:
		s = "script: " + firstLine(c.Script.Inline)
		if c.Script.Idempotent {
			s += " (idempotent)"
		}
	case c.Wait != nil:
		s = "wait " + c.Wait.Duration.Duration.String()
	default:
		s = "unknown command"
	}
	if c.Retries > 0 {
		s += fmt.Sprintf(" [retries %d]", c.Retries)
	}
	s += durationText(" [timeout ", c.Timeout)
	if c.Timeout != nil {
		s += "]"
	}
	return s
}

func ignoring(errs []string) string {
	if len(errs) == 0 {
		return ""
	}
	return " --ignore-preflight-errors=" + strings.Join(errs, ",")
}

func durationText(prefix string, d *metav1.Duration) string {
	if d == nil {
		return ""
	}
	return prefix + d.Duration.String()
}

func drainText(d *nodeopsv1.DrainCommand) string {
	var parts []string
	if d.Timeout != nil {
		parts = append(parts, "timeout "+d.Timeout.Duration.String())
	}
	if d.GracePeriodSeconds != nil {
		parts = append(parts, fmt.Sprintf("grace %ds", *d.GracePeriodSeconds))
	}
	if d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets {
		parts = append(parts, "ignoring DaemonSets")
	}
	if d.DeleteEmptyDirData {
		parts = append(parts, "deleting emptyDir data")
	}
	if d.PodSelector != nil {
		parts = append(parts, "pods "+metav1.FormatLabelSelector(d.PodSelector))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func preflightText(checks []nodeopsv1.PreflightCheck) string {
	var parts []string
	for _, c := range checks {
		switch {
		case c.Binary != "":
			parts = append(parts, "has "+c.Binary)
		case c.MinFreeDiskMiB > 0:
			parts = append(parts, fmt.Sprintf("%d MiB free", c.MinFreeDiskMiB))
		case len(c.OSFamily) > 0:
			parts = append(parts, "OS "+strings.Join(c.OSFamily, "|"))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	line, rest, _ := strings.Cut(s, "\n")
	line = strings.TrimSpace(line)
	if len(line) > 60 {
		line = line[:57] + "..."
	} else if strings.TrimSpace(rest) != "" {
		line += " ..."
	}
	return line
}
