#!/usr/bin/env bash
# Builds the kubelet of the real node (e2e/real-node.sh) from its Go module
# into .cache/kubelet-<version>/kubelet, the version of e2e/k8s-version (the
# control plane's). A stamp makes a warm rebuild a no-op; prints the path.
#
# Cold: a few minutes on 2 cores when the control plane was just built (they
# share most packages through Go's build cache), longer on an empty cache.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(tr -d '[:space:]' < "$root/e2e/k8s-version")
out="${VK_KUBELET_DIR:-$root/.cache/kubelet-$version}"
bin="$out/kubelet"
stamp="$out/.built"

want_sum=$(cat "$root/e2e/k8s-version" "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -d' ' -f1)
if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want_sum" ]]; then
  echo "kubelet $version: cached in $out" >&2
  echo "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || {
  echo "error: Go is not installed; the real node's kubelet is built from Go modules." >&2
  echo "       install Go (https://go.dev/doc/install or Debian's golang package) and retry." >&2
  exit 1
}
grep -q "k8s.io/kubernetes $version" "$here/go.mod" || {
  echo "error: e2e/k8s-version says $version but e2e/node/go.mod pins another k8s.io/kubernetes" >&2
  exit 1
}

# shellcheck source=e2e/lib/progress.sh
source "$root/e2e/lib/progress.sh"
mkdir -p "$out"
cd "$here"
progress_start "kubelet $version" 2
echo "kubelet $version: building into $out (minutes on 2 cores; cached afterwards)" >&2
progress_step "downloading modules"
go mod download
progress_step "kubelet"
progress_heartbeat "still building the kubelet"
# The release version stamped as the control plane's build does.
minor=$(echo "$version" | cut -d. -f2)
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
go build -ldflags "$ldflags" -o "$bin.tmp" k8s.io/kubernetes/cmd/kubelet
progress_heartbeat_stop
mv "$bin.tmp" "$bin"
echo "$want_sum" > "$stamp"
progress_summary "built $bin"
echo "$bin"
