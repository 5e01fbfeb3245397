package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

func createSecret(t *testing.T, name string, labelled bool, data map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: commands.SecretNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: commands.SecretNamespace}, StringData: data}
	if labelled {
		sec.Labels = map[string]string{commands.LabelAgentReadable: "true"}
	}
	create(t, sec)
}

// A script's environment comes from Secrets read when it runs: the script gets the values, and
// neither the task nor anything the agent records of it holds one; URL credentials are redacted too.
func TestScriptSecretsAreUsedAndRedacted(t *testing.T) {
	const token, password = "tok-5f3a9c1e77", "pw-b7d2e0c4aa"
	createSecret(t, "script-creds", true, map[string]string{"token": token})
	createSecret(t, "db-creds", true, map[string]string{"DB_PASSWORD": password, "not-a-name": "x"})
	root := hosttest.NewRoot(t, map[string]string{"/var/tmp/.keep": ""})
	startAgent(t, agent.Options{NodeName: "secrets-1", HostRoot: root})

	create(t, newTask("secrets-1", "secrets-1", v1alpha1.ExecutionAuto, v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline: `echo "token=$TOKEN password=$DB_PASSWORD plain=$PLAIN"
echo "$TOKEN $DB_PASSWORD" > /var/tmp/got
echo "cloning https://bob:$DB_PASSWORD@git.example/repo.git and https://deploy:hunter2@mirror.example/x" >&2
exit 3`,
		Env: []v1alpha1.EnvVar{{Name: "PLAIN", Value: "visible"},
			{Name: "TOKEN", ValueFrom: &v1alpha1.EnvVarSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "script-creds", Key: "token"}}}},
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "db-creds"}}},
	}}))
	task := waitTask(t, "secrets-1", phaseIs(v1alpha1.TaskFailed))
	if got := hosttest.ReadFile(t, root, "/var/tmp/got"); got != token+" "+password+"\n" {
		t.Errorf("the script got %q, want the Secrets' values", got)
	}
	tail := task.Status.Commands[0].OutputTail
	for _, want := range []string{"token=[redacted] password=[redacted] plain=visible", "https://[redacted]@git.example/repo.git", "https://[redacted]@mirror.example/x"} {
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

// Only Secrets labelled nodeops.io/agent-readable=true are read; the refusal names the label.
func TestUnlabelledSecretIsRefused(t *testing.T) {
	createSecret(t, "not-for-scripts", false, map[string]string{"k": "v"})
	root := hosttest.NewRoot(t, nil)
	startAgent(t, agent.Options{NodeName: "secrets-3", HostRoot: root})
	create(t, newTask("secrets-3", "secrets-3", v1alpha1.ExecutionAuto, v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline:  "echo ran > /ran",
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "not-for-scripts"}}},
	}}))
	task := waitTask(t, "secrets-3", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "not labelled nodeops.io/agent-readable=true") {
		t.Errorf("message %q does not name the label", msg)
	}
	if fileExists(root, "/ran") {
		t.Error("the script ran without its Secret")
	}
}
