// Package framework runs end-to-end tests against nodeops-local: a real control plane, kwok nodes,
// local nodes with host roots, and (unless told not to) the nodeops manager and agents as processes.
//
// Binaries come from $NODEOPS_BIN, or else bin/ of the repository; `make build` (and `make tools`)
// must have run first (`make test-e2e` after `make build`, or `make test`, does both).
//
// Start a cluster, one per test or shared by subtests:
//
//	l := framework.StartLocal(t, "--control-planes=3", "--workers=3", "--no-manager")
//
// StartLocal runs `bin/nodeops-local up --dir DIR ARGS...` (DIR is a new t.TempDir() unless ARGS
// hold --dir), waits for its "ready:" line (deadline StartTimeout), and registers a t.Cleanup that
// stops it with SIGTERM and waits; when the test failed, the cleanup logs nodeops-local's output and
// the last lines of every log in DIR/logs. The returned *Local has:
//
//	l.Dir, l.Kubeconfig, l.BinDir      paths; node roots are l.NodeRoot("cp-1") = DIR/nodes/cp-1
//	l.Client                           controller-runtime client with Kubernetes, apiextensions and nodeops kinds
//	l.RESTConfig                       for other clients
//	l.Kubectl(args...) (string, error) bin/kubectl --kubeconfig DIR/kubeconfig ARGS; stdout, stderr in the error
//	l.MustKubectl(t, args...) string   the same, failing the test on error
//	l.Processes() (map[string]int, error)  name -> PID of the children: etcd, kube-apiserver,
//	                                   kube-controller-manager, kube-scheduler, kwok, manager (manager-1..manager-N
//	                                   with --managers=N), agent-<node>, agent-sim; with --agent-mode=Job,
//	                                   agent-<pod> while an agent Job's pod runs (log DIR/logs/agent-<pod>.log)
//	l.Stop() error                     SIGTERM, wait (idempotent; the cleanup calls it)
//	l.Exited() <-chan struct{}         closed once nodeops-local exited (after `nodeops-local down`, say)
//	l.PID()                            nodeops-local's own PID
//	l.Output() string                  what nodeops-local printed so far
//	l.WaitNodesReady(t, n, timeout)    until at least n nodes are Ready without the not-ready taint
//	localcluster.NodeReady(node) bool  plan.NodeReady and free of the not-ready/unreachable taints
//
// A child killed after start-up (a fault test's SIGKILL to the manager or an agent) is started
// again by nodeops-local after a few seconds, with a new PID in l.Processes().
//
// Scenario functions, each once here, not per test file (as cluster-api's test/e2e/framework):
//
//	Create(t, l, obj)                         a NodeOperation a failed test leaves is aborted by its cleanup
//	RunOperation(t, l, op, phase)             Create, then WaitForOperation
//	RunOperationWatched(t, l, op, input)      the same, returning every event of its tasks (WatchTasks)
//	WaitForOperation(t, l, WaitForOperationInput{Name, Phase, Timeout, FailIfBlocked}) *NodeOperation
//	                                          fails at once on another final phase, naming failed commands
//	AbortOperation(t, l, name)                spec.abort, then wait for Aborted
//	OperationTasks(t, l, op), GetTask(t, l, name), WaitForTask(t, l, op, cond)
//	KillAgent(t, l, node), KillProcess(t, l, name) pid, WaitForFile(t, path, content)
//	ManagerLeader(ctx, l) (identity, process, err)  the holder of the managers' Lease (--managers=N)
//	WaitForClusterTarget(t, l, what, cond), EditClusterTarget(t, l, mutate), GeneratedOperations(t, l),
//	WaitForKubeadmOperation(phase)            the ClusterTarget and its kubeadm operations
//	GetNode, ProfileLabelled, WaitForProfileLabel, WaitForProfileCondition, WaitForProfileGone,
//	ProfileSummary, CountProfileLabelled, LabelNodes   NodeProfiles and their nodes' labels
//	WatchTasks(t, l, selector) *TaskWatch     every task event from now on; .Events(t), .Stop(t)
//	MaxHeld(events, among), NodesOf(events)   nodes holding unfinished tasks at once; nodes seen
//	ReadFile, FileSHA256, SHA256, ServiceLog, Restarts, HTTPGet, HTTPGetText,
//	ParseCertificate, KubeconfigClientCertificate
//	BinDir(t, names...), LocalPreflightIgnores, l.BinarySourceURL(t)
//	AsAgent(t, l, node) (client, clientset)   node's agent's pod-bound token (--agent-credentials=pod-bound)
//	AsAgentPod(t, l, pod) (client, clientset) an agent Job pod's agent's token (--agent-mode=Job)
//	WatchAgentPods(t, l) *PodWatch            every event of the agents' pods from now on; .Stop(t)
//	Disruptions(events, node)                 each eviction or deletion of an unfinished agent pod on node
//	WhoAmI(t, clientset), ProcessArgs(t, l, name)
//
// Waiting: never sleep for a fixed time; wait on a condition with a deadline, with the one polling
// helper of the repository, at this package's PollInterval:
//
//	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "job pi completes", func(ctx context.Context) error {...})
//
// It polls until the condition returns nil, handing it a context that ends at the deadline, and on
// the deadline fails the test naming what it waited for and the last error seen; so conditions
// explain themselves by returning fmt.Errorf("3 of 5 ready").
//
// It drives nodeops from outside, through the CLI, kubectl and the API, as a user would; of the
// controllers' packages it uses only names and waits.
package framework
