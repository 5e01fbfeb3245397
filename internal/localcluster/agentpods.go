package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/internal/clock"
)

// agentPodInterval is how often the agent-pod stand-in looks at the agent Jobs' pods.
const agentPodInterval = time.Second

// agentJobPodKey is a kwok stage selector key whose value is "Job" for an agent Job's pod (labelled
// as config/agent labels agents, owned by a Job) and nothing for any other pod, the stand-in agent
// pods of --agent-credentials=pod-bound included. kwokStages makes every pod stage require it NotIn
// [Job], so kwok neither runs, completes nor deletes those pods: runAgentPods plays their kubelet.
const agentJobPodKey = `select(.metadata.labels."` + AgentLabel + `" == "` + AgentLabelValue + `") | .metadata.ownerReferences.[].kind`

// kwokStages copies kwok's stage configs into DIR/kwok-stages, each pod stage made to leave agent
// Jobs' pods alone, and returns the copies' paths.
func kwokStages(dir string, stages []string) ([]string, error) {
	if err := os.MkdirAll(filepath.Join(dir, "kwok-stages"), 0o755); err != nil {
		return nil, fmt.Errorf("creating kwok-stages: %w", err)
	}
	var out []string
	for _, f := range stages {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading kwok stage %s: %w", f, err)
		}
		var stage map[string]any
		if err := yaml.Unmarshal(data, &stage); err != nil {
			return nil, fmt.Errorf("kwok stage %s: %w", f, err)
		}
		spec, _ := stage["spec"].(map[string]any)
		ref, _ := spec["resourceRef"].(map[string]any)
		if ref["kind"] == "Pod" {
			sel, _ := spec["selector"].(map[string]any)
			if sel == nil {
				sel = map[string]any{}
				spec["selector"] = sel
			}
			exprs, _ := sel["matchExpressions"].([]any)
			sel["matchExpressions"] = append(exprs, map[string]any{"key": agentJobPodKey, "operator": "NotIn", "values": []any{"Job"}})
			if data, err = yaml.Marshal(stage); err != nil {
				return nil, fmt.Errorf("kwok stage %s: %w", f, err)
			}
		}
		dst := filepath.Join(dir, "kwok-stages", filepath.Base(f))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return nil, fmt.Errorf("writing %s: %w", dst, err)
		}
		out = append(out, dst)
	}
	return out, nil
}

// agentJobPod reports whether pod is an agent Job's pod (agentJobPodKey's test, in Go).
func agentJobPod(pod *corev1.Pod) bool {
	if pod.Labels[AgentLabel] != AgentLabelValue {
		return false
	}
	for _, o := range pod.OwnerReferences {
		if o.Kind == "Job" {
			return true
		}
	}
	return false
}

// AgentCommand is the process that stands in for an agent Job pod's container on a local node:
// bin/agent with the container's args, every --flag=PATH inside a hostPath mount translated into
// root (the Job's --host-root=/host, where it mounts the host's /, becomes the node's root), the
// container's env with the downward API's fields resolved from pod (POD_NAME, so the drain spares
// this pod), and what only a local process needs: the kubeconfig of a token bound to pod and the
// local service table.
func AgentCommand(pod *corev1.Pod, root, kubeconfig string) (args, env []string, err error) {
	if len(pod.Spec.Containers) != 1 {
		return nil, nil, fmt.Errorf("pod %s has %d containers, want the agent's one", pod.Name, len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	if len(ctr.Command) != 1 || filepath.Base(ctr.Command[0]) != "agent" {
		return nil, nil, fmt.Errorf("pod %s runs %q, not the agent", pod.Name, ctr.Command)
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	local := func(p string) (string, bool) {
		for _, m := range ctr.VolumeMounts {
			host, ok := hostPaths[m.Name]
			if rel, err := filepath.Rel(m.MountPath, p); ok && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				return filepath.Join(root, host, rel), true
			}
		}
		return "", false
	}
	for _, a := range ctr.Args {
		if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") && filepath.IsAbs(value) {
			if p, ok := local(value); ok {
				a = name + "=" + p
			}
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--service-manager=local")
	for _, e := range ctr.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return nil, nil, fmt.Errorf("pod %s: env %s: only the downward API's fields are resolved locally", pod.Name, e.Name)
			}
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "spec.nodeName":
				v = pod.Spec.NodeName
			case "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			default:
				return nil, nil, fmt.Errorf("pod %s: env %s: field %s is not resolved locally", pod.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return args, env, nil
}

// RunningStatus is the status a kubelet writes once an agent pod's container started at start.
func RunningStatus(pod *corev1.Pod, start time.Time) corev1.PodStatus {
	at := metav1.NewTime(start)
	ctr := pod.Spec.Containers[0]
	return corev1.PodStatus{
		Phase:      corev1.PodRunning,
		StartTime:  &at,
		Conditions: podConditions(at, corev1.ConditionTrue),
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: ctr.Name, Image: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at}},
		}},
	}
}

