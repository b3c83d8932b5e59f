// A container runtime's CNI side in a few lines, through the real libcni (Debian's 1.1.2, the
// version cnitool, podman 4.3 and containerd 1.6 ship): it reads one request as JSON on stdin,
// runs the verb on the whole network list with libcni's version negotiation, result caching and
// prevResult handling, and prints ADD's result as libcni hands it to a runtime. The tests run it
// in their node namespace, so everything it touches is theirs.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
)

type request struct {
	Verb        string          `json:"verb"`
	Conflist    json.RawMessage `json:"conflist"`
	ContainerID string          `json:"containerID"`
	NetNS       string          `json:"netns"`
	IfName      string          `json:"ifname"`
	CNIPath     []string        `json:"cniPath"`
	// Where libcni caches results between ADD and CHECK/DEL (the test's own directory).
	CacheDir string `json:"cacheDir"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	list, err := libcni.ConfListFromBytes(req.Conflist)
	if err != nil {
		return fmt.Errorf("parsing the conflist: %w", err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(req.CNIPath, req.CacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: req.ContainerID, NetNS: req.NetNS, IfName: req.IfName}
	ctx := context.Background()
	switch req.Verb {
	case "ADD":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		return result.Print()
	case "CHECK":
		return cni.CheckNetworkList(ctx, list, rt)
	case "DEL":
		return cni.DelNetworkList(ctx, list, rt)
	case "VALIDATE":
		_, err := cni.ValidateNetworkList(ctx, list)
		return err
	}
	return fmt.Errorf("unknown verb %q", req.Verb)
}
