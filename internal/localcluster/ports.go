package localcluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// A nodeops-local instance chooses its listening ports (etcd, the API server, the agents'
// certificate-authority servers) before the components that bind them start, seconds later. A port
// that listen(":0") handed out is in the kernel's ephemeral range, from which every outbound
// connection on the machine also takes its local port: with several instances side by side (the
// e2e tests), one instance's clients took another's chosen port in that gap and its agent failed
// with "address already in use". So ports come from below the ephemeral range, where the kernel
// never hands a port out by itself, and each is held for the instance's life by an abstract Unix
// socket named after it, which another instance cannot bind and which the kernel frees on exit.
const (
	// reservedPortFloor is the lowest port taken; below it live well-known and registered services.
	reservedPortFloor = 20000
	// minReservedPorts is the smallest range below the ephemeral one worth using; a machine whose
	// ephemeral range starts lower gets ports from listen(":0") as before.
	minReservedPorts = 1000
	// portLockPrefix names the abstract socket (the "@" prefix) that holds a port for one instance.
	portLockPrefix = "@nodeops-local-port-"
)

// portReservations holds the ports one nodeops-local instance chose until release.
type portReservations struct {
	// ephemeralRange reads the kernel's ephemeral port range; tests replace it.
	ephemeralRange func() (low, high int, err error)
	held           []net.Listener
}

func newPortReservations() *portReservations {
	return &portReservations{ephemeralRange: kernelEphemeralRange}
}

// take returns n distinct loopback ports that are free now and that no other nodeops-local
// instance holds, each held until release.
func (r *portReservations) take(n int) ([]int, error) {
	low, _, err := r.ephemeralRange()
	if err != nil || low-reservedPortFloor < minReservedPorts {
		return ephemeralPorts(n)
	}
	span := low - reservedPortFloor
	start := rand.IntN(span) //nolint:gosec // spreading choices, not a secret
	var ports []int
	for i := 0; i < span && len(ports) < n; i++ {
		port := reservedPortFloor + (start+i)%span
		lock, err := net.Listen("unix", portLockPrefix+strconv.Itoa(port))
		if err != nil {
			continue // another instance holds it
		}
		probe, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			_ = lock.Close() // something else listens there
			continue
		}
		_ = probe.Close()
		r.held = append(r.held, lock)
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("finding %d free loopback ports between %d and %d: found %d", n, reservedPortFloor, low-1, len(ports))
	}
	return ports, nil
}

// release lets other instances take the ports again; call it once the components have stopped.
func (r *portReservations) release() {
	for _, l := range r.held {
		_ = l.Close()
	}
	r.held = nil
}

// kernelEphemeralRange is net.ipv4.ip_local_port_range, which also bounds IPv6's.
func kernelEphemeralRange() (low, high int, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0, fmt.Errorf("ip_local_port_range %q: want two numbers", b)
	}
	if low, err = strconv.Atoi(fields[0]); err == nil {
		high, err = strconv.Atoi(fields[1])
	}
	if err == nil && (low < 1 || high < low) {
		err = errors.New("ip_local_port_range is empty")
	}
	return low, high, err
}

// ephemeralPorts returns n distinct loopback ports that were free a moment ago, from the kernel.
func ephemeralPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
