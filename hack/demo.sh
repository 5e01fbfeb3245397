#!/usr/bin/env bash
# make demo: start nodeops-local (3 control planes, 3 workers, 50 simulated nodes) and walk through
# nodeops with kubectl nodeops, each step narrated and followed live, then print a summary table and stop
# everything. Unattended; exits non-zero when a step fails. The walk-through is a Go program
# (hack/demo/*.go) built here; the binaries it drives must be built (make demo builds them first).
#
#   hack/demo.sh [--keep] [--dir DIR]     (make demo DEMO_ARGS=--keep)
#
# --keep leaves the cluster running and prints its export KUBECONFIG=... line.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NODEOPS_BIN:-$PWD/bin}
echo "demo: building the walk-through (hack/demo) into $bin/nodeops-demo"
hack/progress.sh demo go build -v -o "$bin/nodeops-demo" ./hack/demo
exec "$bin/nodeops-demo" --bin "$bin" "$@"
