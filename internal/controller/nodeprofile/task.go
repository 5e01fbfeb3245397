package nodeprofile

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

// Action is what a profile's task does on its node.
type Action string

const (
	ActionInstall   Action = "install"
	ActionUninstall Action = "uninstall"
)

// group names a task's group: the action and the spec hash, so that a re-provision after a spec
// change is a new task with a new name rather than the finished one found again.
func group(a Action, hash string) string { return string(a) + "-" + hash }

// parseGroup reverses group; ok is false for a task this package did not build.
func parseGroup(g string) (a Action, hash string, ok bool) {
	action, hash, found := strings.Cut(g, "-")
	if !found || hash == "" {
		return "", "", false
	}
	switch Action(action) {
	case ActionInstall, ActionUninstall:
		return Action(action), hash, true
	}
	return "", "", false
}

// TaskName is the deterministic name of the task running action at hash on node for profile.
func TaskName(profile string, a Action, hash, node string) string {
	return objname.TaskName(profile, group(a, hash), node)
}

// RecordFinalizer keeps a profile's task someone deleted until the node records what it did: the
// node's label and hash annotation are the profile's record of an install, so an install that
// succeeded goes once its node is labelled, an uninstall once the label is gone (decide's
// Release). Without it, an install deleted before its label would leave no trace and be run again
// (rule 7: deleting history by hand never makes anything run again). A failed or aborted task goes
// at once: deleting it is how a person asks for a fresh install.
const RecordFinalizer = "nodeops.io/profile-record"

// BuildTask builds the NodeTask that runs the profile's install or uninstall commands on node at
// hash, owned by the profile so it goes when the profile does.
func BuildTask(p *v1alpha1.NodeProfile, node string, a Action, hash string) *v1alpha1.NodeTask {
	commands := p.Spec.Install
	if a == ActionUninstall {
		commands = p.Spec.Uninstall
	}
	g := group(a, hash)
	cmds := make([]v1alpha1.Command, len(commands))
	for i := range commands {
		commands[i].DeepCopyInto(&cmds[i])
	}
	return &v1alpha1.NodeTask{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeTask"},
		ObjectMeta: metav1.ObjectMeta{
			Name: objname.TaskName(p.Name, g, node),
			Labels: map[string]string{
				v1alpha1.LabelProfile: objname.LabelValue(p.Name),
				v1alpha1.LabelNode:    objname.LabelValue(node),
				v1alpha1.LabelGroup:   objname.LabelValue(g),
			},
			Finalizers:      []string{RecordFinalizer},
			OwnerReferences: []metav1.OwnerReference{ownerRef(p)},
		},
		Spec: v1alpha1.NodeTaskSpec{
			NodeName:      node,
			Operation:     p.Name,
			Group:         g,
			Commands:      cmds,
			ExecutionMode: v1alpha1.ExecutionAuto,
		},
	}
}

// ownerRef makes p the controller of what it creates (tasks, RuntimeClasses).
func ownerRef(p *v1alpha1.NodeProfile) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.GroupVersion.String(),
		Kind:               "NodeProfile",
		Name:               p.Name,
		UID:                p.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}
