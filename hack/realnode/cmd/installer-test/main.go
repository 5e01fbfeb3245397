// Command installer-test is the real node's stand-in for an installer image that a NodeProfile or
// NodeOperation runs with a `pod` command: alone on scratch (image localhost/nodeops/installer-test:realnode),
// it prints a few recognisable lines and, as an installer would, writes a file into the host's
// root mounted at /host (mountHostRoot). With --exit N (N > 0) it fails with that code instead,
// writing nothing.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	marker := flag.String("marker", "/host/var/lib/nodeops-realnode/installer-test/installed", "the file it writes, in the container (the host's / is at /host)")
	exit := flag.Int("exit", 0, "fail with this exit code, writing nothing")
	flag.Parse()
	run := os.Getenv("INSTALLER_TEST_RUN")
	host, _ := os.Hostname()
	fmt.Printf("installer-test: run %q starting in pod %s\n", run, host)
	if *exit != 0 {
		fmt.Printf("installer-test: failing with exit code %d, as asked\n", *exit)
		os.Exit(*exit)
	}
	if _, err := os.Stat("/host/etc/os-release"); err != nil {
		fmt.Fprintf(os.Stderr, "installer-test: the host's root is not at /host: %v\n", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(filepath.Dir(*marker), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "installer-test: %v\n", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*marker, fmt.Appendf(nil, "installed by installer-test run %s\n", run), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "installer-test: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("installer-test: wrote %s\n", *marker)
	fmt.Println("installer-test: done")
}