// FinishedStatus is the status a kubelet writes once an agent pod's container exited with code,
// the pod not restarting it: Succeeded for 0, else Failed.
func FinishedStatus(pod *corev1.Pod, start, end time.Time, code int) corev1.PodStatus {
	s := RunningStatus(pod, start)
	at := metav1.NewTime(end)
	s.Phase, s.Conditions = corev1.PodSucceeded, podConditions(at, corev1.ConditionFalse)
	reason := "Completed"
	if code != 0 {
		s.Phase, reason = corev1.PodFailed, "Error"
	}
	cs := &s.ContainerStatuses[0]
	cs.Ready, cs.Started = false, ptr.To(false)
	cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: reason, StartedAt: *s.StartTime, FinishedAt: at}}
	return s
}

// podConditions: scheduled and initialized, ready (its one container) or not.
func podConditions(at metav1.Time, ready corev1.ConditionStatus) []corev1.PodCondition {
	return []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: at},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: at},
		{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: at},
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: at},
	}
}

// agentProc is the process of one agent Job pod.
type agentProc struct {
	component string
	cmd       *exec.Cmd
	done      <-chan struct{}
	start     time.Time
	// killAt is set once the pod is deleting and the process was sent SIGTERM.
	killAt time.Time
}

func (p *agentProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitCode is the process's exit code, 128+signal when a signal ended it, as a container runtime reports.
func (p *agentProc) exitCode() int {
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *agentProc) signal(sig syscall.Signal) { _ = syscall.Kill(-p.cmd.Process.Pid, sig) }

// agentPods is the local stand-in for the kubelet of the agent Jobs' pods (--agent-mode=Job): the
// manager creates a Job per node with work, kube-controller-manager its pod, and for a pod on a local
// node this starts bin/agent (AgentCommand) with a token bound to that pod, writes the pod Running,
// then Succeeded or Failed with the exit code (the Job's restartPolicy is OnFailure: a kubelet would
// restart the container; here the Job controller makes a new pod instead), and on the pod's deletion
// sends SIGTERM, SIGKILL after its grace period, and removes it, as a kubelet does.
type agentPods struct {
	c     client.Client
	sup   *supervisor
	creds *credentials
	dir   string
	agent string
	nodes map[string]bool
	logf  func(string, ...any)
	procs map[types.UID]*agentProc
}

// runAgentPods plays the kubelet of agent Job pods on nodes until ctx ends, logging errors at most once a minute.
func runAgentPods(ctx context.Context, c client.Client, sup *supervisor, creds *credentials, o Options, nodes []string, logf func(string, ...any)) {
	a := &agentPods{c: c, sup: sup, creds: creds, dir: o.Dir, agent: filepath.Join(o.BinDir, "agent"), nodes: map[string]bool{}, logf: logf, procs: map[types.UID]*agentProc{}}
	for _, n := range nodes {
		a.nodes[n] = true
	}
	var lastLog time.Time
	for {
		if clock.Sleep(ctx, agentPodInterval) != nil {
			return
		}
		if err := a.sync(ctx); err != nil && ctx.Err() == nil && time.Since(lastLog) > time.Minute {
			logf("agent Job pods: %v", err)
			lastLog = time.Now()
		}
	}
}

func (a *agentPods) sync(ctx context.Context) error {
	var pods corev1.PodList
	if err := a.c.List(ctx, &pods, client.InNamespace(SystemNamespace), client.MatchingLabels{AgentLabel: AgentLabelValue}); err != nil {
		return fmt.Errorf("listing: %w", err)
	}
	var errs []string
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !agentJobPod(pod) || !a.nodes[pod.Spec.NodeName] {
			continue
		}
		seen[pod.UID] = true
		if err := a.syncPod(ctx, pod); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", pod.Name, err))
		}
	}
	for uid, p := range a.procs {
		if !seen[uid] {
			// Removed without us (a forced delete): nothing is left to report to.
			p.signal(syscall.SIGKILL)
			a.forget(uid)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func (a *agentPods) syncPod(ctx context.Context, pod *corev1.Pod) error {
	p := a.procs[pod.UID]
	finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	switch {
	case pod.DeletionTimestamp != nil:
		if p != nil && !p.exited() {
			switch {
			case p.killAt.IsZero():
				a.logf("agent Job pod %s is deleting: stopping its agent", pod.Name)
				p.signal(syscall.SIGTERM)
				p.killAt = time.Now().Add(time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 30)) * time.Second)
			case time.Now().After(p.killAt):
				p.signal(syscall.SIGKILL)
			}
			return nil
		}
		a.forget(pod.UID)
		if ptr.Deref(pod.DeletionGracePeriodSeconds, 1) == 0 {
			return nil // removed once the Job controller drops its finalizer
		}
		err := a.c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(pod.UID)})
		return client.IgnoreNotFound(err)
	case finished:
		a.forget(pod.UID)
		return nil
	case p == nil:
		return a.startPod(ctx, pod)
	case !p.exited():
		if pod.Status.Phase != corev1.PodRunning {
			return a.writeStatus(ctx, pod, RunningStatus(pod, p.start)) // the first write failed
		}
	default:
		code := p.exitCode()
		if err := a.writeStatus(ctx, pod, FinishedStatus(pod, p.start, time.Now(), code)); err != nil {
			return err
		}
		a.logf("agent Job pod %s on %s: its agent exited %d", pod.Name, pod.Spec.NodeName, code)
		a.forget(pod.UID)
	}
	return nil
}

