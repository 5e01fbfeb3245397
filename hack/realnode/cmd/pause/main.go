// Command pause is the pod sandbox process of the real node's images: it waits for a signal
// and exits 0. With -v it prints its version and exits 0 at once, as kubeadm's upgrade health
// check Job (which runs the pause image with "-v" and waits for it to complete) requires.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	for _, a := range os.Args[1:] {
		if a == "-v" {
			fmt.Println("pause (nodeops realnode) 3.10")
			return
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
