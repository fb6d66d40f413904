#!/usr/bin/env bash
# Checks what ships beside the binary (run by e2e/run-tests.sh, so by
# `make test`; `make check-packaging` runs it alone):
#
#   manifests  every YAML under manifests/ (recursively), one document at
#              a time, passes `kubectl apply --server-side --dry-run=server
#              --validate=strict` on the cluster of VK_TEST_KUBECONFIG,
#              after the CRDs in crds/ and the upstream agent-sandbox CRDs
#              (e2e/agent-sandbox.sh crds) are applied and the namespace
#              sandbox-system is created for real (all left in place);
#              objects without a namespace go to the scratch namespace
#              vk-packaging-check. manifests/examples/ must validate
#              against the upstream CRDs: a kind there that the cluster
#              does not serve fails. Elsewhere, objects whose kind the
#              cluster does not serve (e.g. PodMonitor) are skipped with a
#              note. Where upstream cannot be fetched (and without
#              VK_REQUIRE_REAL_CONTROLLER=1) the examples are skipped with
#              a note saying so.
#   systemd    packaging/vk-sandbox.service passes `systemd-analyze verify`
#              with no warning (a copy whose ExecStart names a built
#              binary); packaging/env.example only sets variables that
#              `vk-sandbox --help` lists (plus RUST_LOG) and sets every one
#              a systemd install needs (node name and IP, listen address,
#              sandboxd URL and token file, state path).
#   static     the static musl binary (the one the Dockerfile copies) is
#              statically linked and prints --version; run as UID/GID 65532
#              (setpriv, needs root) it writes its claims file into a
#              directory 65532 owns, and refuses to start, naming the
#              state path, when the directory is not writable (also with
#              the default /var/lib/vk-sandbox/claims.json, as in the
#              distroless image).
#   scripts    every e2e/ shell script passes `bash -n` and, when installed,
#              `shellcheck -S warning`.
#   image      the Dockerfile's final stage is built without a container
#              engine (e2e/image/build.sh: FROM scratch + the distroless-
#              style base of e2e/image/rootfs.sh + the static binary) and
#              inspected: user 65532, entrypoint, nonroot, CA bundle,
#              zoneinfo, os-release, no shell; its size is reported.
#              .dockerignore keeps target/ and .cache/ out of the context.
#   chart      the Helm chart charts/vk-sandbox (e2e/check-chart.sh: helm
#              lint, kubeconform -strict, helm-unittest, promtool, the
#              chart against the kustomize base, the values schema's
#              refusals, and each check failing on a broken copy)
#
# Usage: e2e/check-packaging.sh [manifests|systemd|static|scripts|image|chart ...]
#        (default: all). Environment:
#   VK_TEST_KUBECONFIG  kubeconfig of the cluster for `manifests` (required)
#   VK_K8S_BIN_DIR      where kubectl is (default: e2e/cluster.sh bin)
#   VK_STATIC_BIN       the static binary for `static` (default: build it
#                       with `make GOOS=linux GOARCH=amd64 build`, which is
#                       a no-op when up to date)
#   VK_HOST_BIN         a binary for `systemd` (default target/debug/vk-sandbox,
#                       built if missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

log() { echo "packaging: $*"; }
fail() { echo "packaging: FAIL: $*" >&2; failures=$((failures + 1)); }
die() { echo "packaging: error: $*" >&2; exit 1; }

failures=0
work=$(mktemp -d /tmp/vk-packaging.XXXXXX)
chmod 0755 "$work"
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------------- manifests
# Splits a multi-document YAML file into $2/doc-N.yaml (documents with no
# top-level kind, e.g. comment-only ones, are dropped).
split_docs() {
  local file=$1 out=$2
  awk -v out="$out" '
    function next_doc() { n++; f = sprintf("%s/doc-%03d.yaml", out, n) }
    BEGIN { n = 0; next_doc() }
    /^---/ { next_doc(); next }
    { print > f }
  ' "$file"
  local d
  for d in "$out"/doc-*.yaml; do
    [[ -e "$d" ]] || continue
    grep -qE '^kind:' "$d" || rm -f "$d"
  done
}

top_field() { sed -nE "s/^$1:[[:space:]]*\"?([^\"#[:space:]]+)\"?.*/\\1/p" "$2" | head -1; }