func (a *agentPods) startPod(ctx context.Context, pod *corev1.Pod) error {
	component := "agent-" + pod.Name
	args, env, err := AgentCommand(pod, filepath.Join(a.dir, "nodes", pod.Spec.NodeName), CredentialsKubeconfig(a.dir, component))
	if err != nil {
		return err
	}
	if err := a.creds.addPod(ctx, component, pod); err != nil {
		return err
	}
	cmd, done, err := a.sup.runOnce(component, a.agent, args, env)
	if err != nil {
		a.creds.removePod(component)
		return err
	}
	p := &agentProc{component: component, cmd: cmd, done: done, start: time.Now()}
	a.procs[pod.UID] = p
	a.logf("agent Job pod %s on %s: running its agent (%s)", pod.Name, pod.Spec.NodeName, filepath.Join(a.dir, "logs", component+".log"))
	return a.writeStatus(ctx, pod, RunningStatus(pod, p.start))
}

func (a *agentPods) writeStatus(ctx context.Context, pod *corev1.Pod, s corev1.PodStatus) error {
	base := pod.DeepCopy()
	pod.Status = s
	// A pod's status is its kubelet's, which this stands in for; statuswrite writes nodeops' kinds.
	if err := a.c.Status().Patch(ctx, pod, client.MergeFrom(base)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("writing status %s: %w", s.Phase, err)
	}
	return nil
}

func (a *agentPods) forget(uid types.UID) {
	if p := a.procs[uid]; p != nil {
		a.creds.removePod(p.component)
		delete(a.procs, uid)
	}
}
