// The upstream agent-sandbox Go SDK (clients/go/sandbox), driven as a user
// of agent-sandbox drives it in port-forward mode (RuntimeSandboxd): claim a
// sandbox from a warm pool, run a command, write a file and read it back,
// close. Every step reaches the sandbox's runtime through a Pod
// port-forward, which on a vk-sandbox node goes through vk-sandbox's
// kubelet API and sandboxd's /ports relay. One JSON line per step on
// stdout; a failed step exits 1 naming it.
//
//	sdk-driver WARM_POOL NAMESPACE [MODE]   (KUBECONFIG names the cluster)
//
// MODE: port-forward (default); in-cluster-pod-ip (the SDK dials the Pod's
// address, from a process on the Pod network); router=URL (the SDK's
// direct-URL mode against a sandbox-router, with the runtime the SDK speaks
// through a router: the legacy Python runtime's /execute, /upload and
// /download, each request carrying the X-Sandbox-* headers).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/agent-sandbox/clients/go/sandbox"
)

func say(step string, fields map[string]any) {
	fields["step"] = step
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func fail(step string, err error) {
	say(step, map[string]any{"error": err.Error()})
	os.Exit(1)
}

func main() {
	if len(os.Args) != 3 && len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: sdk-driver WARM_POOL NAMESPACE [port-forward|in-cluster-pod-ip|router=URL]")
		os.Exit(2)
	}
	pool, ns := os.Args[1], os.Args[2]
	mode := "port-forward"
	if len(os.Args) == 4 {
		mode = os.Args[3]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	opts := sandbox.Options{
		Runtime:                 sandbox.RuntimeSandboxd,
		Namespace:               ns,
		SandboxReadyTimeout:     2 * time.Minute,
		PortForwardReadyTimeout: time.Minute,
	}
	switch {
	case mode == "port-forward":
	case mode == "in-cluster-pod-ip":
		opts.Connectivity = sandbox.ConnectivityInClusterPodIP
	case strings.HasPrefix(mode, "router="):
		opts.APIURL = strings.TrimPrefix(mode, "router=")
		opts.Runtime = sandbox.RuntimeLegacyPython
	default:
		fmt.Fprintf(os.Stderr, "sdk-driver: unknown mode %q\n", mode)
		os.Exit(2)
	}
	say("mode", map[string]any{"mode": mode})
	client, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		fail("client", err)
	}
	sb, err := client.CreateSandbox(ctx, pool, ns)
	if err != nil {
		fail("create", err)
	}
	say("create", map[string]any{"claim": sb.ClaimName(), "sandbox": sb.SandboxName(), "pod": sb.PodName()})

	command := "echo hello from the sandbox; echo to stderr >&2; exit 4"
	if opts.Runtime == sandbox.RuntimeLegacyPython {
		// The legacy runtime splits the command (shlex), with no shell.
		command = "sh -c 'echo hello from the sandbox; echo to stderr >&2; exit 4'"
	}
	res, err := sb.Run(ctx, command)
	if err != nil {
		fail("run", err)
	}
	say("run", map[string]any{"stdout": res.Stdout, "stderr": res.Stderr, "exit_code": res.ExitCode})

	content := []byte("written through vk-sandbox's port-forward\n")
	path := "notes/greeting.txt"
	if opts.Runtime == sandbox.RuntimeLegacyPython {
		// The legacy runtime's upload takes a plain file name.
		path = "greeting.txt"
	}
	if err := sb.Write(ctx, path, content); err != nil {
		fail("write", err)
	}
	say("write", map[string]any{"bytes": len(content)})
	back, err := sb.Read(ctx, path)
	if err != nil {
		fail("read", err)
	}
	say("read", map[string]any{"content": string(back)})

	if err := sb.Close(ctx); err != nil {
		fail("close", err)
	}
	say("close", map[string]any{})
}
