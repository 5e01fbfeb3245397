package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// profiled are the processes whose CPU profile -profile takes, with nodeops-local's flag for each.
var profiled = []struct{ name, flag string }{
	{"manager", "--manager-pprof-address"},
	{"agent-sim", "--sim-agent-pprof-address"},
}

// profileArgs picks a loopback address for each profiled process's Go profiler and returns
// nodeops-local's flags for them and the addresses by process.
func profileArgs() ([]string, map[string]string, error) {
	var args []string
	addrs := map[string]string{}
	for _, p := range profiled {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, fmt.Errorf("a port for %s's profiler: %w", p.name, err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		addrs[p.name] = addr
		args = append(args, p.flag+"="+addr)
	}
	return args, addrs, nil
}

// startProfiles asks each profiled process for a CPU profile of the next seconds and writes it to
// dir/k<K>-<scenario>-<process>.pprof; wait returns once all are written (or failed).
func startProfiles(ctx context.Context, addrs map[string]string, dir string, k int, scenario string, seconds int) (wait func() error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for name, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(dir, fmt.Sprintf("k%d-%s-%s.pprof", k, scenario, name))
			if err := fetchProfile(ctx, addr, path, seconds); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("profile of %s: %w", name, err))
				mu.Unlock()
			}
		}()
	}
	// The profiler starts sampling when it answers the request; give it a moment.
	time.Sleep(200 * time.Millisecond)
	return func() error {
		wg.Wait()
		if len(errs) > 0 {
			return errs[0]
		}
		return nil
	}
}

func fetchProfile(ctx context.Context, addr, path string, seconds int) error {
	url := "http://" + addr + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
