#!/usr/bin/env bash
# Builds the local Kubernetes control plane (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl) from their Go modules into
# .cache/k8s-<version>/bin. A stamp file makes a warm rebuild a no-op; a
# different version in e2e/k8s-version builds into a new folder.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(tr -d '[:space:]' < "$root/e2e/k8s-version")
out="${VK_K8S_BIN_DIR:-$root/.cache/k8s-$version/bin}"
stamp="$out/.built"
tools=(kube-apiserver kube-scheduler kube-controller-manager kubectl)

want_sum=$(cat "$root/e2e/k8s-version" "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$0" | sha256sum | cut -d' ' -f1)
# Stamps of earlier versions of this script that built the same binaries
# (they differ only in their messages), for the same inputs: a cache they
# built stays valid (the stamp is left as it is for them).
same_build_sums=(
  aabdaf36259f530f47ca5d4b47ac29d0f433b9baac799c407399cede2bb8f474
)
if [[ -f "$stamp" ]]; then
  have_sum=$(cat "$stamp")
  for sum in "$want_sum" "${same_build_sums[@]}"; do
    if [[ "$have_sum" == "$sum" ]]; then
      echo "control plane $version: cached in $out"
      exit 0
    fi
  done
fi

if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is not installed; the local control plane is built from Go modules." >&2
  echo "       install Go (https://go.dev/doc/install or Debian's golang package) and retry." >&2
  exit 1
fi

grep -q "k8s.io/kubernetes $version" "$here/go.mod" || {
  echo "error: e2e/k8s-version says $version but e2e/controlplane/go.mod pins another k8s.io/kubernetes" >&2
  exit 1
}

# shellcheck source=e2e/lib/progress.sh
source "$root/e2e/lib/progress.sh"
mkdir -p "$out"
cd "$here"
progress_start "control plane $version" 6
echo "control plane $version: building into $out (a cold build takes 20-40 minutes on 2 cores)"
progress_step "downloading modules"
go mod download
progress_step "etcd"
progress_heartbeat "still building etcd"
go build -o "$out/etcd" ./etcd
progress_heartbeat_stop
# Stamp the release version, as the Kubernetes release build does.
minor=$(echo "$version" | cut -d. -f2)
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
for t in "${tools[@]}"; do
  progress_step "$t"
  progress_heartbeat "still building $t"
  go build -ldflags "$ldflags" -o "$out/$t" "k8s.io/kubernetes/cmd/$t"
  progress_heartbeat_stop
done
echo "$want_sum" > "$stamp"
progress_summary "built etcd ${tools[*]} into $out"
echo "control plane $version: built in $(progress_elapsed)"
