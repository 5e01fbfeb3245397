// Package monitoring starts Debian's real Prometheus and Alertmanager for tests, each on a free
// loopback port with its own temporary configuration and storage, ready before the test goes on
// and killed when it ends.
//
// The binaries come from Debian's packages `prometheus` and `prometheus-alertmanager`, fetched with
// `apt-get download` into ~/.cache/nodeops/debs and unpacked with `dpkg-deb -x` into
// ~/.cache/nodeops/monitoring, both reused between runs: the packages are never installed, as their
// maintainer scripts would start system services. When apt cannot fetch them the test fails and
// names hack/install-deps.sh, which pre-fetches them (make tools and CI run it); it never skips.
//
// Debian's Alertmanager reads its default notification template from
// /usr/share/prometheus/alertmanager, a path built into the binary, so it runs in a private mount
// namespace (util-linux's unshare, unprivileged through a user namespace) where the unpacked
// package's usr/share is mounted over /usr/share; the host's /usr/share is untouched.
//
// It is for tests only: no nodeops binary links it.
package monitoring
