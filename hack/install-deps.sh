#!/usr/bin/env bash
# Installs the Debian packages nodeops' set-up needs when they are missing. Go modules come
# from the Go module proxy through the go command itself (hack/tools.sh).
#   hack/install-deps.sh            what make test and make test-race need
#   hack/install-deps.sh run        what a local cluster needs (make demo)
#   hack/install-deps.sh realnode   make test's and the real node's
#   hack/install-deps.sh docs       make test's, and the docs site's (make docs)
#   hack/install-deps.sh docs-check make test's, the docs site's and headless chromium (hack/docs-check.sh)
set -euo pipefail
need=()
[ -x /bin/busybox ] || need+=(busybox-static)   # /bin/sh and applets inside local node roots
# the CLI's live display is checked in a real terminal (tests); `make demo` (install-deps.sh run) needs none
[ "${1:-}" = run ] || command -v tmux >/dev/null || need+=(tmux)
command -v git >/dev/null || need+=(git)
# `make test-race` (in CI): the race detector needs cgo, so a C compiler
[ "${1:-}" = run ] || command -v gcc >/dev/null || need+=(gcc libc6-dev)
# internal/host's tests: a real system bus for systemd's D-Bus interface, and a Debian root with
# openrc (internal/testutil/debroot builds it with mmdebstrap, cached under ~/.cache/nodeops/debroot)
[ "${1:-}" = run ] || command -v dbus-daemon >/dev/null || need+=(dbus-daemon)
[ "${1:-}" = run ] || command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ "${1:-}" = realnode ]; then
	# `make realnode` builds runc with seccomp (cgo) and runs the node's network with iproute2.
	[ -e /usr/include/seccomp.h ] || need+=(libseccomp-dev)
	command -v pkg-config >/dev/null || need+=(pkg-config)
	command -v ip >/dev/null || need+=(iproute2)
fi
if [ "${1:-}" = docs ] || [ "${1:-}" = docs-check ]; then
	# `make docs` builds the site with Debian's mkdocs (1.4) and its Material theme; the Makefile runs
	# /usr/bin/mkdocs, whatever python3 comes first on the PATH.
	[ -x /usr/bin/mkdocs ] || need+=(mkdocs)
	[ -d /usr/share/mkdocs/themes/material ] || need+=(mkdocs-material)
fi
if [ "${1:-}" = docs-check ]; then
	# hack/docs-check.sh opens every page in Debian's headless chromium.
	command -v chromium >/dev/null || need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
	echo "install-deps: installing Debian packages: ${need[*]}"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y -q "${need[@]}" || { $sudo apt-get update -q && $sudo apt-get install -y -q "${need[@]}"; }
fi
