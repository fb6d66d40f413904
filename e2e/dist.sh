#!/usr/bin/env bash
# Release archives (what `make dist` runs):
#
#   e2e/dist.sh [amd64] [arm64]      (default: both)
#
# For each architecture: the static musl binary (`make GOOS=linux
# GOARCH=<arch> build`), packed with the systemd unit, the environment
# template, the manifests and the README into
# dist/vk-sandbox_Linux_<x86_64|arm64>.tar.gz. The archive has no top
# directory, so the README's installation commands work right after
# `tar xz`: ./vk-sandbox, ./packaging/vk-sandbox.service,
# ./packaging/env.example, ./manifests/…, ./README.md, ./SHA256SUMS (of the
# files inside). The Helm chart is packed beside them with `helm package`
# (e2e/helm-tools.sh builds helm): dist/vk-sandbox-<chart version>.tgz, the
# file `helm push dist/vk-sandbox-<version>.tgz oci://ghcr.io/cocoonstack/charts`
# publishes. dist/checksums.txt holds the SHA-256 of the archives and the
# chart.
#
# VK_DIST_NO_BUILD=1 packs the ./vk-sandbox-linux-<arch> binaries already
# built instead of running the build.
#
# Archives are reproducible for one commit: sorted entries, root-owned,
# mtime = the commit time, gzip without a timestamp.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

die() { echo "dist: error: $*" >&2; exit 1; }
log() { echo "dist: $*"; }

archs=("$@")
((${#archs[@]})) || archs=(amd64 arm64)
for cmd in tar gzip sha256sum file; do
  command -v "$cmd" >/dev/null || die "$cmd not found"
done
for f in packaging/vk-sandbox.service packaging/env.example README.md; do
  [[ -f "$f" ]] || die "$f is missing"
done
[[ -d manifests ]] || die "manifests/ is missing"

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
mkdir -p dist
stage_root=$(mktemp -d)
trap 'rm -rf "$stage_root"' EXIT

built=()
for arch in "${archs[@]}"; do
  case "$arch" in
    amd64) uname_arch=x86_64; want='x86-64' ;;
    arm64) uname_arch=arm64; want='ARM aarch64' ;;
    *) die "unknown architecture '$arch' (amd64 or arm64)" ;;
  esac
  bin=./vk-sandbox-linux-$arch
  if [[ -n "${VK_DIST_NO_BUILD:-}" ]]; then
    [[ -x "$bin" ]] || die "VK_DIST_NO_BUILD is set but $bin is missing (make GOOS=linux GOARCH=$arch build)"
    log "packing the existing $bin (VK_DIST_NO_BUILD)"
  else
    log "building the static $arch binary"
    make --no-print-directory GOOS=linux GOARCH="$arch" build
  fi
  desc=$(file -b "$bin")
  [[ "$desc" == *"$want"* ]] || die "$bin is not a $want binary: $desc"
  [[ "$desc" == *"statically linked"* || "$desc" == *"static-pie linked"* ]] || die "$bin is not static: $desc"

  name=vk-sandbox_Linux_$uname_arch
  stage=$stage_root/$name
  mkdir -p "$stage/packaging"
  chmod 0755 "$stage" "$stage/packaging"
  install -m 0755 "$bin" "$stage/vk-sandbox"
  install -m 0644 packaging/vk-sandbox.service packaging/env.example "$stage/packaging/"
  install -m 0644 README.md "$stage/README.md"
  cp -r manifests "$stage/manifests"
  find "$stage/manifests" -type d -exec chmod 0755 {} +
  find "$stage/manifests" -type f -exec chmod 0644 {} +
  sums=$(cd "$stage" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs sha256sum)
  printf '%s\n' "$sums" > "$stage/SHA256SUMS"

  out=dist/$name.tar.gz
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
      --format=gnu -C "$stage" -cf - README.md SHA256SUMS manifests packaging vk-sandbox \
    | gzip -9n > "$out"
  if [[ "$arch" == amd64 && "$(uname -m)" == x86_64 ]] || [[ "$arch" == arm64 && "$(uname -m)" == aarch64 ]]; then
    log "$out: $("$stage/vk-sandbox" --version)"
  fi
  log "$out ($(du -h "$out" | cut -f1)): $(file -b "$bin" | cut -d, -f1-2)"
  built+=("$name.tar.gz")
done

# The chart, packed as `helm package` does (its .helmignore keeps tests/
# and ci/ out), after its offline checks' cheapest one: helm lint.
helm=$("$here/helm-tools.sh" build helm) || die "helm is needed to pack the chart: $helm"
export HELM_CACHE_HOME=$stage_root/helm HELM_CONFIG_HOME=$stage_root/helm HELM_DATA_HOME=$stage_root/helm
"$helm" lint --strict charts/vk-sandbox >/dev/null || die "helm lint --strict charts/vk-sandbox failed (e2e/check-chart.sh lint says why)"
chart_out=$("$helm" package charts/vk-sandbox --destination dist) || die "helm package charts/vk-sandbox failed: $chart_out"
chart_tgz=$(basename "${chart_out##* }")
[[ -f "dist/$chart_tgz" ]] || die "helm package wrote no dist/$chart_tgz: $chart_out"
log "dist/$chart_tgz: the Helm chart ($(tar -tzf "dist/$chart_tgz" | wc -l) files; helm push dist/$chart_tgz oci://ghcr.io/cocoonstack/charts)"
built+=("$chart_tgz")

(cd dist && sha256sum "${built[@]}" > checksums.txt)
log "dist/checksums.txt:"
sed 's/^/  /' dist/checksums.txt
