// The upstream agent-sandbox Go SDK (clients/go/sandbox), driven as a user
// of agent-sandbox drives it in port-forward mode (RuntimeSandboxd): claim a
// sandbox from a warm pool, run a command, write a file and read it back,
// close. Every step reaches the sandbox's runtime through a Pod
// port-forward, which on a vk-sandbox node goes through vk-sandbox's
// kubelet API and sandboxd's /ports relay. One JSON line per step on
// stdout; a failed step exits 1 naming it.
//
//	sdk-driver WARM_POOL NAMESPACE   (KUBECONFIG names the cluster)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: sdk-driver WARM_POOL NAMESPACE")
		os.Exit(2)
	}
	pool, ns := os.Args[1], os.Args[2]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	client, err := sandbox.NewClient(ctx, sandbox.Options{
		Runtime:                 sandbox.RuntimeSandboxd,
		Namespace:               ns,
		SandboxReadyTimeout:     2 * time.Minute,
		PortForwardReadyTimeout: time.Minute,
	})
	if err != nil {
		fail("client", err)
	}
	sb, err := client.CreateSandbox(ctx, pool, ns)
	if err != nil {
		fail("create", err)
	}
	say("create", map[string]any{"claim": sb.ClaimName(), "sandbox": sb.SandboxName(), "pod": sb.PodName()})

	res, err := sb.Run(ctx, "echo hello from the sandbox; echo to stderr >&2; exit 4")
	if err != nil {
		fail("run", err)
	}
	say("run", map[string]any{"stdout": res.Stdout, "stderr": res.Stderr, "exit_code": res.ExitCode})

	content := []byte("written through vk-sandbox's port-forward\n")
	if err := sb.Write(ctx, "notes/greeting.txt", content); err != nil {
		fail("write", err)
	}
	say("write", map[string]any{"bytes": len(content)})
	back, err := sb.Read(ctx, "notes/greeting.txt")
	if err != nil {
		fail("read", err)
	}
	say("read", map[string]any{"content": string(back)})

	if err := sb.Close(ctx); err != nil {
		fail("close", err)
	}
	say("close", map[string]any{})
}
