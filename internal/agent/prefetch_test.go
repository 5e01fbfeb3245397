package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestDownloadAheadEndsWithItsTask: what the agent downloaded for a task's next command while a
// kubeadm upgrade ran is stopped and removed from /usr/bin when the task finishes without running
// that command (its upgrade failed, or it was aborted) or is deleted, and when another task of the
// same name, or another command, comes to take it; so no download of an ended task is left on the
// node, nor can it remove the temporary file of the task that follows.
func TestDownloadAheadEndsWithItsTask(t *testing.T) {
	kubelet := "kubelet v1.37.2"
	h := sha256.Sum256([]byte(kubelet))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1.37.2/bin/linux/amd64/kubelet":
			_, _ = io.WriteString(w, kubelet)
		case "/v1.37.2/bin/linux/amd64/kubelet.sha256":
			_, _ = io.WriteString(w, hex.EncodeToString(h[:]))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	b := &v1alpha1.InstallBinariesCommand{Components: []string{"kubelet"}, Version: "v1.37.2",
		Source: v1alpha1.BinarySource{BaseURL: srv.URL, InsecureHTTP: true}}
	root := hosttest.NewRoot(t, map[string]string{"/usr/bin/kubelet": "kubelet v1.36.0"})
	env := &commands.Env{Host: host.NewLocal(root), Arch: "amd64", Out: io.Discard}
	ctx := context.Background()
	r := &Reconciler{}
	onlyKubelet := func(when string) {
		t.Helper()
		entries, err := os.ReadDir(filepath.Join(root, "usr/bin"))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "kubelet" {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("%s: /usr/bin holds %v, want only kubelet", when, names)
		}
	}
	task := func(name, uid string, phase v1alpha1.TaskPhase) *v1alpha1.NodeTask {
		return &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)},
			Spec: v1alpha1.NodeTaskSpec{NodeName: "node-a"}, Status: v1alpha1.NodeTaskStatus{Phase: phase}}
	}
	// ahead starts a download for the named task and waits until its file is in /usr/bin.
	ahead := func(name, uid string) {
		t.Helper()
		r.keepPrefetch(task(name, uid, v1alpha1.TaskRunning), commands.StartPrefetch(ctx, env, 4, b))
		testutil.Eventually(t, time.Minute, "the download ahead in /usr/bin", func() error {
			entries, err := os.ReadDir(filepath.Join(root, "usr/bin"))
			if err != nil || len(entries) != 2 {
				return fmt.Errorf("/usr/bin holds %d files (%w)", len(entries), err)
			}
			return nil
		})
	}

	for _, phase := range []v1alpha1.TaskPhase{v1alpha1.TaskFailed, v1alpha1.TaskAborted} {
		ahead("upgrade-a", "uid-a")
		r.releaseIfFinished(task("upgrade-a", "uid-a", phase))
		onlyKubelet("after the task was " + string(phase))
	}

	ahead("upgrade-b", "uid-b")
	r.releaseGone("upgrade-b")
	onlyKubelet("after the task was deleted")

	ahead("upgrade-c", "uid-c")
	if p := r.takePrefetch(task("upgrade-c", "uid-c2", v1alpha1.TaskRunning), 4); p != nil {
		t.Error("a task of the same name, another UID, took the download of the one before")
	}
	onlyKubelet("after another task of the same name came")

	ahead("upgrade-d", "uid-d")
	if p := r.takePrefetch(task("upgrade-d", "uid-d", v1alpha1.TaskRunning), 3); p != nil {
		t.Error("command 3 took the download for command 4")
	}
	onlyKubelet("after another command came")

	ahead("upgrade-e", "uid-e")
	p := r.takePrefetch(task("upgrade-e", "uid-e", v1alpha1.TaskRunning), 4)
	if p == nil {
		t.Fatal("command 4 did not get the download made for it")
	}
	p.Discard()
	onlyKubelet("after the command it was for ended")
}
