package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/redact"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Envtest has no kubelet: these tests run nodeops-local's stand-in for its secret volumes
// (localcluster.SecretVolumes), which writes a holder pod's Secrets into its node's root where the
// kubelet would mount them; the manager's secret holder controller runs for the package
// (startDrainController). The real-node test proves the kubelet's own mount
// (TestRealNode5ScriptSecretFromTheKubelet).

func createSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: commands.SecretNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	installerServiceAccount(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: commands.SecretNamespace}, StringData: data})
}

// secretVolumes plays the kubelet's secret volumes for nodes (name to root) until the test ends.
func secretVolumes(t *testing.T, roots map[string]string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { (&localcluster.SecretVolumes{Client: cl, Roots: roots}).Run(ctx, t.Logf) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// holderGone waits until the task's secret holder pod is gone or being deleted (no kubelet finishes it).
func holderGone(t *testing.T, task string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "no secret holder pod of "+task, func() error {
		pod := &corev1.Pod{}
		err := cl.Get(context.Background(), client.ObjectKey{Namespace: secretholder.Namespace, Name: secretholder.PodName(task)}, pod)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case pod.DeletionTimestamp == nil:
			return fmt.Errorf("pod %s is there", pod.Name)
		}
		return nil
	})
}

// A script's environment comes from Secrets read when it runs, from the volumes its node's kubelet
// mounted for the task's secret holder pod: the script gets the values, and neither the task nor
// anything the agent records of it holds one; URL credentials are redacted too; once the task
// finished its holder pod goes.
func TestScriptSecretsAreUsedAndRedacted(t *testing.T) {
	const token, password = "tok-5f3a9c1e77", "pw-b7d2e0c4aa"
	createSecret(t, "nodeops-script-creds", map[string]string{"token": token})
	createSecret(t, "nodeops-script-db", map[string]string{"DB_PASSWORD": password, "not-a-name": "x"})
	root := hosttest.NewRoot(t, map[string]string{"/var/tmp/.keep": ""})
	secretVolumes(t, map[string]string{"secrets-1": root})
	startAgent(t, agent.Options{NodeName: "secrets-1", HostRoot: root})

	create(t, newTask("secrets-1", "secrets-1", v1alpha1.ExecutionAuto, v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline: `echo "token=$TOKEN password=$DB_PASSWORD plain=$PLAIN"
echo "$TOKEN $DB_PASSWORD" > /var/tmp/got
echo "cloning https://bob:$DB_PASSWORD@git.example/repo.git and https://deploy:hunter2@mirror.example/x" >&2
exit 3`,
		Env: []v1alpha1.EnvVar{{Name: "PLAIN", Value: "visible"},
			{Name: "TOKEN", ValueFrom: &v1alpha1.EnvVarSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "nodeops-script-creds", Key: "token"}}}},
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-db"}}},
	}}))
	task := waitTask(t, "secrets-1", phaseIs(v1alpha1.TaskFailed))
	if got := hosttest.ReadFile(t, root, "/var/tmp/got"); got != token+" "+password+"\n" {
		t.Errorf("the script got %q, want the Secrets' values", got)
	}
	tail := task.Status.Commands[0].OutputTail
	for _, want := range []string{"token=[redacted] password=[redacted] plain=visible", "https://[redacted]@git.example/repo.git", "https://[redacted]@mirror.example/x",
		"read Secret nodeops-system/nodeops-script-db (2 keys) from pod nodeops-system/" + secretholder.PodName("secrets-1")} {
		if !strings.Contains(tail, want) {
			t.Errorf("output tail lacks %q:\n%s", want, tail)
		}
	}
	whole, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{token, password} {
		if strings.Contains(string(whole), secret) {
			t.Errorf("the task holds the secret %q:\n%s", secret, whole)
		}
	}
	// This one is in the script itself, so only its status must not show it.
	if status, _ := json.Marshal(task.Status); strings.Contains(string(status), "hunter2") {
		t.Errorf("the task's status shows a URL's password:\n%s", status)
	}
	holderGone(t, "secrets-1")
}

// Messages are redacted as the tail is: here a download error that names a URL with credentials.
func TestMessagesHaveURLCredentialsRedacted(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "secrets-2", HostRoot: root})
	create(t, newTask("secrets-2", "secrets-2", v1alpha1.ExecutionAuto, v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
		URL: "https://deploy:s3cr3t-pw@127.0.0.1:1/shim", SHA256: strings.Repeat("0", 64), Path: "/opt/shim"}}))
	task := waitTask(t, "secrets-2", phaseIs(v1alpha1.TaskFailed))
	c := task.Status.Commands[0]
	for what, s := range map[string]string{"command message": c.Message, "task message": task.Status.Message, "output tail": c.OutputTail} {
		if strings.Contains(s, "s3cr3t-pw") || !strings.Contains(s, "https://[redacted]@127.0.0.1:1/shim") {
			t.Errorf("%s %q: want the URL's credentials redacted", what, s)
		}
	}
}

