#!/usr/bin/env bash
# hack/progress.sh LABEL COMMAND...: runs a `go build -v ...` COMMAND with its output in a temporary
# log, prints "LABEL: N packages compiled, Ts" every 30 s while it runs (on an empty Go cache a build
# is minutes with no output of its own), and on failure the errors. Used by `make build`; hack/tools.sh
# keeps the same loop inside its build function, whose text is part of every tool set's stamp, so
# moving it here would rebuild Kubernetes once on every machine.
set -euo pipefail
label=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
"$@" >"$log" 2>&1 &
pid=$!
last=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
	sleep 1
	if [ $((SECONDS - last)) -ge 30 ]; then
		# go build -v prints each package's import path as it compiles, `go: downloading M V` per module.
		echo "$label: $(grep -c '^[a-zA-Z0-9_./-]*$' "$log" || true) packages compiled, $(grep -c '^go: downloading' "$log" || true) modules downloaded, $((SECONDS - start))s"
		last=$SECONDS
	fi
done
if ! wait "$pid"; then
	grep -v '^[a-zA-Z0-9_./-]*$' "$log" | tail -40 >&2 || tail -40 "$log" >&2
	echo "$label: failed after $((SECONDS - start))s" >&2
	exit 1
fi
echo "$label: done in $((SECONDS - start))s"
