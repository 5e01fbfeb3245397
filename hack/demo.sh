#!/usr/bin/env bash
# make demo: bring up nodeops-local with 3 control planes, 3 workers and 50 simulated nodes, show
# the nodes, and stop. Runs unattended and exits. The cluster's directory (logs, node roots) is
# removed at the end unless NODEOPS_DEMO_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/nodeops-demo.XXXXXX")
dir=$work/cluster
kubectl() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

flags=(--control-planes 3 --workers 3 --sim-nodes 50)
# The manager and agents are started when they are built.
[ -x "$bin/manager" ] || { echo "demo: bin/manager is not built; starting without it"; flags+=(--no-manager); }
[ -x "$bin/agent" ] || { echo "demo: bin/agent is not built; starting without agents"; flags+=(--no-agents); }

echo "demo: nodeops-local up --dir $dir ${flags[*]}"
"$bin/nodeops-local" up --dir "$dir" "${flags[@]}" > >(tee "$work/nodeops-local.log") 2>&1 &
pid=$!
stop() {
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		wait "$pid" || true
	fi
}
trap stop EXIT

deadline=$((SECONDS + 900))
until grep -q '^ready: kubeconfig=' "$work/nodeops-local.log" 2>/dev/null; do
	kill -0 "$pid" 2>/dev/null || { echo "demo: nodeops-local exited before it was ready" >&2; exit 1; }
	[ $SECONDS -lt $deadline ] || { echo "demo: nodeops-local was not ready within 15 minutes" >&2; exit 1; }
	sleep 1
done

echo
echo "demo: kubectl get nodes"
nodes=$(kubectl get nodes -o wide)
echo "$nodes" | grep -v '^sim-'
echo "$nodes" | grep '^sim-' | sort -V | sed -n 1,3p
echo "... $(echo "$nodes" | grep -c '^sim-') sim nodes; $(echo "$nodes" | grep -c ' Ready ') of $(($(echo "$nodes" | wc -l) - 1)) nodes Ready"
echo
echo "demo: the host root of cp-1 ($dir/nodes/cp-1):"
if certs=$(chroot "$dir/nodes/cp-1" /usr/bin/kubeadm certs check-expiration 2>/dev/null); then
	echo "\$ chroot $dir/nodes/cp-1 /usr/bin/kubeadm certs check-expiration"
	echo "$certs" | awk '/^CERTIFICATE /{n++} n==1 && c<7 {print; c++}'
else
	ls "$dir/nodes/cp-1/etc/kubernetes" # chroot needs root
fi
echo
echo "demo: nodeops-local down --dir $dir"
"$bin/nodeops-local" down --dir "$dir"
wait "$pid" || true
trap - EXIT
if [ "${NODEOPS_DEMO_KEEP:-}" = 1 ]; then
	echo "demo: done; logs and node roots are in $dir"
else
	rm -rf "$work"
	echo "demo: done (NODEOPS_DEMO_KEEP=1 keeps the cluster's directory)"
fi
