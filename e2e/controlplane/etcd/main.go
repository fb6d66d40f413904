// Command etcd runs the etcd server from its Go module, so the local control
// plane needs no prebuilt etcd download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
