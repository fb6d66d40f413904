#!/usr/bin/env bash
# A real Kubernetes node for the tests: a kubelet (built from the control
# plane's Kubernetes release, e2e/node/build.sh) and Debian's containerd,
# runc and CNI plugins, on loopback, joined to the local control plane of
# e2e/cluster.sh. What kind provides with a container engine, built here
# from sources and packages this machine can reach (docs: e2e/README.md).
#
#   e2e/real-node.sh check     can this machine run it? exit 0, or 3 and why
#   e2e/real-node.sh up        start it (or wait for another run's node to
#                              go); prints the Node's name on stdout
#   e2e/real-node.sh down      stop it and restore the host (see below);
#                              exit 1 if the host differs from before `up`
#   e2e/real-node.sh reboot    a node reboot: kubelet and containerd stopped,
#                              every container killed and the node's tmpfs
#                              state (mounts, containerd's state folder)
#                              dropped, then both started again
#   e2e/real-node.sh import TAR...   `ctr images import` into the node's
#                              containerd (images are made locally, never
#                              pulled: e2e/image/build.sh)
#   e2e/real-node.sh ctr ARGS...     ctr on the node's containerd
#   e2e/real-node.sh status
#   e2e/real-node.sh pod-network     the Pod network's namespace (a path
#                              under /run/netns), its range and gateway
#
# The Node is named 127.0.0.1 (kubelet --hostname-override: its InternalIP is
# then 127.0.0.1, so the apiserver reaches the kubelet's API on loopback for
# logs, exec and port-forward). It is tainted node.vk-sandbox.test/real-node
# =true:NoSchedule so that only Pods tolerating it (the vk-sandbox DaemonSet
# tolerates every taint, as node agents do) land there, never another
# test's Pod. The node agents it runs are hostNetwork; a Pod that is not
# gets an address of the Pod range from the CNI bridge plugin, which runs
# inside a network namespace the node makes (vk-real-node-pods, removed by
# `down`): the bridge, the gateway and every Pod address live in there, so
# Pods reach each other (and whatever a test serves in that namespace)
# while no private-range address is ever a target in the host's own
# namespace. Routes of the kind `unreachable` cover the Service and Pod
# ranges in the host's namespace while the node is up, so no packet to
# them can leave the machine.
#
# One node per machine: `up` waits (up to VK_REAL_NODE_WAIT seconds, default
# 1800) while another run's node is up. A guard process tears the node down
# when the process that started it (VK_REAL_NODE_OWNER_PID, default the
# caller of `up`; 0 = nobody) ends, however it ends; a run killed outright
# (guard included) is torn down by the next `up` or `down` from its journal.
#
# `down` restores what the node changed on the host and checks it against a
# snapshot taken before `up`: the sysctls the kubelet rewrites at start
# (vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
# kernel.keys.root_maxkeys/maxbytes; also restored right after every kubelet
# start), processes (containers, shims, containerd, kubelet, by PID), mounts
# (everything under the node's folder, the kubelet's bind mount of its root
# included), cgroups (the kubepods trees in every hierarchy), links (the CNI
# bridge, if one appeared), routes (the two `unreachable` ones), folders
# outside the node's folder that did not exist before (/var/lib/kubelet,
# /var/log/pods, /var/log/containers, /run/netns, /var/lib/cni,
# /run/containerd, /var/lib/vk-sandbox — the DaemonSet's hostPath — and the
# others in `watched_paths`), the Node object, and the node's folder.
#
# Environment (all optional):
#   VK_CLUSTER_DIR, VK_APISERVER_PORT   the plane to join (as e2e/cluster.sh)
#   VK_REAL_NODE_DIR          the node's folder (default /tmp/vk-sandbox-real-node)
#   VK_REAL_NODE_KUBELET_PORT kubelet API port (default 10350; healthz 10358)
#   VK_REAL_NODE_OWNER_PID    see above
#   VK_REAL_NODE_WAIT         see above
#   VK_REAL_NODE_TAINT=none   register the Node without its taint (only on a
#                             plane no other test uses: e.g. to run a
#                             manifest that does not tolerate it)
set -Eeuo pipefail
trap 'echo "real-node: error: line $LINENO: $BASH_COMMAND failed" >&2' ERR

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
self="$here/real-node.sh"
version=$(tr -d '[:space:]' < "$here/k8s-version")
dir="${VK_REAL_NODE_DIR:-/tmp/vk-sandbox-real-node}"
cluster_dir="${VK_CLUSTER_DIR:-$root/.cache/cluster}"
api_port="${VK_APISERVER_PORT:-16443}"
kubelet_port="${VK_REAL_NODE_KUBELET_PORT:-10350}"
healthz_port=$((kubelet_port + 8))
node=127.0.0.1
taint_key=node.vk-sandbox.test/real-node
bridge=vkbr0
pod_cidr=10.244.77.0/24
pod_gateway=10.244.77.1
# The Pod network's namespace: the CNI bridge plugin runs in it.
pods_netns=vk-real-node-pods
# e2e/cluster.sh's --service-cluster-ip-range.
service_cidr=10.0.0.0/24
# Where containerd would send a registry request: nothing listens there.
no_pull_proxy=http://127.0.0.1:9
journal="$dir/journal"
run="$dir/run"
logs="$dir/logs"
ctd="$dir/containerd"
kdir="$dir/kubelet"
sock="$ctd/containerd.sock"
pki="$cluster_dir/pki"
admin_kubeconfig="$cluster_dir/admin.kubeconfig"

sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)
# Host paths the kubelet, containerd, runc, CNI or the DaemonSet create
# outside the node's folder; those absent before `up` are removed by `down`.
watched_paths=(/var/lib/kubelet /var/log/pods /var/log/containers /run/netns
  /var/lib/cni /run/containerd /var/lib/containerd /run/runc /var/run/kubernetes
  /usr/libexec/kubernetes /etc/kubernetes /etc/cni /opt/cni /var/lib/vk-sandbox
  /var/lib/dockershim /run/flannel)

log() { echo "real-node: $*" >&2; }
die() { echo "real-node: error: $*" >&2; exit 1; }
kubectl() { "$("$here/cluster.sh" bin)/kubectl" --kubeconfig "$admin_kubeconfig" "$@"; }
ctr() { command ctr --address "$sock" --namespace k8s.io "$@"; }

# ---------------------------------------------------------------- check
# Why this machine cannot run the node, or nothing.
cannot_run() {
  [[ $(id -u) -eq 0 ]] || { echo "it needs root (containers, mounts, cgroups); running as UID $(id -u)"; return; }
  local cmd
  for cmd in containerd containerd-shim-runc-v2 runc ctr ip openssl mount umount nsenter mountpoint; do
    command -v "$cmd" >/dev/null 2>&1 ||
      { echo "$cmd is not installed (make deps installs containerd, runc and containernetworking-plugins)"; return; }
  done
  for cmd in bridge host-local loopback; do
    [[ -x /usr/lib/cni/$cmd ]] || { echo "no CNI plugin /usr/lib/cni/$cmd (Debian package containernetworking-plugins)"; return; }
  done
  local capeff
  capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  (( (16#$capeff >> 21) & 1 )) || { echo "no CAP_SYS_ADMIN (a container without privileges cannot mount or make cgroups)"; return; }
  grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
  grep -qw overlay /proc/filesystems || { echo "the kernel has no overlay filesystem (containerd's snapshotter)"; return; }
  local c
  # Cgroups and the hostPath of a node of ours (up, or left by a run that
  # died) are handled by waiting for it or tearing it down.
  [[ -f "$journal/up" ]] && return 0
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    for c in cpu memory pids; do
      grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || { echo "cgroup v2 without the $c controller"; return; }
    done
    [[ ! -e /sys/fs/cgroup/kubepods ]] || { echo "/sys/fs/cgroup/kubepods exists: another kubelet runs on this machine"; return; }
  else
    for c in cpu cpuacct cpuset memory pids; do
      [[ -d /sys/fs/cgroup/$c ]] || { echo "no cgroup v1 hierarchy for $c under /sys/fs/cgroup"; return; }
      [[ ! -e /sys/fs/cgroup/$c/kubepods ]] || { echo "/sys/fs/cgroup/$c/kubepods exists: another kubelet runs on this machine"; return; }
    done
  fi
  if [[ -e /var/lib/vk-sandbox ]]; then
    echo "/var/lib/vk-sandbox exists (a vk-sandbox install's claims?): the DaemonSet under test uses that hostPath and the test will not touch it"
    return
  fi
}

cmd_check() {
  local why
  why=$(cannot_run)
  if [[ -n "$why" ]]; then echo "cannot run a real node here: $why"; exit 3; fi
  echo "a real node can run here (containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}'), cgroup $([[ -f /sys/fs/cgroup/cgroup.controllers ]] && echo v2 || echo v1))"
}

# ---------------------------------------------------------------- host state
# The host state the node may change, for `down` to compare.
snapshot() {
  local s p
  echo "## sysctl"
  for s in "${sysctls[@]}"; do
    [[ -e /proc/sys/${s//.//} ]] && echo "$s = $(sysctl -n "$s")"
  done
  echo "## mounts (mount point, type) outside the node's folder"
  awk -v d="$dir" '$5 != d && index($5, d "/") != 1 {print $5, $9}' /proc/self/mountinfo | sort
  echo "## cgroups (two levels)"
  find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null | sort
  echo "## links"
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
  echo "## routes"
  ip route show table all 2>/dev/null | sort
  echo "## network namespaces"
  ls /run/netns 2>/dev/null | sort || true
  echo "## paths"
  for p in "${watched_paths[@]}"; do [[ -e "$p" ]] && echo "$p"; done
  return 0
}

save_sysctls() {
  local s
  : > "$journal/sysctl"
  for s in "${sysctls[@]}"; do
    [[ -e /proc/sys/${s//.//} ]] && echo "$s=$(sysctl -n "$s")" >> "$journal/sysctl"
  done
  return 0
}

restore_sysctls() {
  [[ -f "$journal/sysctl" ]] || return 0
  local line k v now
  while IFS= read -r line; do
    k=${line%%=*}; v=${line#*=}
    now=$(sysctl -n "$k" 2>/dev/null || true)
    if [[ "$now" != "$v" ]]; then
      sysctl -q -w "$k=$v" >/dev/null || log "warning: could not restore $k=$v (now $now)"
      log "restored sysctl $k: $now -> $v"
    fi
  done < "$journal/sysctl"
}

# ---------------------------------------------------------------- ownership
# The node's folder is the machine-wide lock: made with mkdir (atomic), held
# by the PID in $dir/holder (the guard once `up` is done).
holder_alive() {
  local pid
  pid=$(cat "$dir/holder" 2>/dev/null || true)
  # This script (up, or its guard), not a process that reused the PID.
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
    ( tr '\0' ' ' < "/proc/$pid/cmdline" ) 2>/dev/null | grep -q 'real-node\.sh'
}

acquire() {
  local wait=${VK_REAL_NODE_WAIT:-1800} t0=$SECONDS said=false
  while true; do
    if mkdir "$dir" 2>/dev/null; then
      echo $$ > "$dir/holder"
      return 0
    fi
    if holder_alive; then
      if ! $said; then log "another run's node is up (holder PID $(cat "$dir/holder")); waiting up to ${wait}s"; said=true; fi
      (( SECONDS - t0 < wait )) || die "another run's node is still up after ${wait}s (holder PID $(cat "$dir/holder" 2>/dev/null)); stop it with e2e/real-node.sh down"
      sleep 2
      continue
    fi
    # No live holder: a run that died (or one creating the folder right
    # now: give it a moment).
    sleep 1
    holder_alive && continue
    log "a previous run left its node behind (no live holder): tearing it down first"
    teardown || true
  done
}

# ---------------------------------------------------------------- processes
start_bg() {
  local name=$1; shift
  mkdir -p "$logs" "$run"
  setsid "$@" >>"$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
}

stop_pid_file() {
  local name=$1 pid
  [[ -f "$run/$name.pid" ]] || return 0
  pid=$(cat "$run/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$run/$name.pid"
}

# PIDs whose command line names the node's containerd socket or folder
# (containerd-shim-runc-v2 processes).
node_pids() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$( (tr '\0' ' ' < "$p/cmdline") 2>/dev/null || true)
    [[ "$cmd" == *"$dir/"* ]] && echo "${p#/proc/}"
  done
  return 0
}

# Every process in the kubepods cgroups (the containers), by PID.
cgroup_pids() {
  # A cgroup removed during the walk or between find and cat (a container
  # just killed) is not an error: its processes are gone. find itself then
  # exits 1 (a vanished directory), which pipefail would report.
  { find /sys/fs/cgroup -path '*/kubepods*' \( -name tasks -o -name cgroup.procs \) -print0 2>/dev/null || true; } |
    { xargs -0 -r cat 2>/dev/null || true; } | sort -u
}

kill_containers() {
  local pids
  if [[ -S "$sock" ]]; then
    local id
    for id in $(ctr tasks ls -q 2>/dev/null || true); do
      ctr tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
  fi
  for _ in 1 2 3 4 5; do
    pids=$(cgroup_pids)
    [[ -n "$pids" ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
}

stop_runtime() {
  stop_pid_file kubelet
  kill_containers
  stop_pid_file containerd
  local pids
  pids=$(node_pids | grep -vx "$$" | grep -vx "$(cat "$run/guard.pid" 2>/dev/null || echo -)" || true)
  # shellcheck disable=SC2086
  [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
  kill_containers
}

# Unmounts everything under the node's folder (deepest first), then the
# network namespaces the node made.
unmount_all() {
  local m
  for _ in 1 2 3; do
    mapfile -t mounts < <(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
    ((${#mounts[@]})) || break
    for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  done
  if [[ -f "$journal/netns" ]]; then
    # Only the CNI's names (cni-<id>): other namespaces there belong to
    # other tests running meanwhile (tests/support/netns.rs), not to the
    # node.
    for m in /run/netns/cni-*; do
      [[ -e "$m" ]] || continue
      grep -qxF "$m" "$journal/netns" && continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
      rm -f "$m"
    done
  fi
}

remove_cgroups() {
  [[ -f "$journal/cgroups" ]] || return 0
  local d
  # Deepest first; only the ones that were not there before `up`.
  while IFS= read -r d; do
    grep -qxF "$d" "$journal/cgroups" || rmdir "$d" 2>/dev/null || true
  done < <(find /sys/fs/cgroup -mindepth 1 -type d -path '*/kubepods*' 2>/dev/null | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
}

# ---------------------------------------------------------------- up
node_ready() {
  [[ "$(kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# Ready as reported by a kubelet started at $1 (epoch seconds): after a
# restart the Node's old Ready status is stale until the new kubelet posts.
node_ready_since() {
  local out status beat
  out=$(kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  read -r status beat <<<"$out"
  [[ "$status" == True && -n "$beat" ]] || return 1
  (( $(date -u -d "$beat" +%s) >= $1 )) &&
    curl -fsS --max-time 1 "http://127.0.0.1:$healthz_port/healthz" >/dev/null 2>&1
}

write_configs() {
  mkdir -p "$ctd/root" "$ctd/state" "$ctd/runc" "$ctd/cni/net.d" "$ctd/cni/ipam" "$ctd/cni/bin" \
    "$kdir/root" "$kdir/pki" "$kdir/pod-logs" "$kdir/volume-plugins" "$dir/images"
  cat > "$ctd/config.toml" <<EOF
version = 2
root = "$ctd/root"
state = "$ctd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = "$ctd/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  # Imported by \`up\`, never pulled.
  sandbox_image = "registry.k8s.io/pause:vk-local"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Root here may lack CAP_SYS_RESOURCE: the kubelet's oom_score_adj of -998
  # for sandboxes would fail every Pod ("can't get final child's PID").
  restrict_oom_score_adj = true
  # Pod network namespaces under the state folder, not /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$ctd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$ctd/cni/bin"
    conf_dir = "$ctd/cni/net.d"
EOF
  # Debian's plugins, and the bridge plugin run inside the Pod network's
  # namespace: the bridge, its gateway address and the host end of every
  # Pod's veth are made there, never in the host's namespace (a plugin
  # works in the namespace of the process that runs it; the Pod's own
  # namespace is named by CNI_NETNS, a path).
  local p
  for p in host-local loopback; do ln -sfn "/usr/lib/cni/$p" "$ctd/cni/bin/$p"; done
  printf '%s\n' '#!/bin/sh' \
    "exec nsenter --net=/run/netns/$pods_netns /usr/lib/cni/bridge" > "$ctd/cni/bin/vk-netns-bridge"
  chmod 0755 "$ctd/cni/bin/vk-netns-bridge"
  cat > "$ctd/cni/net.d/10-vk-real-node.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "vk-real-node", "plugins": [
  {"type": "vk-netns-bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$ctd/cni/ipam", "ranges": [[{"subnet": "$pod_cidr", "gateway": "$pod_gateway"}]],
   "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
EOF
  cat > "$kdir/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
# This machine may be cgroup v1, which kubelet 1.35+ refuses by default.
failCgroupV1: false
failSwapOn: false
# No iptables chains on the host (nothing here needs them).
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$sock
imageServiceEndpoint: unix://$sock
podLogsDir: $kdir/pod-logs
volumePluginDir: $kdir/volume-plugins
# Images are imported, never pulled or collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: true
EOF
  if [[ "${VK_REAL_NODE_TAINT:-}" != none ]]; then
    printf '%s\n' "registerWithTaints:" "- {key: $taint_key, value: \"true\", effect: NoSchedule}" >> "$kdir/config.yaml"
  fi
}

node_credentials() {
  [[ -f "$pki/ca.key" ]] || die "no control plane PKI in $pki: start the plane first (e2e/cluster.sh up) with the same VK_CLUSTER_DIR"
  local k="$kdir/pki/node"
  openssl ecparam -name prime256v1 -genkey -noout -out "$k.key" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth" > "$k.ext"
  openssl req -new -key "$k.key" -subj "/O=system:nodes/CN=system:node:$node" -out "$k.csr" 2>/dev/null
  openssl x509 -req -in "$k.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$k.ext" -out "$k.crt" 2>/dev/null
  (umask 077; cat > "$kdir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(base64 -w0 < "$pki/ca.crt")
users:
- name: node
  user:
    client-certificate-data: $(base64 -w0 < "$k.crt")
    client-key-data: $(base64 -w0 < "$k.key")
contexts:
- name: local
  context: {cluster: local, user: node}
current-context: local
EOF
  )
}

# The Pod network's namespace (see the header); journalled for `down`.
make_pod_network() {
  if [[ -e "/run/netns/$pods_netns" ]]; then
    # Left by a run killed outright before its teardown.
    ip netns del "$pods_netns" 2>/dev/null || true
  fi
  # The first `ip netns add` on a machine makes /run/netns a mount of
  # itself: undone by `down` when it was not one before.
  mountpoint -q /run/netns 2>/dev/null || touch "$journal/netns-unmounted"
  ip netns add "$pods_netns"
  touch "$journal/pods-netns"
  ip -n "$pods_netns" link set lo up
}

add_routes() {
  local cidr
  : > "$journal/routes"
  for cidr in "$service_cidr" "$pod_cidr"; do
    if [[ -z "$(ip route show "$cidr" 2>/dev/null)" ]]; then
      ip route add unreachable "$cidr" && echo "$cidr" >> "$journal/routes"
    fi
  done
}

start_containerd() {
  # Images are imported, never pulled; should a pull be attempted anyway
  # (an image missing from the store), it goes to a proxy on loopback that
  # refuses it: no registry is contacted and no name resolved.
  start_bg containerd env HTTPS_PROXY="$no_pull_proxy" HTTP_PROXY="$no_pull_proxy" \
    https_proxy="$no_pull_proxy" http_proxy="$no_pull_proxy" NO_PROXY= no_proxy= \
    containerd --config "$ctd/config.toml"
  local t0=$SECONDS
  until [[ -S "$sock" ]] && ctr version >/dev/null 2>&1; do
    kill -0 "$(cat "$run/containerd.pid")" 2>/dev/null || { tail -20 "$logs/containerd.log" >&2; die "containerd exited"; }
    (( SECONDS - t0 < 30 )) || { tail -20 "$logs/containerd.log" >&2; die "containerd not serving after 30s"; }
    sleep 0.2
  done
}

start_kubelet() {
  local bin t_start
  bin=$("$here/node/build.sh")
  t_start=$(date -u +%s)
  start_bg kubelet "$bin" --config "$kdir/config.yaml" --kubeconfig "$kdir/kubeconfig" \
    --root-dir "$kdir/root" --cert-dir "$kdir/pki" --hostname-override "$node" -v 2
  local t0=$SECONDS
  until node_ready_since "$t_start"; do
    kill -0 "$(cat "$run/kubelet.pid")" 2>/dev/null || { restore_sysctls; tail -30 "$logs/kubelet.log" >&2; die "the kubelet exited"; }
    (( SECONDS - t0 < 90 )) || { restore_sysctls; tail -30 "$logs/kubelet.log" >&2; die "Node $node not Ready after 90s"; }
    sleep 0.3
  done
  # The kubelet sets vm.overcommit_memory, kernel.panic, ... while it
  # starts: restored now, and again should a late write follow.
  for _ in 1 2 3 4 5 6; do
    restore_sysctls
    sleep 0.5
  done
}

guard() {
  local owner=$1
  echo $$ > "$run/guard.pid"
  echo $$ > "$dir/holder"
  while [[ -f "$journal/up" ]]; do
    if [[ "$owner" != 0 ]] && ! kill -0 "$owner" 2>/dev/null; then
      log "the process that started the node ($owner) ended: tearing the node down"
      VK_REAL_NODE_GUARD=1 "$self" down || true
      return
    fi
    sleep 1
  done
}

cmd_up() {
  local why
  why=$(cannot_run)
  [[ -z "$why" ]] || { echo "real-node: cannot run a real node here: $why" >&2; exit 3; }
  [[ -f "$admin_kubeconfig" ]] || die "no control plane at $cluster_dir (e2e/cluster.sh up first, with the same VK_CLUSTER_DIR)"
  # Built before taking the node, so a cold build holds nothing.
  "$here/node/build.sh" >/dev/null
  local t0=$SECONDS owner=${VK_REAL_NODE_OWNER_PID:-$PPID}
  acquire
  mkdir -p "$journal" "$run" "$logs"
  snapshot > "$journal/before"
  find /sys/fs/cgroup -mindepth 1 -type d -path '*/kubepods*' > "$journal/cgroups" 2>/dev/null || true
  ls -d /run/netns/* > "$journal/netns" 2>/dev/null || true
  local p
  : > "$journal/paths"
  for p in "${watched_paths[@]}"; do [[ -e "$p" ]] || echo "$p" >> "$journal/paths"; done
  ip -o link show "$bridge" >/dev/null 2>&1 && touch "$journal/bridge-existed"
  save_sysctls
  touch "$journal/up"
  # From here on, a failure tears down what was made.
  up_done=false
  trap '$up_done || { log "up failed: tearing down"; teardown || true; }' EXIT
  write_configs
  node_credentials
  make_pod_network
  add_routes
  log "containerd $(containerd --version | awk '{print $3}') on $sock"
  start_containerd
  "$root/e2e/image/build.sh" pause "$dir/images/pause.tar" registry.k8s.io/pause:vk-local 2>/dev/null
  ctr images import "$dir/images/pause.tar" >/dev/null
  log "kubelet $version on 127.0.0.1:$kubelet_port, joining https://127.0.0.1:$api_port as Node $node"
  start_kubelet
  # The guard holds the node from now on.
  setsid "$self" __guard "$owner" >>"$logs/guard.log" 2>&1 < /dev/null &
  echo $! > "$run/guard.pid"
  echo $! > "$dir/holder"
  up_done=true
  log "Node $node Ready in $((SECONDS - t0))s (kubelet $version, containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}'), cgroup $([[ -f /sys/fs/cgroup/cgroup.controllers ]] && echo v2 || echo v1)); folder $dir"
  echo "$node"
}

# ---------------------------------------------------------------- down
teardown() {
  [[ -d "$dir" ]] || return 0
  # The guard runs `down` itself when the node's owner ends.
  [[ -n "${VK_REAL_NODE_GUARD:-}" ]] || stop_pid_file guard
  stop_runtime
  unmount_all
  remove_cgroups
  if [[ -f "$journal/pods-netns" ]]; then
    # With it go the bridge and the host ends of the Pods' veths.
    ip netns del "$pods_netns" 2>/dev/null && log "deleted the Pod network's namespace $pods_netns"
    if [[ -f "$journal/netns-unmounted" ]] && mountpoint -q /run/netns && [[ -z "$(ls -A /run/netns)" ]]; then
      umount /run/netns 2>/dev/null || umount -l /run/netns 2>/dev/null || true
    fi
  fi
  if [[ -f "$journal/bridge-existed" ]]; then :; elif ip -o link show "$bridge" >/dev/null 2>&1; then
    ip link del "$bridge" && log "deleted the bridge $bridge"
  fi
  local cidr p
  if [[ -f "$journal/routes" ]]; then
    while IFS= read -r cidr; do ip route del unreachable "$cidr" 2>/dev/null || true; done < "$journal/routes"
  fi
  restore_sysctls
  if [[ -f "$journal/paths" ]]; then
    while IFS= read -r p; do
      [[ -e "$p" ]] || continue
      # Never across a mount (a bind mount left inside it).
      rm -rf --one-file-system "$p" && log "removed $p (made while the node ran)"
    done < "$journal/paths"
  fi
  # (Read whole first: `grep -q` on a pipe would end the writer early and
  # pipefail then reads that as "not ready".)
  local plane
  plane=$("$root/e2e/cluster.sh" status 2>/dev/null || true)
  if [[ -f "$admin_kubeconfig" && "$plane" == *"apiserver: ready"* ]]; then
    kubectl delete node "$node" --ignore-not-found --wait=false >/dev/null 2>&1 &&
      log "deleted the Node $node" || log "warning: could not delete the Node $node"
  fi
  local before=""
  [[ -f "$journal/before" ]] && before=$(cat "$journal/before")
  rm -rf --one-file-system "$dir"
  if [[ -n "$before" ]]; then
    local after
    after=$(snapshot)
    if [[ "$before" == "$after" ]]; then
      log "host as found: sysctls, mounts, cgroups, links, routes, network namespaces and paths identical to before \`up\`"
    else
      log "the host DIFFERS from before \`up\` (- before, + after):"
      diff <(echo "$before") <(echo "$after") | grep '^[<>]' | sed 's/^</  -/; s/^>/  +/' >&2
      return 1
    fi
  fi
}

cmd_down() {
  if [[ ! -d "$dir" ]]; then log "no node (nothing in $dir)"; return 0; fi
  if [[ -z "${VK_REAL_NODE_GUARD:-}" ]] && holder_alive; then
    local h
    h=$(cat "$dir/holder")
    [[ "$h" == "$(cat "$run/guard.pid" 2>/dev/null)" ]] || log "note: the node is held by PID $h; tearing it down anyway"
  fi
  local t0=$SECONDS rc=0
  teardown || rc=$?
  log "down in $((SECONDS - t0))s"
  return $rc
}

cmd_reboot() {
  [[ -f "$journal/up" ]] || die "no node is up"
  local t0=$SECONDS
  log "rebooting Node $node: kubelet and containerd stopped, containers killed, tmpfs state dropped"
  stop_pid_file kubelet
  kill_containers
  stop_pid_file containerd
  local pids
  pids=$(node_pids | grep -vx "$$" | grep -vx "$(cat "$run/guard.pid" 2>/dev/null || echo -)" || true)
  # shellcheck disable=SC2086
  [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
  unmount_all
  # What lives on tmpfs (/run) on a real node is gone after a reboot.
  rm -rf --one-file-system "$ctd/state" ||
    { log "warning: $ctd/state not fully removed:"; awk -v d="$ctd/state" 'index($5, d) == 1 {print "  " $5}' /proc/self/mountinfo >&2; }
  mkdir -p "$ctd/state"
  start_containerd
  start_kubelet
  log "Node $node back and Ready in $((SECONDS - t0))s"
}

cmd_status() {
  if [[ ! -f "$journal/up" ]]; then echo "real node: down"; return; fi
  local c
  for c in containerd kubelet guard; do
    if [[ -f "$run/$c.pid" ]] && kill -0 "$(cat "$run/$c.pid")" 2>/dev/null; then
      echo "$c: running (pid $(cat "$run/$c.pid"))"
    else
      echo "$c: stopped"
    fi
  done
  echo "node: $node ($(node_ready && echo Ready || echo not Ready)); folder $dir; logs $logs"
}

case "${1:-}" in
  check) cmd_check ;;
  up) cmd_up ;;
  down) cmd_down ;;
  reboot) cmd_reboot ;;
  status) cmd_status ;;
  import) shift; for t in "$@"; do ctr images import "$t" >/dev/null; log "imported $t"; done ;;
  ctr) shift; ctr "$@" ;;
  name) echo "$node" ;;
  pod-network) echo "/run/netns/$pods_netns $pod_cidr $pod_gateway" ;;
  __guard) guard "$2" ;;
  *) sed -n '2,67p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
