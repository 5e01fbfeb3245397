package localcluster

import (
	"net"
	"strconv"
	"testing"
)

// TestPortsComeFromBelowTheKernelsEphemeralRange: the kernel hands ports in its ephemeral range to
// every outbound connection, so a port chosen there can be taken by some client before the
// component that was to listen on it starts (an agent's "address already in use" with three
// instances side by side). Chosen ports lie below that range, where only an explicit bind takes one.
func TestPortsComeFromBelowTheKernelsEphemeralRange(t *testing.T) {
	low, _, err := kernelEphemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	if low-reservedPortFloor < minReservedPorts {
		t.Fatalf("this machine's ephemeral range starts at %d, too low to test ports below it", low)
	}
	r := newPortReservations()
	defer r.release()
	ports, err := r.take(4)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < reservedPortFloor || p >= low {
			t.Errorf("port %d: want one in [%d, %d), below the ephemeral range", p, reservedPortFloor, low)
		}
		if seen[p] {
			t.Errorf("port %d taken twice in %v", p, ports)
		}
		seen[p] = true
	}
}

// TestAnInstanceNeverTakesAPortAnotherHolds: two instances choosing from one small range (as if the
// ephemeral range began just above it) get disjoint ports, although every port both were given is
// free to bind at the moment each chose it: what keeps them apart is the other's hold.
func TestAnInstanceNeverTakesAPortAnotherHolds(t *testing.T) {
	small := func() (int, int, error) {
		return reservedPortFloor + minReservedPorts, 60999, nil
	}
	a := &portReservations{ephemeralRange: small}
	defer a.release()
	b := &portReservations{ephemeralRange: small}
	defer b.release()
	first, err := a.take(700)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.take(250)
	if err != nil {
		t.Fatal(err)
	}
	held := map[int]bool{}
	for _, p := range first {
		held[p] = true
	}
	for _, p := range second {
		if held[p] {
			t.Fatalf("port %d was given to both instances", p)
		}
	}
	// Released, its ports can be taken again.
	a.release()
	c := &portReservations{ephemeralRange: small}
	defer c.release()
	if _, err := c.take(700); err != nil {
		t.Errorf("after the first instance released its ports: %v", err)
	}
}

// TestAPortSomethingListensOnIsSkipped: a port another program already serves is never chosen.
func TestAPortSomethingListensOnIsSkipped(t *testing.T) {
	small := func() (int, int, error) {
		return reservedPortFloor + minReservedPorts, 60999, nil
	}
	busy := map[int]bool{}
	for p := reservedPortFloor; p < reservedPortFloor+50; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // already served by something else: busy for take too
		}
		defer l.Close()
		busy[p] = true
	}
	r := &portReservations{ephemeralRange: small}
	defer r.release()
	ports, err := r.take(900)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if busy[p] {
			t.Errorf("port %d is served by another listener, yet it was chosen", p)
		}
	}
}
