package host

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// ErrNoHTTPProbe: the container has no startup or readiness probe that is an HTTP GET, the only
// kind ServingNow runs itself; the kubelet's own verdict (the pod's Ready) is then the answer.
var ErrNoHTTPProbe = errors.New("no HTTP startup or readiness probe to run")

// probeTimeout bounds one probe; kubeadm's say 15 s, but a component that takes seconds to answer
// on its own node is asked again rather than waited for.
const probeTimeout = 3 * time.Second

// Prober runs a running container's HTTP probes from inside the node, for a command that waits
// for a static pod: the kubelet runs a startup probe first after 10 s and then every 10 s
// (kubeadm's manifests), so its Ready comes up to 20 s after the component serves. Proc is the
// host's /proc (the agent runs in the host's PID namespace).
type Prober struct {
	Proc string
}

// ServingNow says whether the container of pod (as the kubelet runs it) passes its startup and
// readiness probes now, run as the kubelet runs them: an HTTP GET from the node's network
// namespace (the container's own: the namespace of its process), any status from 200 to 399 a
// pass, certificates not verified. So that no earlier run of the component can answer for it, the
// port each probe asks must be one the container's own process listens on. It fails with
// ErrNoHTTPProbe when there is no HTTP probe to run, else says which probe did not pass.
func (p *Prober) ServingNow(ctx context.Context, pod *corev1.Pod, container string) error {
	var spec *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			spec = &pod.Spec.Containers[i]
		}
	}
	var st *corev1.ContainerStatus
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == container {
			st = &pod.Status.ContainerStatuses[i]
		}
	}
	if spec == nil {
		return fmt.Errorf("pod %s/%s has no container %s", pod.Namespace, pod.Name, container)
	}
	var probes []*corev1.Probe
	for _, pr := range []*corev1.Probe{spec.StartupProbe, spec.ReadinessProbe} {
		if pr == nil {
			continue
		}
		if pr.HTTPGet == nil {
			return ErrNoHTTPProbe
		}
		probes = append(probes, pr)
	}
	if len(probes) == 0 {
		return ErrNoHTTPProbe
	}
	if st == nil || st.State.Running == nil || st.ContainerID == "" {
		return fmt.Errorf("container %s is not running", container)
	}
	_, id, _ := strings.Cut(st.ContainerID, "://")
	pids, err := p.containerPIDs(id)
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return fmt.Errorf("no process of container %s (%s) runs", container, shortID(id))
	}
	for _, pr := range probes {
		port, err := probePort(spec, pr.HTTPGet)
		if err != nil {
			return err
		}
		ip := probeIP(pod, pr.HTTPGet)
		if ip == nil {
			// A name would be resolved, and perhaps dialed, outside the locked thread and so
			// outside the container's network namespace.
			return ErrNoHTTPProbe
		}
		if err := p.listens(pids, ip, port); err != nil {
			return fmt.Errorf("container %s: %w", container, err)
		}
		if err := p.get(ctx, pids[0], ip, pr.HTTPGet, port); err != nil {
			return fmt.Errorf("container %s: %w", container, err)
		}
	}
	return nil
}

// probeIP is the address the probe asks, as the kubelet's prober chooses it: the probe's host,
// else the pod's IP; nil when that is not an IP address.
func probeIP(pod *corev1.Pod, g *corev1.HTTPGetAction) net.IP {
	host := g.Host
	if host == "" {
		host = pod.Status.PodIP
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.ParseIP(host)
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

// probePort is the probe's port, a number or the name of one of the container's ports.
func probePort(c *corev1.Container, g *corev1.HTTPGetAction) (int, error) {
	if g.Port.StrVal == "" {
		return int(g.Port.IntVal), nil
	}
	for _, p := range c.Ports {
		if p.Name == g.Port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %s for its probe", c.Name, g.Port.StrVal)
}

// containerPIDs are the processes whose cgroup names the container (cgroup v1 and v2, cgroupfs
// and systemd drivers all put the container's ID in the path).
func (p *Prober) containerPIDs(id string) ([]int, error) {
	if len(id) < 12 {
		return nil, fmt.Errorf("container ID %q is too short to look for", id)
	}
	entries, err := os.ReadDir(p.Proc)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(p.Proc, e.Name(), "cgroup"))
		if err != nil {
			continue // gone meanwhile
		}
		if strings.Contains(string(b), id) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// listens checks that the container's own processes hold every listening TCP socket that a
// connection to ip:port may reach (bound to ip itself or to every address), in the network
// namespace's tables: then whatever answers there is this container, never an earlier run still
// bound beside it (SO_REUSEPORT) or to the probe's address alone.
func (p *Prober) listens(pids []int, ip net.IP, port int) error {
	inodes := map[string]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(p.Proc, strconv.Itoa(pids[0]), "net", table))
		if err != nil {
			continue
		}
		for ino, local := range listeningInodes(f, port) {
			if local.IsUnspecified() || local.Equal(ip) {
				inodes[ino] = true
			}
		}
		_ = f.Close()
	}
	if len(inodes) == 0 {
		return fmt.Errorf("does not listen on %s yet", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
	}
	owned := map[string]bool{}
	for _, pid := range pids {
		fds := filepath.Join(p.Proc, strconv.Itoa(pid), "fd")
		entries, _ := os.ReadDir(fds)
		for _, e := range entries {
			link, err := os.Readlink(filepath.Join(fds, e.Name()))
			if err == nil && strings.HasPrefix(link, "socket:[") {
				owned[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
			}
		}
	}
	for ino := range inodes {
		if !owned[ino] {
			return fmt.Errorf("another process listens on %s too (an earlier run of it?)", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		}
	}
	return nil
}

// listeningInodes reads a /proc/net/tcp or tcp6 table: the socket inodes in state LISTEN (0A) on
// port, with the local address each is bound to.
func listeningInodes(f *os.File, port int) map[string]net.IP {
	out := map[string]net.IP{}
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		hexIP, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || int(n) != port {
			continue
		}
		if ip := procNetIP(hexIP); ip != nil {
			out[fields[9]] = ip
		}
	}
	return out
}

// procNetIP decodes an address of /proc/net/tcp{,6}: hex, each 32-bit word in host (little-endian)
// order.
func procNetIP(h string) net.IP {
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != net.IPv4len && len(b) != net.IPv6len) {
		return nil
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b)
}

// get runs one HTTP GET probe from pid's network namespace.
func (p *Prober) get(ctx context.Context, pid int, ip net.IP, g *corev1.HTTPGetAction, port int) error {
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(ip.String(), strconv.Itoa(port)), path)
	netns := filepath.Join(p.Proc, strconv.Itoa(pid), "ns", "net")
	tr := &http.Transport{
		// As the kubelet's prober: the component's serving certificate is not checked.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a probe, as the kubelet's
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns(ctx, netns, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("probe %s answered %s", url, resp.Status)
	}
	return nil
}

// dialInNetns dials from the network namespace at netns: the socket is made on an OS thread moved
// into that namespace, and keeps it after. The thread is never moved back: the goroutine ends
// locked, and Go ends the thread with it.
func dialInNetns(ctx context.Context, netns, network, addr string) (net.Conn, error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- dialed{err: fmt.Errorf("network namespace %s: %w", netns, err)}
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		_ = unix.Close(fd)
		if err != nil {
			ch <- dialed{err: fmt.Errorf("entering network namespace %s: %w", netns, err)}
			return
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		ch <- dialed{c: c, err: err}
	}()
	d := <-ch
	return d.c, d.err
}
