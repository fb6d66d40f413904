#!/usr/bin/env bash
# The local Kubernetes control plane for vk-sandbox's tests and demo:
# etcd, kube-apiserver, kube-scheduler and kube-controller-manager built from
# their Go modules (e2e/controlplane/build.sh), run on loopback with a PKI
# generated here, authorization Node,RBAC.
#
#   e2e/cluster.sh up            build if needed, start (or reuse) the plane
#   e2e/cluster.sh down          stop every component, leave no process behind
#   e2e/cluster.sh status        say what runs and where
#   e2e/cluster.sh sa-kubeconfig OUT [NAMESPACE] [SERVICEACCOUNT]
#                                apply manifests/rbac.yaml and write a
#                                kubeconfig for that ServiceAccount's token
#   e2e/cluster.sh logs          print the tail of every component log
#   e2e/cluster.sh vk-audit-log  path of the audit log of vk-sandbox's
#                                ServiceAccount (the RBAC usage check)
#   e2e/cluster.sh audit-apiserver up|down|status
#                                opt-in (benchmarks): a second kube-apiserver
#                                on the same etcd and PKI, on its own port,
#                                writing an audit log (Metadata level) of
#                                every request it serves; `up` prints its
#                                URL and log path. The main one is untouched.
#   e2e/cluster.sh scratch-apiserver up NAME PORT | down NAME
#                                a kube-apiserver on the same etcd and PKI
#                                under an etcd prefix of its own: an empty
#                                cluster of its own, for a test that installs
#                                or removes cluster-wide objects (CRDs) the
#                                other tests rely on; `up` prints its admin
#                                kubeconfig, `down` stops it and deletes its
#                                keys. No scheduler or controllers.
#   e2e/cluster.sh restart COMPONENT [SECONDS]
#                                stop one component, keep it down SECONDS,
#                                start it again (reliability fault injection)
#
# Environment (all optional):
#   VK_CLUSTER_DIR      state folder (default .cache/cluster)
#   VK_APISERVER_PORT   kube-apiserver secure port (default 16443)
#   VK_ETCD_PORT        etcd client port (default 23790; peer port +10)
#   VK_NODE_MONITOR_GRACE  node lifecycle grace period (default 20s)
#   VK_EVICTION_TOLERATION_SECONDS  default not-ready/unreachable toleration
#                       the apiserver adds to Pods (default 30)
#   VK_AUDIT_APISERVER_PORT  port of the audit-apiserver (default 16444)
#
# The node lifecycle controller stops evicting in a "disrupted" zone; tests
# leave dead virtual nodes behind, so partial disruption is turned off
# (--unhealthy-zone-threshold 1) and only "no node Ready" pauses evictions.
# Those dead nodes also queue for their NoExecute taint at the default 0.1
# nodes/s (one every 10 s): after a suite's worth of tests the node a test
# pauses was tainted minutes late (the eviction storm's 180 s wait ran out
# just before its Pods were evicted), so the rate is lifted
# (--node-eviction-rate 100).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version=$(tr -d '[:space:]' < "$here/k8s-version")
bin="${VK_K8S_BIN_DIR:-$root/.cache/k8s-$version/bin}"
dir="${VK_CLUSTER_DIR:-$root/.cache/cluster}"
api_port="${VK_APISERVER_PORT:-16443}"
etcd_port="${VK_ETCD_PORT:-23790}"
etcd_peer_port=$((etcd_port + 10))
sched_port="${VK_SCHEDULER_PORT:-17259}"
kcm_port="${VK_KCM_PORT:-17257}"
grace="${VK_NODE_MONITOR_GRACE:-20s}"
toleration="${VK_EVICTION_TOLERATION_SECONDS:-30}"
pki="$dir/pki"
logs="$dir/logs"
run="$dir/run"
admin_kubeconfig="$dir/admin.kubeconfig"
components=(etcd kube-apiserver kube-scheduler kube-controller-manager)
audit_port="${VK_AUDIT_APISERVER_PORT:-16444}"
audit_dir="$dir/audit"

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

kubectl() { "$bin/kubectl" --kubeconfig "$admin_kubeconfig" "$@"; }

# ---------------------------------------------------------------- PKI
gen_key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; chmod 600 "$1"; }

