// Command etcd is etcd's own server main at the version kubeadm v1.36 deploys (3.6.8), so the
// real node's etcd image holds the etcd that kubeadm expects before the upgrade.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