# metadata.namespace of a document ("" when absent).
doc_namespace() {
  awk '
    /^metadata:/ { in_meta = 1; next }
    /^[^[:space:]#]/ { in_meta = 0 }
    in_meta && /^  namespace:/ { sub(/^  namespace:[[:space:]]*/, ""); gsub(/["\047]/, ""); sub(/[[:space:]#].*/, ""); print; exit }
  ' "$1"
}

check_manifests() {
  local kubeconfig=${VK_TEST_KUBECONFIG:-}
  [[ -n "$kubeconfig" ]] || die "manifests: VK_TEST_KUBECONFIG is not set (run \`make test\`, or export the kubeconfig \`e2e/cluster.sh up\` prints)"
  [[ -r "$kubeconfig" ]] || die "manifests: cannot read VK_TEST_KUBECONFIG=$kubeconfig"
  local bindir=${VK_K8S_BIN_DIR:-$("$here/cluster.sh" bin)}
  [[ -x "$bindir/kubectl" ]] || die "manifests: no kubectl in $bindir (run \`make deps\`)"
  k() { "$bindir/kubectl" --kubeconfig "$kubeconfig" "$@"; }

  # The CRDs stay installed, as the e2e tests leave them (deleting them
  # could race a test on the same cluster that has just installed one).
  log "manifests: applying crds/ and namespace sandbox-system (for real)"
  k apply --server-side --force-conflicts --field-manager=vk-sandbox-packaging-check -f crds/ >/dev/null
  k wait --for=condition=Established --timeout=60s -f crds/ >/dev/null
  # The examples are for upstream agent-sandbox: validated against its CRDs.
  local upstream=true upstream_out upstream_status=0
  upstream_out=$("$here/agent-sandbox.sh" crds "$kubeconfig" 2>&1) || upstream_status=$?
  case $upstream_status in
    0) log "manifests: upstream agent-sandbox CRDs applied" ;;
    3) upstream=false; log "manifests: note: $upstream_out; manifests/examples/ cannot be validated" ;;
    *) fail "manifests: applying the upstream agent-sandbox CRDs: $upstream_out"; upstream=false ;;
  esac
  local scratch=vk-packaging-check
  for ns in sandbox-system "$scratch"; do
    k get namespace "$ns" >/dev/null 2>&1 || k create namespace "$ns" >/dev/null
  done

  # "apiVersion kind" of everything the cluster serves (KIND is the last
  # column, APIVERSION the third from last; SHORTNAMES may be empty).
  local served
  served=$(k api-resources --no-headers | awk '{print $(NF-2), $NF}')

  local files=() file
  while IFS= read -r -d '' file; do files+=("$file"); done \
    < <(find manifests -type f \( -name '*.yaml' -o -name '*.yml' \) -not -name kustomization.yaml -print0 | sort -z)
  ((${#files[@]})) || die "manifests: no YAML under manifests/"

  local applied=0 skipped=0 i=0 doc api kind name ns out
  for file in "${files[@]}"; do
    i=$((i + 1))
    mkdir -p "$work/m$i"
    split_docs "$file" "$work/m$i"
    for doc in "$work/m$i"/doc-*.yaml; do
      [[ -e "$doc" ]] || continue
      api=$(top_field apiVersion "$doc"); kind=$(top_field kind "$doc")
      name=$(awk '/^metadata:/{m=1;next} /^[^[:space:]#]/{m=0} m&&/^  name:/{print $2; exit}' "$doc")
      if [[ -z "$api" || -z "$kind" ]]; then
        fail "$file: a document without apiVersion/kind"; continue
      fi
      if [[ "$file" == manifests/examples/* ]] && ! $upstream; then
        log "manifests: note: skipped $file $kind/$name: no upstream agent-sandbox CRDs here (see above)"
        skipped=$((skipped + 1)); continue
      fi
      if ! grep -qxF "$api $kind" <<<"$served"; then
        if [[ "$file" == manifests/examples/* ]]; then
          fail "$file $kind/$name: the cluster does not serve $kind in $api, although the upstream agent-sandbox CRDs are installed"
          continue
        fi
        log "manifests: note: skipped $file $kind/$name: the cluster does not serve $kind in $api (its CRD is not installed here)"
        skipped=$((skipped + 1)); continue
      fi
      ns=$(doc_namespace "$doc")
      local nsflag=()
      [[ -n "$ns" ]] || nsflag=(-n "$scratch")
      if out=$(k apply --server-side --force-conflicts --field-manager=vk-sandbox-packaging-check --dry-run=server --validate=strict "${nsflag[@]}" -f "$doc" 2>&1); then
        log "manifests: ok $file: $out"
        applied=$((applied + 1))
      else
        fail "$file $kind/$name: server-side dry-run: $out"
      fi
    done
  done
  log "manifests: $applied object(s) accepted by server-side dry-run, $skipped skipped"

  # manifests/ as a kustomize base (what an overlay builds on): exactly
  # rbac.yaml and daemonset.yaml.
  local built want got
  if built=$(k kustomize manifests 2>&1); then
    want=$(cat manifests/rbac.yaml manifests/daemonset.yaml | grep -cE '^kind:')
    got=$(grep -cE '^kind:' <<<"$built")
    if [[ "$want" == "$got" ]]; then
      log "manifests: kubectl kustomize manifests/ builds the $got objects of rbac.yaml and daemonset.yaml"
    else
      fail "manifests: kubectl kustomize manifests/ builds $got objects, rbac.yaml and daemonset.yaml hold $want"
    fi
  else
    fail "manifests: kubectl kustomize manifests/: $built"
  fi

  # The Pod Security level the DaemonSet needs (the manifest and README
  # say privileged): the apiserver's warnings for its Pod template in a
  # namespace warning at baseline, and none at privileged.
  local level psa_ns out_psa
  for level in baseline privileged; do
    psa_ns=vk-packaging-psa-$level
    k get namespace "$psa_ns" >/dev/null 2>&1 || k create namespace "$psa_ns" >/dev/null
    k label --overwrite namespace "$psa_ns" "pod-security.kubernetes.io/warn=$level" >/dev/null
    out_psa=$(sed "s/^  namespace: sandbox-system$/  namespace: $psa_ns/" manifests/daemonset.yaml |
      k apply --server-side --dry-run=server --field-manager=vk-sandbox-packaging-check -f - 2>&1) ||
      fail "manifests: the DaemonSet in $psa_ns: $out_psa"
    case $level in
      baseline)
        if grep -q 'would violate PodSecurity "baseline' <<<"$out_psa"; then
          log "manifests: Pod Security baseline would refuse the DaemonSet's Pods: $(grep -o 'would violate.*' <<<"$out_psa" | head -1)"
        else
          fail "manifests: no baseline Pod Security warning for the DaemonSet (is privileged still needed? update the manifest and README): $out_psa"
        fi ;;
      privileged)
        if grep -q 'would violate' <<<"$out_psa"; then
          fail "manifests: the DaemonSet violates even the privileged level: $out_psa"
        else
          log "manifests: Pod Security privileged admits the DaemonSet's Pods (the level manifests/daemonset.yaml asks for)"
        fi ;;
    esac
  done
  ((applied > 0)) || fail "manifests: nothing was validated"
}

# -------------------------------------------------------------- systemd
host_bin() {
  local bin=${VK_HOST_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/vk-sandbox}
  if [[ ! -x "$bin" ]]; then
    # On stderr: stdout is the path.
    log "building $bin" >&2
    cargo build --bin vk-sandbox >&2
  fi
  echo "$bin"
}

check_systemd() {
  command -v systemd-analyze >/dev/null || die "systemd: systemd-analyze not found (Debian package systemd; \`make deps\` installs it)"
  local unit=packaging/vk-sandbox.service env=packaging/env.example bin
  [[ -f "$unit" ]] || die "systemd: $unit is missing"
  [[ -f "$env" ]] || die "systemd: $env is missing"
  bin=$(host_bin)

  grep -qE '^ExecStart=/usr/local/bin/vk-sandbox($|[[:space:]])' "$unit" \
    || fail "$unit: ExecStart must run /usr/local/bin/vk-sandbox (the installed path)"
  local want
  for want in 'After=.*sandboxd\.service' 'Wants=.*sandboxd\.service' \
    'AssertPathExists=/etc/cocoon/kubeconfig' 'AssertPathExists=/etc/vk-sandbox/env' \
    'EnvironmentFile=/etc/vk-sandbox/env' 'Environment=KUBECONFIG=/etc/cocoon/kubeconfig' \
    'WorkingDirectory=/var/lib/vk-sandbox' 'Restart=always' 'RestartSec=5s' 'LimitNOFILE=' \
    'Environment=VK_TLS_CERT=' 'Environment=VK_TLS_KEY='; do
    grep -qE "^$want" "$unit" || fail "$unit: no line matching ^$want"
  done

  # verify needs ExecStart to exist: check a copy that runs the built binary.
  mkdir -p "$work/unit"
  sed "s#^ExecStart=/usr/local/bin/vk-sandbox#ExecStart=$bin#" "$unit" > "$work/unit/vk-sandbox.service"
  local out rc=0
  out=$(systemd-analyze verify "$work/unit/vk-sandbox.service" 2>&1) || rc=$?
  # verify exits 0 on keys it ignores ("Unknown key", "Failed to parse"):
  # any output at all is a failure.
  if ((rc != 0)) || [[ -n "$out" ]]; then
    fail "$unit: systemd-analyze verify (rc=$rc): $out"
  else
    log "systemd: systemd-analyze verify $unit: clean"
  fi

  # env.example: KEY=value lines only, keys the binary knows.
  local known line key
  known=$("$bin" --help | grep -oE 'env: [A-Z0-9_]+' | awk '{print $2}' | sort -u)
  known+=$'\nRUST_LOG'
  while IFS= read -r line; do
    line=${line#\#}
    [[ "$line" =~ ^([A-Z][A-Z0-9_]*)= ]] || continue
    key=${BASH_REMATCH[1]}
    grep -qxF "$key" <<<"$known" || fail "$env: $key is not a variable vk-sandbox reads (see vk-sandbox --help)"
  done < "$env"
  while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    [[ "$line" =~ ^[A-Z][A-Z0-9_]*=.*$ ]] || fail "$env: not a KEY=value line: $line"
  done < "$env"
  for key in VK_NODE_NAME VK_NODE_IP VK_LISTEN_ADDR SANDBOXD_URL SANDBOXD_TOKEN_FILE VK_STATE_PATH; do
    grep -qE "^$key=" "$env" || fail "$env: $key is not set (a systemd install needs it)"
  done
  log "systemd: $env: variables checked against vk-sandbox --help"
}

# ------------------------------------------------------- systemd start
# The unit's start as systemd performs it, as far as a machine without
# systemd as PID 1 allows: its AssertPathExists= lines, then ExecStart run
# with exactly the unit's environment (Environment= lines, then the
# EnvironmentFile= over them), in its WorkingDirectory, as its User, with
# its StateDirectory= made first (mode StateDirectoryMode=). It runs in a
# private mount namespace whose /etc, /var/lib and /usr/local/bin are
# overlays, so nothing on the host changes. Three starts:
#   no env file          refused by the unit (Assertion failed)
#   no kubeconfig        refused by the unit; run anyway, the binary
#                        itself refuses, naming the missing credentials
#   both present         the static binary (what /usr/local/bin/vk-sandbox
#                        is in a release) starts as the unit's User in the
#                        state directory, writes claims.json there (0600),
#                        then stops at the unreachable apiserver
unit_value() { sed -nE "s/^$1=(.*)$/\1/p" "$2"; }

check_systemd_start() {
  command -v unshare >/dev/null || die "systemd start: unshare not found (Debian package util-linux)"
  if [[ $(id -u) -ne 0 ]]; then
    log "systemd start: SKIP: it needs root (a private mount namespace); running as UID $(id -u)"
    return
  fi
  local unit=packaging/vk-sandbox.service bin=${VK_STATIC_BIN:-$root/target/check-packaging/vk-sandbox-static}
  if [[ ! -x "$bin" ]]; then
    mkdir -p "$(dirname "$bin")"
    VK_MUSL_PROFILE=dev "$here/musl-build.sh" x86_64-unknown-linux-musl "$bin" >&2
  fi
  local exec_start env_file workdir user state_dir state_mode
  exec_start=$(unit_value ExecStart "$unit")
  env_file=$(unit_value EnvironmentFile "$unit")
  [[ "$env_file" != -* ]] || fail "$unit: EnvironmentFile=$env_file is optional ('-'): a missing env file must fail the start"
  workdir=$(unit_value WorkingDirectory "$unit")
  user=$(unit_value User "$unit")
  state_dir=/var/lib/$(unit_value StateDirectory "$unit")
  state_mode=$(unit_value StateDirectoryMode "$unit")
  [[ "$exec_start" == /usr/local/bin/vk-sandbox ]] || fail "$unit: ExecStart=$exec_start (expected /usr/local/bin/vk-sandbox without flags)"
  local d=$work/unit-start
  mkdir -p "$d"
  chmod 0755 "$d"
  cp "$bin" "$d/vk-sandbox"
  # The operator's edit of the template: its placeholders filled in.
  sed -e 's/^VK_NODE_NAME=.*/VK_NODE_NAME=vk-packaging-unit-check-sandboxd/' \
    -e 's/^VK_NODE_IP=.*/VK_NODE_IP=127.0.0.1/' \
    -e "s/^VK_LISTEN_ADDR=.*/VK_LISTEN_ADDR=127.0.0.1:$(free_port)/" \
    -e "s/^#VK_ADMIN_ADDR=.*/VK_ADMIN_ADDR=127.0.0.1:$(free_port)/" \
    -e 's|^SANDBOXD_URL=.*|SANDBOXD_URL=http://127.0.0.1:1|' packaging/env.example > "$d/env"
  unit_value Environment "$unit" > "$d/unit.env"
  unit_value AssertPathExists "$unit" > "$d/asserts"
  cat > "$d/dead.kubeconfig" <<'EOF'
apiVersion: v1
kind: Config
clusters:
- name: unreachable
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: unreachable
  context: {cluster: unreachable, user: nobody}
users:
- name: nobody
  user: {token: not-a-token}
current-context: unreachable
EOF
  # One start in a private mount namespace. $1: the files that exist
  # ("env", "kubeconfig"); $2 = run-anyway: start the binary although an
  # assertion failed (to see its own refusal).
  cat > "$d/start.sh" <<'EOF'
set -euo pipefail
w=$W
for m in /etc /var/lib /usr/local/bin; do
  # A fresh upper layer per start: nothing carries over from the last.
  n=$w/ov${m//\//_}
  rm -rf "$n"
  mkdir -p "$n/up" "$n/work"
  mount -t overlay overlay -o "lowerdir=$m,upperdir=$n/up,workdir=$n/work" "$m"
done
install -m 0755 "$w/vk-sandbox" /usr/local/bin/vk-sandbox
case " $1 " in *" env "*)
  install -d -m 0700 "$(dirname "$ENV_FILE")"
  install -m 0644 "$w/env" "$ENV_FILE"
  printf '%s' token > /etc/vk-sandbox/sandboxd-token
  chmod 0600 /etc/vk-sandbox/sandboxd-token ;;
esac
case " $1 " in *" kubeconfig "*)
  install -d /etc/cocoon
  install -m 0600 "$w/dead.kubeconfig" /etc/cocoon/kubeconfig ;;
esac
while IFS= read -r p; do
  if [[ ! -e "$p" ]]; then
    echo "Assertion failed: AssertPathExists=$p"
    [[ "$2" == run-anyway ]] || exit 90
  fi
done < "$w/asserts"
rm -rf "$STATE_DIR"
install -d -m "$STATE_MODE" "$STATE_DIR"
cd "$WORKDIR"
vars=()
while IFS= read -r kv; do vars+=("$kv"); done < "$w/unit.env"
if [[ -f "$ENV_FILE" ]]; then
  while IFS= read -r kv; do
    [[ -z "$kv" || "$kv" == \#* ]] && continue
    vars+=("$kv")
  done < "$ENV_FILE"
fi
set +e
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${vars[@]}" NO_COLOR=1 \
  timeout 30 setpriv --reuid "$UNIT_USER" --regid "$UNIT_USER" --init-groups $EXEC_START
echo "exit $?"
stat -c 'state %U:%G %a' "$STATE_DIR" "$STATE_DIR/claims.json" 2>/dev/null || true
EOF
  start_unit() {
    W=$d ENV_FILE=$env_file STATE_DIR=$state_dir STATE_MODE=$state_mode WORKDIR=$workdir \
      UNIT_USER=$user EXEC_START=$exec_start \
      unshare --mount --propagation private bash "$d/start.sh" "$1" "${2:-}" 2>&1 || true
  }
  local out
  out=$(start_unit "kubeconfig")
  if grep -q "Assertion failed: AssertPathExists=$env_file" <<<"$out" && ! grep -q '^exit' <<<"$out"; then
    log "systemd start: without $env_file the unit refuses to start (AssertPathExists)"
  else
    fail "systemd start: without $env_file: $(tail -3 <<<"$out")"
  fi
  out=$(start_unit "env" run-anyway)
  if grep -q 'Assertion failed: AssertPathExists=/etc/cocoon/kubeconfig' <<<"$out" &&
    grep -q 'no Kubernetes credentials' <<<"$out" && ! grep -q '^exit 0$' <<<"$out"; then
    log "systemd start: without /etc/cocoon/kubeconfig the unit refuses; the binary started anyway refuses too: $(grep -m1 -o 'no Kubernetes credentials[^;]*' <<<"$out")"
  else
    fail "systemd start: without the kubeconfig: $(tail -5 <<<"$out")"
  fi
  out=$(start_unit "env kubeconfig")
  if grep -q "^state root:root ${state_mode#0}$" <<<"$out" && grep -q '^state root:root 600$' <<<"$out" &&
    ! grep -qE 'not writable|Assertion failed' <<<"$out"; then
    log "systemd start: with both files ExecStart runs as $user in $workdir with the unit's environment, writes claims.json (0600) in $state_dir (mode $state_mode), then stops at the unreachable apiserver ($(grep '^exit' <<<"$out"))"
  else
    fail "systemd start: with both files: $(tail -8 <<<"$out")"
  fi
}

# --------------------------------------------------------------- static
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

check_static() {
  local bin=${VK_STATIC_BIN:-}
  if [[ -z "$bin" ]]; then
    # The same target, linker and flags as the release build, without its
    # LTO (much slower on small CI machines); linkage is what is checked.
    log "static: musl build of vk-sandbox (dev profile; a no-op when up to date)"
    bin=$root/target/check-packaging/vk-sandbox-static
    mkdir -p "$(dirname "$bin")"
    VK_MUSL_PROFILE=dev "$here/musl-build.sh" x86_64-unknown-linux-musl "$bin" >&2
  fi
  [[ -x "$bin" ]] || die "static: $bin is not an executable"
  local desc
  desc=$(file -b "$bin")
  if [[ "$desc" == *"statically linked"* || "$desc" == *"static-pie linked"* ]]; then
    log "static: file: $desc"
  else
    fail "static: $bin is not statically linked: $desc"
  fi
  local ldd_out
  ldd_out=$(ldd "$bin" 2>&1 || true)
  if [[ "$ldd_out" == *"not a dynamic executable"* || "$ldd_out" == *"statically linked"* ]]; then
    log "static: ldd: $(echo "$ldd_out" | head -1 | sed 's/^[[:space:]]*//')"
  else
    fail "static: ldd lists shared libraries for $bin: $ldd_out"
  fi
  local version
  version=$("$bin" --version) || fail "static: $bin --version failed"
  [[ "$version" =~ ^vk-sandbox\ .+\ \(rev=[^\ ]+\ built=[^\ ]+\)$ ]] \
    || fail "static: unexpected --version output: $version"
  log "static: --version: $version"

  if [[ $(id -u) -ne 0 ]]; then
    log "static: SKIP the UID 65532 checks: they need root for setpriv (running as UID $(id -u))"
    return
  fi
  command -v setpriv >/dev/null || die "static: setpriv not found (Debian package util-linux)"

  # The image's user; a copy of the binary it can execute, an unreachable
  # apiserver (so nothing touches a real cluster), free ports.
  local d=$work/uid
  mkdir -p "$d/writable" "$d/readonly"
  chmod 0755 "$d" "$d/readonly"
  chown 65532:65532 "$d/writable"
  chmod 0700 "$d/writable"
  cp "$bin" "$d/vk-sandbox"
  chmod 0755 "$d/vk-sandbox"
  cat > "$d/kubeconfig" <<'EOF'
apiVersion: v1
kind: Config
clusters:
- name: unreachable
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: unreachable
  context: {cluster: unreachable, user: nobody}
users:
- name: nobody
  user: {token: not-a-token}
current-context: unreachable
EOF
  chmod 0644 "$d/kubeconfig"
  as_65532() {
    # $1 = VK_STATE_PATH ("" = the default); output in $d/out, status returned.
    local state=$1
    (cd "$d" && env -i PATH=/usr/bin:/bin HOME="$d" KUBECONFIG="$d/kubeconfig" \
      VK_STATE_PATH="$state" VK_NODE_NAME=vk-packaging-uid-check \
      VK_LISTEN_ADDR="127.0.0.1:$(free_port)" VK_ADMIN_ADDR="127.0.0.1:$(free_port)" \
      SANDBOXD_URL=http://127.0.0.1:1 VK_LOG_FORMAT=text NO_COLOR=1 \
      timeout 30 setpriv --reuid 65532 --regid 65532 --clear-groups ./vk-sandbox) >"$d/out" 2>&1
  }

  local rc=0
  as_65532 "$d/writable/claims.json" || rc=$?
  local owner
  owner=$(stat -c '%u:%g %a' "$d/writable/claims.json" 2>/dev/null || true)
  if grep -q 'not writable' "$d/out"; then
    fail "static: as UID 65532 with a writable state dir it refused the state path: $(tail -3 "$d/out")"
  elif [[ "$owner" != "65532:65532 600" ]]; then
    fail "static: as UID 65532 with a writable state dir no claims file was written (owner/mode '$owner', rc=$rc): $(tail -3 "$d/out")"
  else
    log "static: UID 65532, writable state dir: claims.json written ($owner), then stopped at the unreachable apiserver as expected (rc=$rc)"
  fi

  rc=0
  as_65532 "$d/readonly/claims.json" || rc=$?
  if ((rc != 0)) && grep -q 'claims state is not writable' "$d/out" && grep -q "$d/readonly" "$d/out"; then
    log "static: UID 65532, root-owned 0755 state dir: refused (rc=$rc): $(grep -m1 '^vk-sandbox:' "$d/out")"
  else
    fail "static: UID 65532, unwritable state dir: expected a refusal naming the state path, got rc=$rc: $(tail -3 "$d/out")"
  fi
  [[ ! -e "$d/readonly/claims.json" ]] || fail "static: a claims file appeared in the unwritable dir"

  if [[ -e /var/lib/vk-sandbox ]]; then
    log "static: note: /var/lib/vk-sandbox exists on this machine; the default-path refusal is not checked"
  else
    rc=0
    as_65532 "" || rc=$?
    if ((rc != 0)) && grep -q 'claims state is not writable: mkdir state dir /var/lib/vk-sandbox' "$d/out"; then
      log "static: UID 65532, default state path (the distroless case): refused (rc=$rc)"
    else
      fail "static: UID 65532 with the default state path: expected 'mkdir state dir /var/lib/vk-sandbox' refusal, got rc=$rc: $(tail -3 "$d/out")"
    fi
  fi
}

# -------------------------------------------------------------- scripts
check_scripts() {
  local f n=0
  while IFS= read -r -d '' f; do
    bash -n "$f" || fail "$f: bash -n"
    n=$((n + 1))
  done < <(find e2e -name '*.sh' -not -path '*/target/*' -print0)
  log "scripts: bash -n on $n script(s)"
  if command -v shellcheck >/dev/null; then
    local out
    if out=$(find e2e -name '*.sh' -not -path '*/target/*' -print0 | xargs -0 shellcheck -S warning 2>&1); then
      log "scripts: shellcheck -S warning: clean"
    else
      fail "scripts: shellcheck -S warning: $out"
    fi
  else
    log "scripts: note: shellcheck not installed (Debian package shellcheck; \`make deps\` installs it), skipped"
  fi
}

# --------------------------------------------------------------- image
# The image is built from the Dockerfile without a container engine
# (e2e/image/build.sh reads its final stage: FROM scratch + COPY of what
# e2e/image/rootfs.sh and e2e/musl-build.sh make), then inspected: user
# 65532, the static binary as entrypoint, nonroot in /etc/passwd, CA bundle,
# zoneinfo, os-release, no shell; its size is reported.
check_image() {
  [[ -f Dockerfile ]] || die "image: no Dockerfile at the repository root"
  local final
  final=$(grep -E '^FROM ' Dockerfile | tail -1)
  [[ "$final" == "FROM scratch" ]] || fail "image: the final stage must be FROM scratch (e2e/image/build.sh rebuilds it), got: $final"
  grep -qE '^USER 65532(:65532)?$' Dockerfile || fail "image: no USER 65532 in the Dockerfile"
  grep -qE '^ENTRYPOINT \["/usr/local/bin/vk-sandbox"\]$' Dockerfile \
    || fail "image: ENTRYPOINT must be [\"/usr/local/bin/vk-sandbox\"]"
  local p
  for p in target .cache .git; do
    grep -qxF "$p" .dockerignore 2>/dev/null || fail "image: .dockerignore must exclude $p"
  done
  if [[ $(id -u) -ne 0 ]]; then
    log "image: SKIP building it: e2e/image/rootfs.sh needs root (files owned by 65532); running as UID $(id -u)"
    return
  fi
  local bin=${VK_STATIC_BIN:-$root/target/check-packaging/vk-sandbox-static}
  if [[ ! -x "$bin" ]]; then
    mkdir -p "$(dirname "$bin")"
    VK_MUSL_PROFILE=dev "$here/musl-build.sh" x86_64-unknown-linux-musl "$bin" >&2
  fi
  # Without debug info, as the release profile strips it.
  strip --strip-debug -o "$work/image-bin" "$bin" || die "image: strip --strip-debug $bin failed (binutils)"
  local out=$work/image.tar x=$work/image cfg layer
  if ! VK_IMAGE_BINARY=$work/image-bin "$here/image/build.sh" product "$out" vk-sandbox:packaging-check 2>"$work/image.log"; then
    fail "image: e2e/image/build.sh product: $(tail -5 "$work/image.log")"
    return
  fi
  mkdir -p "$x/rootfs"
  tar -xf "$out" -C "$x"
  cfg=$x/$(jq -r '.[0].Config' "$x/manifest.json")
  for layer in $(jq -r '.[0].Layers[]' "$x/manifest.json"); do tar -xf "$x/$layer" -C "$x/rootfs"; done
  [[ "$(jq -r '.config.User' "$cfg")" == 65532:65532 ]] || fail "image: config User is $(jq -r '.config.User' "$cfg"), want 65532:65532"
  [[ "$(jq -c '.config.Entrypoint' "$cfg")" == '["/usr/local/bin/vk-sandbox"]' ]] || fail "image: Entrypoint is $(jq -c '.config.Entrypoint' "$cfg")"
  grep -qx 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' "$x/rootfs/etc/passwd" || fail "image: /etc/passwd has no nonroot 65532"
  grep -q 'BEGIN CERTIFICATE' "$x/rootfs/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || fail "image: no CA bundle"
  [[ -f "$x/rootfs/usr/share/zoneinfo/Europe/Berlin" ]] || fail "image: no zoneinfo"
  grep -q '^ID=debian' "$x/rootfs/etc/os-release" 2>/dev/null || fail "image: no os-release"
  [[ ! -e "$x/rootfs/bin/sh" ]] || fail "image: has a shell (/bin/sh)"
  file -b "$x/rootfs/usr/local/bin/vk-sandbox" | grep -qE 'statically linked|static-pie linked' || fail "image: the entrypoint is not static"
  local size gz
  size=$(jq -r '.[0].Layers[]' "$x/manifest.json" | (cd "$x" && xargs du -cb) | tail -1 | cut -f1)
  gz=$(for layer in $(jq -r '.[0].Layers[]' "$x/manifest.json"); do gzip -c "$x/$layer"; done | wc -c)
  log "image: built from the Dockerfile's final stage without a container engine: user 65532, static entrypoint, nonroot, CA bundle, zoneinfo, os-release, no shell; $((size / 1024)) KiB in layers, $((gz / 1024)) KiB gzipped (the dev-profile binary without debug info; release is optimised and smaller)"
}

check_chart() {
  "$here/check-chart.sh" || fail "chart: e2e/check-chart.sh failed (see above)"
}

sections=("$@")
((${#sections[@]})) || sections=(scripts image systemd manifests static chart)
for s in "${sections[@]}"; do
  case "$s" in
    manifests) check_manifests ;;
    systemd) check_systemd; check_systemd_start ;;
    static) check_static ;;
    scripts) check_scripts ;;
    image) check_image ;;
    chart) check_chart ;;
    *) die "unknown section '$s' (manifests, systemd, static, scripts, image, chart)" ;;
  esac
done
if ((failures)); then
  echo "packaging: $failures check(s) failed" >&2
  exit 1
fi
log "all checks passed (${sections[*]})"
