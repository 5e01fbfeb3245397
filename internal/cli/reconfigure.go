package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// reconfigureFlags are what `reconfigure` and `plan reconfigure` take besides operationFlags.
type reconfigureFlags struct {
	apiServer, controllerManager, scheduler, etcd []string
	certSANs                                      []string
	featureGates                                  []string
	kubelet, kubeletFile                          string
	drain                                         bool
}

func (f *reconfigureFlags) add(fs *pflag.FlagSet) {
	for _, c := range []struct {
		flag, component string
		to              *[]string
	}{
		{"apiserver-arg", "the API server", &f.apiServer},
		{"controller-manager-arg", "the controller-manager", &f.controllerManager},
		{"scheduler-arg", "the scheduler", &f.scheduler},
		{"etcd-arg", "the local etcd", &f.etcd},
	} {
		fs.StringArrayVar(c.to, c.flag, nil, "A flag of "+c.component+" to set, NAME=VALUE with the name without dashes (audit-log-maxage=30), or NAME- to remove it; repeat for more")
	}
	fs.StringSliceVar(&f.certSANs, "apiserver-cert-san", nil, "Extra names for the API server's serving certificate (apiServer.certSANs), comma-separated or repeated")
	fs.StringSliceVar(&f.featureGates, "feature-gate", nil, "kubeadm feature gates, NAME=true|false, comma-separated or repeated")
	fs.StringVar(&f.kubelet, "kubelet-config", "", "A merge patch over every node's KubeletConfiguration, in YAML or JSON, such as 'maxPods: 150'")
	fs.StringVar(&f.kubeletFile, "kubelet-config-file", "", "Read the KubeletConfiguration merge patch from this file (- for standard input)")
	fs.BoolVar(&f.drain, "drain", false, "Drain each worker before its kubelet restarts (control planes are never drained)")
}

// reconfigureOperation builds the NodeOperation `reconfigure` would create.
func (f *operationFlags) reconfigureOperation(r *reconfigureFlags, stdin func() ([]byte, error)) (*nodeopsv1.NodeOperation, error) {
	rc := &nodeopsv1.ReconfigureOperation{}
	cc := &nodeopsv1.ClusterConfigurationPatch{}
	var err error
	var component nodeopsv1.ControlPlaneComponentPatch
	if component, err = componentPatch("--apiserver-arg", r.apiServer); err != nil {
		return nil, err
	}
	if !emptyPatch(component) || len(r.certSANs) > 0 {
		cc.APIServer = &nodeopsv1.APIServerPatch{ControlPlaneComponentPatch: component, CertSANs: r.certSANs}
	}
	for _, c := range []struct {
		flag string
		args []string
		to   **nodeopsv1.ControlPlaneComponentPatch
	}{{"--controller-manager-arg", r.controllerManager, &cc.ControllerManager}, {"--scheduler-arg", r.scheduler, &cc.Scheduler}} {
		p, err := componentPatch(c.flag, c.args)
		if err != nil {
			return nil, err
		}
		if !emptyPatch(p) {
			*c.to = &p
		}
	}
	if component, err = componentPatch("--etcd-arg", r.etcd); err != nil {
		return nil, err
	}
	if !emptyPatch(component) {
		cc.Etcd = &nodeopsv1.EtcdPatch{ExtraArgs: component.ExtraArgs, RemoveExtraArgs: component.RemoveExtraArgs}
	}
	for _, g := range r.featureGates {
		name, value, ok := strings.Cut(g, "=")
		on, perr := strconv.ParseBool(value)
		if !ok || name == "" || perr != nil {
			return nil, fmt.Errorf("--feature-gate %q must be NAME=true or NAME=false", g)
		}
		if cc.FeatureGates == nil {
			cc.FeatureGates = map[string]bool{}
		}
		cc.FeatureGates[name] = on
	}
	if cc.APIServer != nil || cc.ControllerManager != nil || cc.Scheduler != nil || cc.Etcd != nil || len(cc.FeatureGates) > 0 {
		rc.ClusterConfiguration = cc
	}
	switch {
	case r.kubelet != "" && r.kubeletFile != "":
		return nil, fmt.Errorf("--kubelet-config and --kubelet-config-file cannot be combined")
	case r.kubeletFile == "-":
		data, err := stdin()
		if err != nil {
			return nil, fmt.Errorf("--kubelet-config-file -: %w", err)
		}
		rc.KubeletConfiguration = string(data)
	case r.kubeletFile != "":
		data, err := os.ReadFile(r.kubeletFile)
		if err != nil {
			return nil, fmt.Errorf("--kubelet-config-file: %w", err)
		}
		rc.KubeletConfiguration = string(data)
	default:
		rc.KubeletConfiguration = r.kubelet
	}
	if rc.ClusterConfiguration == nil && strings.TrimSpace(rc.KubeletConfiguration) == "" {
		return nil, fmt.Errorf("nothing to reconfigure: give a component flag (--apiserver-arg, --controller-manager-arg, --scheduler-arg, --etcd-arg), --apiserver-cert-san, --feature-gate or --kubelet-config")
	}
	if r.drain {
		rc.Drain = &nodeopsv1.DrainCommand{}
	}
	op := &nodeopsv1.NodeOperation{Spec: nodeopsv1.NodeOperationSpec{Reconfigure: rc}}
	return op, f.finish(op, "reconfigure-")
}

