#!/usr/bin/env bash
# Builds the pinned binaries into bin/: the Kubernetes v1.37.2 components and etcd (hack/tools),
# kwok (hack/tools/kwok), controller-gen and golangci-lint (hack/tools/lint), helm (hack/tools/helm).
# A set is rebuilt only when a binary is missing or its module's go.mod/go.sum or its build line
# changed, so a second run takes seconds. Progress is printed while the (slow, first-time) builds run.
# `hack/tools.sh SET...` builds only those sets (for example `hack/tools.sh helm`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/bin
mkdir -p "$bin"
# One build at a time: parallel make targets and test runs wait for each other here.
exec 9>"$bin/.tools.lock"
flock 9

kver=v1.37.2
vpkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $vpkg.gitVersion=$kver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=37 -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=2026-01-01T00:00:00Z"

only=" $* "

# stamp_of MODULE_DIR BUILD_ARGS...: a set's own inputs (module, build line, build function), not
# the whole script, so that adding a set does not rebuild the others (Kubernetes takes minutes).
stamp_of() {
	{ cat "$1/go.mod" "$1/go.sum"; declare -f build; echo "$*"; } | sha256sum | cut -c1-16
}

# expectation SET: how long a set takes to build from an empty Go cache. Outside build, so that
# rewording it does not change build's stamp and rebuild every set.
expectation() {
	case $1 in
	# Measured on a fresh 2-core machine: 15.6 minutes.
	kubernetes) echo "tools: on an empty Go cache this takes about 15 minutes on 2 cores; progress and elapsed time follow" ;;
	*) echo "tools: on an empty Go cache this takes minutes; progress and elapsed time follow" ;;
	esac
}

# build SET MODULE_DIR "BINARIES" LDFLAGS PACKAGES...
build() {
	local set=$1 dir=$2 names=$3 ldflags=$4
	[ "$only" = "  " ] || [[ $only == *" $set "* ]] || return 0
	local want reason="" have
	want=$(stamp_of "$dir" "$@")
	shift 4
	for n in $names; do
		[ -x "$bin/$n" ] || { reason="$n is missing"; break; }
	done
	if [ -z "$reason" ]; then
		have=$(cat "$bin/.stamp-$set" 2>/dev/null || true)
		[ "$have" = "$want" ] || reason="$dir/go.mod or go.sum changed"
	fi
	if [ -z "$reason" ]; then
		echo "tools: $set up to date ($names)"
		return
	fi
	echo "tools: building $set ($names) because $reason"
	expectation "$set"
	local start=$SECONDS log
	log=$(mktemp)
	(cd "$dir" && CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "$bin/" "$@") >"$log" 2>&1 &
	local pid=$! last=0
	while kill -0 "$pid" 2>/dev/null; do
		sleep 5
		local n
		n=$(wc -l <"$log")
		if [ $((SECONDS - last)) -ge 30 ]; then
			echo "tools: $set: ${n} packages compiled, $((SECONDS - start))s"
			last=$SECONDS
		fi
	done
	if ! wait "$pid"; then
		grep -v '^[a-zA-Z0-9_./-]*$' "$log" | tail -40 >&2 || tail -40 "$log" >&2
		rm -f "$log"
		echo "tools: building $set failed" >&2
		return 1
	fi
	rm -f "$log"
	echo "$want" >"$bin/.stamp-$set"
	echo "tools: built $set in $((SECONDS - start))s"
}

build kubernetes hack/tools "etcd kube-apiserver kube-controller-manager kube-scheduler kubeadm kubelet kubectl" "$k8s_ldflags" \
	./cmd/etcd k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
build kwok hack/tools/kwok "kwok" "-s -w" sigs.k8s.io/kwok/cmd/kwok
build lint hack/tools/lint "controller-gen golangci-lint" "-s -w" \
	sigs.k8s.io/controller-tools/cmd/controller-gen github.com/golangci/golangci-lint/v2/cmd/golangci-lint
# As helm's own Makefile stamps it: its version, and the Kubernetes version of its client-go (v0.37 ->
# 1.37) that helm template and helm lint assume; without them they assume Kubernetes v1.20.
hpkg=helm.sh/helm/v3
helm_ldflags="-s -w -X $hpkg/internal/version.version=v3.22.0 -X $hpkg/internal/version.gitTreeState=clean \
-X $hpkg/pkg/chartutil.k8sVersionMajor=1 -X $hpkg/pkg/chartutil.k8sVersionMinor=37 \
-X $hpkg/pkg/lint/rules.k8sVersionMajor=1 -X $hpkg/pkg/lint/rules.k8sVersionMinor=37"
build helm hack/tools/helm "helm" "$helm_ldflags" helm.sh/helm/v3/cmd/helm

# kwok's stage configs ship in its module; copy the ones nodeops-local needs beside the binary.
stages=$(cd hack/tools/kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
mkdir -p "$bin/kwok-stages"
for s in node/fast node/heartbeat-with-lease pod/fast; do
	for f in "$stages/$s"/*.yaml; do
		case "$f" in *kustomization.yaml) continue ;; esac
		install -m 0644 "$f" "$bin/kwok-stages/$(echo "$s" | tr / -)-$(basename "$f")"
	done
done
