#!/usr/bin/env bash
# The load check (make test-load): the unit and envtest packages, run while a CPU hog holds one core,
# several rounds in a row; prints a table of failures per test and writes it to a file.
#   hack/test-load.sh                       three rounds over every package but test/e2e
#   LOAD_ROUNDS=1 LOAD_PKGS="./internal/cli ./internal/agent" hack/test-load.sh
#   LOAD_RUN='TestWriteBudget' ...          only the tests -run selects
#   LOAD_HOG=none ...                       the same rounds without the hog, to compare
# The hog is one `stress-ng --cpu 1` when installed (Debian's stress-ng), else a busy loop in bash.
# A test that fails here on a busy machine asserts a timing, not a behaviour: see
# docs/development/testing.md.
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=${LOAD_ROUNDS:-3}
out=${LOAD_OUT:-bin/test-load.md}
logs=${LOAD_LOGS:-bin/test-load}
hog=${LOAD_HOG:-auto}
# shellcheck disable=SC2207
pkgs=(${LOAD_PKGS:-$(go list ./... | grep -v /test/e2e)})
run=()
[ -n "${LOAD_RUN:-}" ] && run=(-run "$LOAD_RUN")
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$PWD/bin} NODEOPS_BIN=${NODEOPS_BIN:-$PWD/bin}
mkdir -p "$logs" "$(dirname "$out")"

hog_pid=""
stop_hog() {
	if [ -n "$hog_pid" ]; then
		kill "$hog_pid" 2>/dev/null
		wait "$hog_pid" 2>/dev/null
		hog_pid=""
	fi
}
trap stop_hog EXIT
trap 'stop_hog; exit 130' INT TERM

load="none"
case "$hog" in
none) ;;
auto | stress-ng | bash)
	if [ "$hog" != bash ] && command -v stress-ng >/dev/null; then
		stress-ng --cpu 1 --timeout 0 --quiet &
		load="one core held by stress-ng --cpu 1"
	else
		# One busy loop: a process that never sleeps holds one core as far as the scheduler allows.
		bash -c 'while :; do :; done' &
		load="one core held by a busy loop in bash"
	fi
	hog_pid=$!
	;;
*)
	echo "test-load: LOAD_HOG must be auto, stress-ng, bash or none" >&2
	exit 2
	;;
esac

echo "test-load: $rounds round(s) over ${#pkgs[@]} package(s), load: $load; logs in $logs/"
declare -A fails=()
total_start=$SECONDS
durations=()
for r in $(seq 1 "$rounds"); do
	start=$SECONDS
	log="$logs/round-$r.json"
	go test -json -count=1 -timeout 30m "${run[@]}" "${pkgs[@]}" >"$log" 2>"$logs/round-$r.stderr"
	rc=$?
	durations+=("$((SECONDS - start))s")
	# A failed test is a line {"Time":..,"Action":"fail","Package":"P","Test":"T",..}; a failed package
	# without a failed test (a panic, a timeout, TestMain) is one without "Test".
	n=0
	while IFS=$'\t' read -r pkg test; do
		key="${pkg#github.com/nodeops/nodeops/}	${test:-(package)}"
		fails[$key]=$((${fails[$key]:-0} + 1))
		n=$((n + 1))
	done < <(grep '"Action":"fail"' "$log" | sed -E 's/.*"Package":"([^"]*)"(,"Test":"([^"]*)")?.*/\1\t\3/' |
		awk -F'\t' '$2 != "" { print; tested[$1] = 1; next } { pkg[$1] = 1 } END { for (p in pkg) if (!tested[p]) print p "\t" }')
	# A build failure makes no test line: it is counted as go test's own.
	if [ "$rc" != 0 ] && [ "$n" = 0 ]; then
		key="(go test exit $rc, see $logs/round-$r.stderr)	(build)"
		fails[$key]=$((${fails[$key]:-0} + 1))
		n=1
	fi
	echo "test-load: round $r: $n failure(s) in $((SECONDS - start))s"
done
stop_hog

machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
{
	echo "Load check of $(date -u '+%Y-%m-%d %H:%M UTC') at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
	echo
	echo "- machine: $machine; $(go version | cut -d' ' -f3)"
	echo "- load: $load, besides whatever else ran (load average before the last round's end: $(cut -d' ' -f1-3 /proc/loadavg))"
	echo "- $rounds round(s) of \`go test -count=1\` over ${#pkgs[@]} package(s)${LOAD_RUN:+, -run '$LOAD_RUN'}; rounds took ${durations[*]}"
	echo
	echo "| package | test | failed rounds (of $rounds) |"
	echo "|---|---|---|"
	if [ ${#fails[@]} -eq 0 ]; then
		echo "| (none) | (none) | 0 |"
	else
		for key in "${!fails[@]}"; do
			printf '| %s | %s | %s |\n' "${key%%	*}" "${key#*	}" "${fails[$key]}"
		done | sort
	fi
} >"$out"
cat "$out"
echo "test-load: table written to $out after $((SECONDS - total_start))s"
[ ${#fails[@]} -eq 0 ]