// componentPatch reads a component's NAME=VALUE and NAME- arguments; for a flag named more than
// once, the last argument wins.
func componentPatch(flag string, args []string) (nodeopsv1.ControlPlaneComponentPatch, error) {
	var order []string
	last := map[string]*string{} // nil: removed
	for _, a := range args {
		name, value, isSet := strings.Cut(a, "=")
		if !isSet {
			name, _ = strings.CutSuffix(a, "-")
			if name == a {
				name = ""
			}
		}
		if name == "" || strings.HasPrefix(name, "-") {
			return nodeopsv1.ControlPlaneComponentPatch{}, fmt.Errorf("%s %q must be NAME=VALUE with the flag's name without dashes (audit-log-maxage=30), or NAME- to remove it", flag, a)
		}
		if _, seen := last[name]; !seen {
			order = append(order, name)
		}
		last[name] = nil
		if isSet {
			last[name] = &value
		}
	}
	var p nodeopsv1.ControlPlaneComponentPatch
	for _, name := range order {
		if v := last[name]; v != nil {
			p.ExtraArgs = append(p.ExtraArgs, nodeopsv1.ExtraArg{Name: name, Value: *v})
		} else {
			p.RemoveExtraArgs = append(p.RemoveExtraArgs, name)
		}
	}
	return p, nil
}

func emptyPatch(p nodeopsv1.ControlPlaneComponentPatch) bool {
	return len(p.ExtraArgs) == 0 && len(p.RemoveExtraArgs) == 0 && len(p.ExtraVolumes) == 0
}

func newReconfigureCommand(o *Options) *cobra.Command {
	f := &createFlags{}
	r := &reconfigureFlags{}
	cmd := &cobra.Command{
		Use:   "reconfigure",
		Short: "Change the kubeadm cluster's configuration node by node (creates a NodeOperation)",
		Long: `Create a NodeOperation that changes the cluster's configuration as kubeadm's
"Reconfiguring a kubeadm cluster" does by hand: kube-system/kubeadm-config and
kubelet-config are patched once, on the first control-plane node; then each
control-plane node in turn regenerates its static pod manifests with kubeadm and
waits until its components serve again, and every node (workers --max-unavailable
at a time, drained only with --drain) rewrites its kubelet configuration and
restarts its kubelet. A later upgrade keeps the change.

Run 'kubectl nodeops plan reconfigure' with the same flags first, and a --dry-run
to see each node's difference. See docs/how-to/reconfigure.md.`,
		Example: `  # Keep audit logs 30 days and allow 150 pods per node; see each node's difference first
  kubectl nodeops reconfigure --apiserver-arg audit-log-maxage=30 --kubelet-config 'maxPods: 150' --dry-run --watch
  kubectl nodeops reconfigure --apiserver-arg audit-log-maxage=30 --kubelet-config 'maxPods: 150' --watch

  # Remove a scheduler flag set earlier, and raise the controller-manager's verbosity
  kubectl nodeops reconfigure --scheduler-arg profiling- --controller-manager-arg v=4

  # A kubelet configuration patch from a file, workers drained three at a time
  kubectl nodeops reconfigure --kubelet-config-file kubelet-patch.yaml --drain --max-unavailable 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			op, err := f.reconfigureOperation(r, func() ([]byte, error) { return io.ReadAll(o.In) })
			if err != nil {
				return err
			}
			return o.create(cmd.Context(), op, f)
		},
	}
	f.add(cmd.Flags())
	r.add(cmd.Flags())
	return cmd
}
