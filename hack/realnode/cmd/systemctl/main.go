// Command systemctl is the real node's stand-in for systemd's systemctl, installed on the host at
// /usr/bin/systemctl (= /bin/systemctl) while the node is up, the host's own systemctl kept aside.
// For the node's units, kubelet and containerd, it asks the node supervisor (`realnode supervise`)
// over its unix socket; for anything else, or when the supervisor is not running, it hands over to
// the host's own systemctl. So kubeadm and nodeops' agent (whose systemctl service manager runs
// /bin/systemctl restart kubelet.service in the host's root) restart the kubelet exactly as they
// would under systemd.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nodeops/nodeops/hack/realnode/internal/realnode"
)

// realSystemctl is the host's own systemctl, moved aside by `realnode up`.
var realSystemctl = realnode.BackupDir + realnode.ShimPath

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	verb, units, quiet := parse(args)
	if _, err := os.Stat(realnode.SupervisorSock); err != nil {
		return passThrough(args)
	}
	if verb == "daemon-reload" && len(units) == 0 {
		return 0 // nothing to reload: the supervisor reads the kubelet's environment files at every start
	}
	if !ours(units) {
		return passThrough(args)
	}
	switch verb {
	case "daemon-reload", "enable", "disable", "reenable", "mask", "unmask":
		// The supervisor re-reads the kubelet's environment files at every start; units are always enabled.
		return 0
	case "is-enabled":
		for range units {
			fmt.Println("enabled")
		}
		return 0
	case "start", "stop", "restart", "try-restart", "reload-or-restart", "condrestart", "reload", "is-active", "status", "show":
	default:
		fmt.Fprintf(os.Stderr, "systemctl (node supervisor stand-in): %q is not supported\n", verb)
		return 1
	}
	code := 0
	for _, u := range units {
		req := map[string]string{"try-restart": "restart", "reload-or-restart": "restart", "condrestart": "restart",
			"reload": "restart", "is-active": "status", "show": "status"}[verb]
		if req == "" {
			req = verb
		}
		reply, err := realnode.Call(realnode.SupervisorSock, req, u, 2*time.Minute)
		if err != nil {
			fmt.Fprintf(os.Stderr, "systemctl: %s %s: %v\n", verb, u, err)
			return 1
		}
		state := strings.Fields(reply + " inactive")[0]
		switch verb {
		case "is-active":
			if !quiet {
				fmt.Println(state)
			}
			if state != "active" {
				code = 3
			}
		case "show":
			fmt.Printf("Id=%s.service\nActiveState=%s\nLoadState=loaded\n", u, state)
		case "status":
			fmt.Printf("● %s.service - %s (run by the node supervisor, the stand-in for systemd)\n"+
				"     Loaded: loaded (node supervisor; enabled)\n     Active: %s\n", u, u, reply)
			if state != "active" {
				code = 3
			}
		}
	}
	return code
}

// parse returns the verb, the unit names without ".service" and whether --quiet was given.
func parse(args []string) (string, []string, bool) {
	verb, quiet := "", false
	var units []string
	positional := false // after "--", as systemctl reads it (nodeops' agent passes one before the unit)
	for _, a := range args {
		switch {
		case !positional && a == "--":
			positional = true
		case positional && verb != "":
			units = append(units, strings.TrimSuffix(a, ".service"))
		case !positional && (a == "-q" || a == "--quiet"):
			quiet = true
		case !positional && strings.HasPrefix(a, "-"):
		case verb == "":
			verb = a
		default:
			units = append(units, strings.TrimSuffix(a, ".service"))
		}
	}
	return verb, units, quiet
}

// ours is true when every named unit is one the supervisor runs.
func ours(units []string) bool {
	if len(units) == 0 {
		return false
	}
	for _, u := range units {
		if u != "kubelet" && u != "containerd" {
			return false
		}
	}
	return true
}

func passThrough(args []string) int {
	if err := syscall.Exec(realSystemctl, append([]string{"systemctl"}, args...), os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
	}
	return 1
}
