// Command etcd is etcd's own server main, built here so that nodeops-local and
// envtest use a real etcd from the Go module proxy at the version Kubernetes pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
