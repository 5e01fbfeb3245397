#!/usr/bin/env bash
# Shows why .ci/run gives its background build's session nice 19 through /proc/self/autogroup.
# Usage: hack/autogroup-check.sh old|new
# Two busy loops in this session stand for the tests; a third, started in a session of its own the old way
# (setsid nice -n 19) or the way .ci/run starts its build (setsid, the session's autogroup set to nice 19, then
# nice -n 19), stands for the background build. Prints the CPU seconds each got in 20 s on the machine's cores.
set -euo pipefail
mode=${1:?usage: $0 old|new}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
busy() { local end=$((SECONDS + 20)); while [ $SECONDS -lt $end ]; do :; done; }
export -f busy
timed='TIMEFORMAT=%U; time busy'
case $mode in
old) setsid nice -n 19 bash -c "$timed" 2>"$out/bg" & ;;
new) setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' check \
	bash -c "$timed" 2>"$out/bg" & ;;
*) echo "usage: $0 old|new" >&2; exit 2 ;;
esac
bash -c "$timed" 2>"$out/fg1" &
bash -c "$timed" 2>"$out/fg2" &
wait
echo "$mode (sched_autogroup_enabled $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo n/a)):" \
	"tests $(cat "$out/fg1") + $(cat "$out/fg2"), background build $(cat "$out/bg") CPU seconds in 20 s"
