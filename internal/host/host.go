// Package host is how the agent touches a node: programs run inside the host root, files under it,
// services restarted through the host's service manager, and the OS detected from it.
// Every side effect is behind a small interface so commands can be tested on a temporary root.
//
// It touches only what is under the host root it was opened on (Files confines every path) and knows
// nothing of the API server.
package host

import (
	"context"
	"io"
)

// Runner runs a program inside the host root.
type Runner interface {
	Run(ctx context.Context, c Cmd) error
}

// Cmd is one program run. Env is the whole environment: nothing is inherited from the agent,
// so the agent's cluster credentials never reach a host program.
type Cmd struct {
	// Path of the program inside the host root, such as /bin/sh.
	Path string
	Args []string
	Env  []string
	// Stdout and Stderr both go to Output when it is set.
	Output io.Writer
	Stdin  io.Reader
}

// Kubeadm runs `<root>/usr/bin/kubeadm --rootfs <root> args...`: kubeadm chroots itself.
type Kubeadm interface {
	Kubeadm(ctx context.Context, out io.Writer, args ...string) error
}

// ServiceManager restarts a service on the host.
type ServiceManager interface {
	Restart(ctx context.Context, name string) error
	// Name says which implementation this is, for messages.
	Name() string
	// Supported says why restarts cannot work on this host, nil when they can: the preflight asks it.
	Supported() error
}

// Host is everything the agent's commands may do to one node.
type Host struct {
	// Root is the host's / as the agent sees it, such as /host or a local node's directory.
	Root       string
	Exec       Runner
	Kubeadm    Kubeadm
	Files      Files
	Services   ServiceManager
	StaticPods StaticPods
	// KubeletPods reads the kubelet's own view of its pods where a kubelet runs (nil on local nodes).
	KubeletPods *KubeletPods
}

// Open builds the Host of root for the service manager --service-manager names: the one place that
// chooses between a real node and nodeops-local's stand-ins ("local").
func Open(serviceManager, root string) (*Host, error) {
	if serviceManager == ServiceManagerLocal {
		return NewLocal(root), nil
	}
	services, err := NewServiceManager(serviceManager, root, &ChrootRunner{Root: root})
	if err != nil {
		return nil, err
	}
	return New(root, services), nil
}

// New builds the Host of a real node under root, with the given service manager.
func New(root string, services ServiceManager) *Host {
	files := &FS{Root: root}
	return &Host{
		Root:        root,
		Exec:        &ChrootRunner{Root: root},
		Kubeadm:     &KubeadmRunner{Root: root},
		Files:       files,
		Services:    services,
		StaticPods:  &KubeletStaticPods{Files: files},
		KubeletPods: &KubeletPods{Root: root},
	}
}

// NewLocal builds the Host of a nodeops-local node, where no kubelet runs: service and static pod
// restarts are recorded in the local service table (the one stand-in).
func NewLocal(root string) *Host {
	files := &FS{Root: root}
	table := &LocalServices{Files: files}
	return &Host{
		Root:       root,
		Exec:       &ChrootRunner{Root: root},
		Kubeadm:    &KubeadmRunner{Root: root},
		Files:      files,
		Services:   table,
		StaticPods: &LocalStaticPods{Files: files, Table: table},
	}
}