# gen_cert NAME CN O SAN(or "") CA  -> $pki/NAME.{key,crt}, client+server usage
gen_cert() {
  local name=$1 cn=$2 org=$3 san=$4 ca=$5
  local subj="/CN=$cn"
  [[ -n "$org" ]] && subj="/O=$org$subj"
  gen_key "$pki/$name.key"
  local ext="$pki/$name.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } > "$ext"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

gen_ca() {
  local name=$1 cn=$2
  gen_key "$pki/$name.key"
  openssl req -x509 -new -key "$pki/$name.key" -subj "/CN=$cn" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyCertSign,cRLSign" \
    -out "$pki/$name.crt" 2>/dev/null
}

ensure_pki() {
  [[ -f "$pki/.done" ]] && return 0
  command -v openssl >/dev/null || die "openssl is needed to generate the cluster PKI (apt-get install openssl)"
  log "generating PKI in $pki"
  rm -rf "$pki"; mkdir -p "$pki"; chmod 700 "$pki"
  gen_ca ca kubernetes-ca
  gen_ca front-proxy-ca front-proxy-ca
  gen_cert apiserver kube-apiserver "" \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1" ca
  gen_cert admin kubernetes-admin system:masters "" ca
  gen_cert kube-scheduler system:kube-scheduler "" "" ca
  gen_cert kube-controller-manager system:kube-controller-manager "" "" ca
  gen_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" ca
  gen_cert front-proxy-client front-proxy-client "" "" front-proxy-ca
  gen_key "$pki/sa.key"
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  touch "$pki/.done"
}

b64() { base64 -w0 < "$1"; }

# kubeconfig_file OUT USER CREDENTIAL-LINES: a kubeconfig for this
# cluster; the user's credentials come as already-indented YAML lines.
kubeconfig_file() {
  local out=$1 user=$2 creds=$3
  umask 077
  cat > "$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $user
  user:
$creds
contexts:
- name: local
  context: {cluster: local, user: $user}
current-context: local
EOF
}

# write_kubeconfig OUT USER CERT KEY: client-certificate credentials.
write_kubeconfig() {
  kubeconfig_file "$1" "$2" "    client-certificate-data: $(b64 "$3")
    client-key-data: $(b64 "$4")"
}

# ---------------------------------------------------------------- processes
pid_alive() { [[ -f "$run/$1.pid" ]] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

# Runs "$@" in a session of its own with none of this shell's open files
# beyond stdin, stdout and stderr. A daemon must not keep what its starter
# held: `flock LOCK make test` leaves the lock's descriptor open in every
# child, and an etcd or kube-apiserver restarted during the run (the
# reliability suite's apiserver outage) held the machine-wide heavy-job lock
# for as long as it lived.
detach() {
  local fd
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    if [[ $fd =~ ^[0-9]+$ ]] && ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
  exec setsid "$@"
}

start() {
  local name=$1; shift
  mkdir -p "$logs" "$run"
  (detach "$bin/$name" "$@") >"$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
}

readyz() {
  curl -fsS --max-time 2 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$api_port/readyz" 2>/dev/null
}

wait_for() {
  local what=$1 limit=$2; shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - t0 > limit )); then
      log "$what not ready after ${limit}s; last log lines:"
      tail -n 30 "$logs"/*.log >&2 || true
      return 1
    fi
    sleep 0.3
  done
}

all_alive() {
  local c
  for c in "${components[@]}"; do pid_alive "$c" || return 1; done
}

start_etcd() {
  start etcd --name local --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "local=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --quota-backend-bytes 2147483648 --log-level warn
}

# The audit log of vk-sandbox's own ServiceAccount (Metadata level, nobody
# else's requests): e2e/run-tests.sh checks from it that every verb
# manifests/rbac.yaml grants was used (tests/rbac_usage.rs).
vk_audit_log="$logs/vk-sandbox-audit.log"
write_vk_audit_policy() {
  printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' \
    'omitStages: [RequestReceived]' 'rules:' \
    '- level: Metadata' '  users: ["system:serviceaccount:sandbox-system:vk-sandbox"]' \
    '- level: None' > "$dir/vk-audit-policy.yaml"
}

# The flags every kube-apiserver here shares (the main one, the audit and
# the scratch ones): etcd, serving on loopback PORT, the PKI, RBAC.
shared_apiserver_args() {
  local port=$1
  # shellcheck disable=SC2054 # the commas are inside flag values
  apiserver_args=(
    --etcd-servers "http://127.0.0.1:$etcd_port"
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port"
    --endpoint-reconciler-type none
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key"
    --client-ca-file "$pki/ca.crt"
    --service-account-key-file "$pki/sa.pub"
    --service-account-signing-key-file "$pki/sa.key"
    --service-account-issuer https://kubernetes.default.svc.cluster.local
    --api-audiences https://kubernetes.default.svc.cluster.local
    --authorization-mode Node,RBAC
    --service-cluster-ip-range 10.0.0.0/24
  )
}

start_kube_apiserver() {
  write_vk_audit_policy
  shared_apiserver_args "$api_port"
  start kube-apiserver "${apiserver_args[@]}" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" \
    --proxy-client-key-file "$pki/front-proxy-client.key" \
    --default-not-ready-toleration-seconds "$toleration" \
    --default-unreachable-toleration-seconds "$toleration" \
    --allow-privileged=true --profiling=false \
    --audit-policy-file "$dir/vk-audit-policy.yaml" \
    --audit-log-path "$vk_audit_log" --audit-log-format json \
    --audit-log-mode blocking --audit-log-maxsize 2000 --audit-log-maxbackup 1
}

start_kube_scheduler() {
  start kube-scheduler \
    --kubeconfig "$dir/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false
}

start_kube_controller_manager() {
  # The flex-volume plugin directory defaults to /usr/libexec/kubernetes,
  # which the controller-manager creates: keep it in the plane's folder.
  start kube-controller-manager \
    --flex-volume-plugin-dir "$dir/volume-plugins" \
    --kubeconfig "$dir/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --controllers '*' \
    --node-monitor-period 2s --node-monitor-grace-period "$grace" \
    --unhealthy-zone-threshold 1 \
    --node-eviction-rate 100 \
    --concurrent-gc-syncs 5
}

cmd_up() {
  if all_alive && readyz >/dev/null; then
    log "already up (apiserver https://127.0.0.1:$api_port)"
    echo "$admin_kubeconfig"
    return 0
  fi
  cmd_down >/dev/null 2>&1 || true
  "$here/controlplane/build.sh" >&2
  command -v curl >/dev/null || die "curl is needed (apt-get install curl)"
  ensure_pki
  local t0=$SECONDS
  rm -rf "$dir/etcd-data"
  mkdir -p "$dir/etcd-data" "$logs" "$run"
  log "starting etcd on 127.0.0.1:$etcd_port"
  start_etcd
  wait_for etcd 20 curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health"

  log "starting kube-apiserver on 127.0.0.1:$api_port"
  start_kube_apiserver
  write_kubeconfig "$admin_kubeconfig" kubernetes-admin "$pki/admin.crt" "$pki/admin.key"
  write_kubeconfig "$dir/kube-scheduler.kubeconfig" system:kube-scheduler "$pki/kube-scheduler.crt" "$pki/kube-scheduler.key"
  write_kubeconfig "$dir/kube-controller-manager.kubeconfig" system:kube-controller-manager \
    "$pki/kube-controller-manager.crt" "$pki/kube-controller-manager.key"
  wait_for kube-apiserver 60 readyz

  log "starting kube-scheduler and kube-controller-manager"
  start_kube_scheduler
  start_kube_controller_manager
  wait_for kube-scheduler 30 curl -fsSk --max-time 1 "https://127.0.0.1:$sched_port/healthz"
  wait_for kube-controller-manager 30 curl -fsSk --max-time 1 "https://127.0.0.1:$kcm_port/healthz"
  # The default ServiceAccount appears once the controller-manager runs.
  wait_for "default ServiceAccount" 30 kubectl -n default get serviceaccount default
  log "up in $(( SECONDS - t0 ))s: apiserver https://127.0.0.1:$api_port, logs in $logs"
  log "try: $bin/kubectl --kubeconfig $admin_kubeconfig get --raw /readyz"
  echo "$admin_kubeconfig"
}

# Stop one component, leave it down for <seconds>, start it again with the
# same flags and wait until it serves (fault injection for the reliability
# suite: an apiserver outage, an etcd restart).
cmd_restart() {
  local name=${1:-} down=${2:-0}
  case "$name" in
    etcd|kube-apiserver|kube-scheduler|kube-controller-manager) ;;
    *) die "usage: cluster.sh restart etcd|kube-apiserver|kube-scheduler|kube-controller-manager [seconds-down]" ;;
  esac
  [[ "$down" =~ ^[0-9]+$ ]] || die "seconds-down must be a whole number, got '$down'"
  all_alive || die "the control plane is not up (cluster.sh up)"
  local pid
  pid=$(cat "$run/$name.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  log "$name stopped; down for ${down}s"
  sleep "$down"
  # The log of the run before the restart is kept beside the new one.
  mv "$logs/$name.log" "$logs/$name.log.prev" 2>/dev/null || true
  # A port of ours can be held for a moment by a passing client
  # connection's ephemeral source port (ours lie in that range): a start
  # that exits at once is retried.
  local attempt
  for attempt in 1 2 3 4 5; do
    "start_${name//-/_}"
    sleep 1
    pid_alive "$name" && break
    log "$name exited at start (attempt $attempt): $(tail -n 1 "$logs/$name.log" | cut -c1-200)"
    (( attempt < 5 )) || die "$name does not start; see $logs/$name.log"
    sleep 2
  done
  case "$name" in
    etcd) wait_for etcd 30 curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" ;;
    kube-apiserver) wait_for kube-apiserver 60 readyz ;;
    kube-scheduler) wait_for kube-scheduler 30 curl -fsSk --max-time 1 "https://127.0.0.1:$sched_port/healthz" ;;
    kube-controller-manager) wait_for kube-controller-manager 30 curl -fsSk --max-time 1 "https://127.0.0.1:$kcm_port/healthz" ;;
  esac
  log "$name serving again"
}

cmd_down() {
  local c pid
  for c in kube-controller-manager kube-scheduler kube-apiserver etcd; do
    if [[ -f "$run/$c.pid" ]]; then
      pid=$(cat "$run/$c.pid")
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for c in kube-controller-manager kube-scheduler kube-apiserver etcd; do
    [[ -f "$run/$c.pid" ]] || continue
    pid=$(cat "$run/$c.pid")
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$run/$c.pid"
  done
  # Anything else this cluster folder started (e.g. a pid file lost by
  # hand); another plane run from another VK_CLUSTER_DIR is left alone.
  pkill -KILL -f "^$bin/(etcd|kube-apiserver|kube-scheduler|kube-controller-manager) .*$dir/" 2>/dev/null || true
  log "down"
}

cmd_status() {
  local c
  for c in "${components[@]}"; do
    if pid_alive "$c"; then echo "$c: running (pid $(cat "$run/$c.pid"))"; else echo "$c: stopped"; fi
  done
  if readyz >/dev/null; then echo "apiserver: ready at https://127.0.0.1:$api_port"; else echo "apiserver: not ready"; fi
  echo "kubeconfig: $admin_kubeconfig"
  echo "logs: $logs"
}

cmd_logs() {
  local f
  for f in "$logs"/*.log; do
    [[ -f "$f" ]] || continue
    echo "==== $f (last 40 lines)"
    tail -n 40 "$f"
  done
}

# sa-kubeconfig OUT [NAMESPACE] [SERVICEACCOUNT]: a kubeconfig holding a
# token of the ServiceAccount that manifests/rbac.yaml binds, so tests run
# vk-sandbox with exactly the shipped permissions.
cmd_sa_kubeconfig() {
  local out=${1:?usage: sa-kubeconfig OUT [NAMESPACE] [SERVICEACCOUNT]}
  local ns=${2:-sandbox-system} sa=${3:-vk-sandbox}
  readyz >/dev/null || die "the cluster is not up; run e2e/cluster.sh up"
  kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns" >/dev/null
  kubectl apply --server-side -f "$root/manifests/rbac.yaml" >/dev/null
  local token
  token=$(kubectl -n "$ns" create token "$sa" --duration 48h)
  kubeconfig_file "$out" "$ns-$sa" "    token: $token"
  echo "$out"
}

# ---------------------------------------------------------------- audit apiserver
# A second apiserver for benchmarks: clients pointed at it are the only ones
# in its audit log, so their requests can be counted by verb and resource
# while the main apiserver keeps serving everybody else.
audit_readyz() {
  curl -fsS --max-time 2 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$audit_port/readyz" 2>/dev/null
}

cmd_audit_apiserver() {
  local name=kube-apiserver-audit pid
  case "${1:-status}" in
    up)
      readyz >/dev/null || die "the cluster is not up; run e2e/cluster.sh up"
      if pid_alive "$name" && audit_readyz >/dev/null; then
        log "audit apiserver already up on https://127.0.0.1:$audit_port"
      else
        mkdir -p "$audit_dir" "$logs" "$run"
        printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' \
          'omitStages: [RequestReceived]' 'rules:' '- level: Metadata' > "$audit_dir/policy.yaml"
        log "starting an audit apiserver on 127.0.0.1:$audit_port (log $audit_dir/audit.log)"
        shared_apiserver_args "$audit_port"
        (detach "$bin/kube-apiserver" "${apiserver_args[@]}" \
          --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
          --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
          --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
          --requestheader-allowed-names front-proxy-client \
          --requestheader-username-headers X-Remote-User \
          --requestheader-group-headers X-Remote-Group \
          --requestheader-extra-headers-prefix X-Remote-Extra- \
          --proxy-client-cert-file "$pki/front-proxy-client.crt" \
          --proxy-client-key-file "$pki/front-proxy-client.key" \
          --default-not-ready-toleration-seconds "$toleration" \
          --default-unreachable-toleration-seconds "$toleration" \
          --allow-privileged=true --profiling=false \
          --feature-gates APIServerIdentity=false,UnknownVersionInteroperabilityProxy=false \
          --audit-policy-file "$audit_dir/policy.yaml" \
          --audit-log-path "$audit_dir/audit.log" --audit-log-format json \
          --audit-log-mode blocking --audit-log-maxsize 500 --audit-log-maxbackup 1) \
          >"$logs/$name.log" 2>&1 < /dev/null &
        echo $! > "$run/$name.pid"
        wait_for "audit apiserver" 60 audit_readyz
      fi
      echo "https://127.0.0.1:$audit_port $audit_dir/audit.log"
      ;;
    down)
      if [[ -f "$run/$name.pid" ]]; then
        pid=$(cat "$run/$name.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$run/$name.pid"
      fi
      log "audit apiserver down"
      ;;
    status)
      if pid_alive "$name" && audit_readyz >/dev/null; then
        echo "audit apiserver: ready at https://127.0.0.1:$audit_port, log $audit_dir/audit.log"
      else
        echo "audit apiserver: stopped"
      fi
      ;;
    *) die "usage: audit-apiserver up|down|status" ;;
  esac
}

# ---------------------------------------------------------------- scratch apiserver
cmd_scratch_apiserver() {
  local action=${1:-} name=${2:-} port=${3:-}
  [[ "$name" =~ ^[a-z0-9-]+$ ]] || die "usage: scratch-apiserver up NAME PORT | down NAME (NAME: a-z, 0-9, -)"
  local sdir="$dir/scratch/$name" pname="kube-apiserver-scratch-$name" prefix="/scratch-$name"
  case "$action" in
    up)
      [[ "$port" =~ ^[0-9]+$ ]] || die "scratch-apiserver up NAME PORT: PORT must be a number"
      mkdir -p "$sdir" "$logs" "$run"
      write_kubeconfig "$sdir/admin.kubeconfig" admin "$pki/admin.crt" "$pki/admin.key"
      sed -i "s|server: https://127.0.0.1:$api_port|server: https://127.0.0.1:$port|" "$sdir/admin.kubeconfig"
      if ! pid_alive "$pname"; then
        log "starting a scratch apiserver $name on 127.0.0.1:$port (etcd prefix $prefix)"
        shared_apiserver_args "$port"
        (detach "$bin/kube-apiserver" "${apiserver_args[@]}" --etcd-prefix "$prefix" \
          --allow-privileged=true --profiling=false \
          --feature-gates APIServerIdentity=false,UnknownVersionInteroperabilityProxy=false) \
          >"$logs/$pname.log" 2>&1 < /dev/null &
        echo $! > "$run/$pname.pid"
      fi
      wait_for "scratch apiserver $name" 90 \
        curl -fsS --max-time 2 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
        "https://127.0.0.1:$port/readyz"
      echo "$sdir/admin.kubeconfig"
      ;;
    down)
      if [[ -f "$run/$pname.pid" ]]; then
        local pid
        pid=$(cat "$run/$pname.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$run/$pname.pid"
      fi
      # Its keys, through etcd's JSON gateway: [prefix/, prefix0).
      local from to
      from=$(printf '%s/' "$prefix" | base64 -w0)
      to=$(printf '%s0' "$prefix" | base64 -w0)
      curl -fsS --max-time 10 -X POST "http://127.0.0.1:$etcd_port/v3/kv/deleterange" \
        -d "{\"key\":\"$from\",\"range_end\":\"$to\"}" >/dev/null 2>&1 ||
        log "could not delete the scratch apiserver's keys under $prefix (etcd unreachable?)"
      rm -rf "$sdir"
      log "scratch apiserver $name down"
      ;;
    *) die "usage: scratch-apiserver up NAME PORT | down NAME" ;;
  esac
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  logs) cmd_logs ;;
  sa-kubeconfig) shift; cmd_sa_kubeconfig "$@" ;;
  audit-apiserver) shift; cmd_audit_apiserver "$@" ;;
  scratch-apiserver) shift; cmd_scratch_apiserver "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  kubeconfig) echo "$admin_kubeconfig" ;;
  bin) echo "$bin" ;;
  vk-audit-log) echo "$vk_audit_log" ;;
  *) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
