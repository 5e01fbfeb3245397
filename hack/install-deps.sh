#!/usr/bin/env bash
# Installs the Debian packages nodeops' set-up needs when they are missing. Go modules come
# from the Go module proxy through the go command itself (hack/tools.sh).
#   hack/install-deps.sh            what make test and make test-race need, and the .debs of Debian's
#                                   Prometheus and Alertmanager the alerting tests unpack (never installed)
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
# installPackages' tests (internal/agent/commands): a real Debian root made by mmdebstrap, .debs made with
# dpkg-deb and indexed with apt-ftparchive, rpms made with rpmbuild and indexed with createrepo_c, installed
# by the real dnf and rpm, which the root gets from Debian too
if [ "${1:-}" != run ]; then
	command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
	command -v dpkg-deb >/dev/null || need+=(dpkg)
	command -v apt-ftparchive >/dev/null || need+=(apt-utils)
	command -v rpmbuild >/dev/null || need+=(rpm)
	command -v createrepo_c >/dev/null || need+=(createrepo-c)
	command -v dnf >/dev/null || need+=(dnf)
fi
# internal/host's tests: a real system bus for systemd's D-Bus interface, and the same Debian root with
# openrc (internal/testutil/debroot)
[ "${1:-}" = run ] || command -v dbus-daemon >/dev/null || need+=(dbus-daemon)
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
if [ "${1:-}" != run ]; then
	# internal/testutil/monitoring unpacks the .debs (dpkg-deb) and runs Alertmanager in its own mount
	# namespace (unshare, mount): all in Debian's base system, checked for a slimmed-down image.
	command -v dpkg-deb >/dev/null || need+=(dpkg)
	command -v unshare >/dev/null || need+=(util-linux)
	command -v mount >/dev/null || need+=(mount)
fi
if [ ${#need[@]} -gt 0 ]; then
	echo "install-deps: installing Debian packages: ${need[*]}"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y -q "${need[@]}" || { $sudo apt-get update -q && $sudo apt-get install -y -q "${need[@]}"; }
fi

if [ "${1:-}" != run ]; then
	# The alerting tests' Prometheus and Alertmanager: Debian's packages downloaded, never installed
	# (their maintainer scripts start services), into the cache internal/testutil/monitoring reads.
	debs="${XDG_CACHE_HOME:-$HOME/.cache}/nodeops/debs"
	fetch=()
	for p in prometheus prometheus-alertmanager; do
		compgen -G "$debs/${p}_*.deb" >/dev/null || fetch+=("$p")
	done
	if [ ${#fetch[@]} -gt 0 ]; then
		echo "install-deps: downloading Debian packages (not installing them) into $debs: ${fetch[*]}"
		mkdir -p "$debs"
		tmp=$(mktemp -d "$debs/.download-XXXXXX")
		trap 'rm -rf "$tmp"' EXIT
		sudo=""
		[ "$(id -u)" = 0 ] || sudo=sudo
		(cd "$tmp" && apt-get download -q "${fetch[@]}") || { $sudo apt-get update -q && (cd "$tmp" && apt-get download -q "${fetch[@]}"); }
		mv "$tmp"/*.deb "$debs"/
	fi
fi