// Until the kubelet has mounted its Secrets the script waits, saying so in the task's status, and
// then runs with them.
func TestScriptWaitsForItsSecretsToBeMounted(t *testing.T) {
	createSecret(t, "nodeops-script-later", map[string]string{"GREETING": "hello-4c1d"})
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "secrets-4", HostRoot: root})
	create(t, newTask("secrets-4", "secrets-4", v1alpha1.ExecutionAuto, v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline:  `[ "$GREETING" = hello-4c1d ] && echo greeted > /greeted`,
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-later"}}},
	}}))
	waitTask(t, "secrets-4", func(tk *v1alpha1.NodeTask) bool {
		return strings.Contains(tk.Status.Message, "waiting for Secret nodeops-system/nodeops-script-later: the kubelet has not mounted it in pod nodeops-system/"+secretholder.PodName("secrets-4"))
	})
	secretVolumes(t, map[string]string{"secrets-4": root})
	waitTask(t, "secrets-4", phaseIs(v1alpha1.TaskSucceeded))
	if got := hosttest.ReadFile(t, root, "/greeted"); got != "greeted\n" {
		t.Errorf("the script wrote %q", got)
	}
	holderGone(t, "secrets-4")
}

// The agent reads a Secret only from its own task's holder pod on its own node: a pod under the
// task's holder name bound to another node, or controlled by another task (another UID), is refused
// and its volume never read, though its files are right there in the root; a Secret not named for
// scripts (a task from before the rule, which admission refuses now) is refused before anything is looked up.
func TestScriptSecretOfAPodNotItsTasksIsRefused(t *testing.T) {
	ctx := context.Background()
	createSecret(t, "nodeops-script-refused", map[string]string{"k": "v-9e8d"})
	root := hosttest.NewRoot(t, nil)
	// One root for both nodes: whatever the stand-in writes for either is where this agent looks.
	secretVolumes(t, map[string]string{"secrets-5": root, "secrets-5-other": root})
	cmd := &v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline: "echo ran > /ran",
		Env:    []v1alpha1.EnvVar{{Name: "K", ValueFrom: &v1alpha1.EnvVarSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "nodeops-script-refused", Key: "k"}}}},
	}}
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "secrets-5", UID: "uid-secrets-5"},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "secrets-5", Commands: []v1alpha1.Command{*cmd}},
	}
	run := func(node string, uid types.UID) error {
		env := &commands.Env{NodeName: node, Task: task.Name, TaskUID: uid, Client: cl, Host: host.NewLocal(root),
			Poll: 100 * time.Millisecond, SecretMountWait: 3 * time.Second, Secrets: &redact.Secrets{}}
		_, err := commands.Run(ctx, env, cmd)
		return err
	}
	for _, tc := range []struct {
		name     string
		node     string
		ownerUID types.UID
		want     string
	}{
		{"bound to another node", "secrets-5-other", task.UID, `it is bound to node "secrets-5-other", not this node secrets-5`},
		{"controlled by another task", "secrets-5", "uid-another-task", "is controlled by NodeTask secrets-5 (uid uid-another-task), not by this task (uid uid-secrets-5): its volumes are not read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := secretholder.Build(task, secretholder.Options{Image: "agent"})
			pod.Spec.NodeName, pod.OwnerReferences[0].UID = tc.node, tc.ownerUID
			create(t, pod)
			t.Cleanup(func() {
				_ = cl.Delete(ctx, pod, client.GracePeriodSeconds(0))
				testutil.Eventually(t, 10*time.Second, "pod deleted", func() error {
					if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
						return fmt.Errorf("still there: %w", err)
					}
					return nil
				})
			})
			// The files are there to be read: refusing them is the agent's doing.
			dir := filepath.Join(root, secretholder.VolumeDir(secretholder.DefaultKubeletRootDir, pod.UID, secretholder.VolumeName("nodeops-script-refused")), "k")
			testutil.Eventually(t, 10*time.Second, "the stand-in kubelet's volume of "+pod.Name, func() error {
				_, err := os.Stat(dir)
				return err
			})
			err := run("secrets-5", task.UID)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "v-9e8d") {
				t.Errorf("the script's Secret from a pod %s: %v, want refused saying %q", tc.name, err, tc.want)
			}
			if fileExists(root, "/ran") {
				t.Error("the script ran")
			}
		})
	}

	old := &v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "echo ran > /ran",
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "sh.helm.release.v1.nodeops.v1"}}}}}
	env := &commands.Env{NodeName: "secrets-5", Task: task.Name, TaskUID: task.UID, Client: cl, Host: host.NewLocal(root), Secrets: &redact.Secrets{}}
	if _, err := commands.Run(ctx, env, old); err == nil || !strings.Contains(err.Error(), "scripts take env only from Secrets named nodeops-script-*") {
		t.Errorf("a script naming Helm's release Secret: %v, want refused naming the prefix", err)
	}
	if fileExists(root, "/ran") {
		t.Error("the script ran")
	}
}
