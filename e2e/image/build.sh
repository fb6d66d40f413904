#!/usr/bin/env bash
# Container images without a container engine, written as docker-archive
# tarballs (`ctr images import`, `docker load`, `podman load` read them):
#
#   e2e/image/build.sh product OUT.tar NAME:TAG [KEY=VALUE...]
#       the repository's Dockerfile, its final stage built from its own
#       instructions: that stage must be `FROM scratch` followed by COPY
#       --from=rootfs / --from=build, ENV, USER, EXPOSE, ENTRYPOINT, CMD,
#       WORKDIR or LABEL (anything else fails the build, so the Dockerfile
#       cannot drift from what is built here). The stages it copies from
#       are made by the scripts the Dockerfile's stages run:
#         rootfs  e2e/image/rootfs.sh (the distroless-style base from
#                 Debian packages)
#         build   e2e/musl-build.sh (the static musl binary at
#                 /out/vk-sandbox); VK_IMAGE_BINARY=PATH takes an already
#                 built static binary instead, VK_MUSL_PROFILE=dev the
#                 unoptimised one (both: what the tests run)
#       KEY=VALUE pairs become image labels (a rollout test tells two
#       images of one binary apart by them).
#   e2e/image/build.sh pause OUT.tar NAME:TAG
#       the Pod sandbox image: e2e/image/pause.c built static with musl-gcc
#   e2e/image/build.sh busybox OUT.tar NAME:TAG
#       Debian's busybox-static with its applet links, as /bin (the init
#       container's image in the real-node tests)
#   e2e/image/build.sh agent-sandbox OUT.tar NAME:TAG BINARY
#       the agent-sandbox controller's image as its release's Dockerfile
#       makes it (a distroless static nonroot base, the static controller
#       binary at /agent-sandbox-controller, its entrypoint, user 65532):
#       the same base as the product image (e2e/image/rootfs.sh) and the
#       binary e2e/agent-sandbox.sh builds from the Go module
#
# Reproducible: files sorted, numeric owners kept, mtimes and the image's
# creation time set to SOURCE_DATE_EPOCH (default: the commit's time).
# Prints the image's size (the uncompressed layers) on stderr.
set -euo pipefail
# Folders a COPY creates for its destination are 0755, as a builder's.
umask 022
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

die() { echo "image: error: $*" >&2; exit 1; }
log() { echo "image: $*" >&2; }

for cmd in tar sha256sum jq; do
  command -v "$cmd" >/dev/null || die "$cmd not found (make deps installs jq)"
done
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "unsupported machine $(uname -m)" ;;
esac
arch=${VK_IMAGE_ARCH:-$arch}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
layers=()   # staged layer folders, in order
history=()  # created_by of each layer
config='{}' # the image config's "config" object

# layer_tar DIR OUT: DIR's content as a layer (no "./" entry).
layer_tar() {
  local dir=$1 out=$2 entries=()
  mapfile -t entries < <(cd "$dir" && LC_ALL=C ls -A)
  ((${#entries[@]})) || die "empty layer $dir"
  tar --sort=name --numeric-owner --mtime="@$epoch" --format=gnu \
    -C "$dir" -cf "$out" "${entries[@]}"
}

# write_archive OUT TAG: layers + config as a docker-archive tarball.
write_archive() {
  local out=$1 tag=$2 a="$work/archive" i=0 sum diff_ids='[]' hist='[]' paths='[]' size=0
  mkdir -p "$a"
  for dir in "${layers[@]}"; do
    layer_tar "$dir" "$work/layer.tar"
    sum=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    mkdir -p "$a/$sum"
    mv "$work/layer.tar" "$a/$sum/layer.tar"
    size=$((size + $(stat -c %s "$a/$sum/layer.tar")))
    diff_ids=$(jq -c --arg d "sha256:$sum" '. + [$d]' <<<"$diff_ids")
    paths=$(jq -c --arg p "$sum/layer.tar" '. + [$p]' <<<"$paths")
    hist=$(jq -c --arg c "${history[$i]}" --arg t "$created" '. + [{created: $t, created_by: $c}]' <<<"$hist")
    i=$((i + 1))
  done
  jq -n --arg arch "$arch" --arg t "$created" --argjson c "$config" \
    --argjson d "$diff_ids" --argjson h "$hist" \
    '{architecture: $arch, os: "linux", created: $t, config: $c,
      rootfs: {type: "layers", diff_ids: $d}, history: $h}' > "$work/config.json"
  sum=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$a/$sum.json"
  jq -n --arg c "$sum.json" --arg tag "$tag" --argjson l "$paths" \
    '[{Config: $c, RepoTags: [$tag], Layers: $l}]' > "$a/manifest.json"
  mkdir -p "$(dirname "$out")"
  tar --sort=name --numeric-owner --owner=0 --group=0 --mtime="@$epoch" --format=gnu \
    -C "$a" -cf "$out.tmp" .
  mv "$out.tmp" "$out"
  log "$tag -> $out: ${#layers[@]} layer(s), $((size / 1024)) KiB uncompressed, image id sha256:${sum:0:12}"
}

# ------------------------------------------------------------ product
# The Dockerfile's instructions, one per line (continuations joined,
# comments and blank lines dropped).
dockerfile_lines() {
  awk '
    /^[[:space:]]*#/ && cont == "" { next }
    /^[[:space:]]*$/ && cont == "" { next }
    {
      line = cont $0
      if (line ~ /\\[[:space:]]*$/) { sub(/\\[[:space:]]*$/, " ", line); cont = line; next }
      cont = ""
      print line
    }
  ' "$1"
}

# stage_dir NAME: the folder standing for the Dockerfile stage NAME.
declare -A stages=()
stage_dir() {
  local name=$1
  if [[ -n "${stages[$name]:-}" ]]; then echo "${stages[$name]}"; return; fi
  local d="$work/stage-$name"
  case "$name" in
    rootfs)
      grep -qE '^RUN .*/rootfs\.sh /rootfs' "$root/Dockerfile" ||
        die "the Dockerfile's rootfs stage must run e2e/image/rootfs.sh /rootfs (what is rebuilt here)"
      VK_IMAGE_DEBS=${VK_IMAGE_DEBS:-$root/.cache/image-debs} "$here/rootfs.sh" "$d/rootfs" >&2
      ;;
    build)
      grep -qE '^ *e2e/musl-build\.sh .*/out/vk-sandbox' "$root/Dockerfile" ||
        die "the Dockerfile's build stage must run e2e/musl-build.sh ... /out/vk-sandbox (what is rebuilt here)"
      mkdir -p "$d/out"
      if [[ -n "${VK_IMAGE_BINARY:-}" ]]; then
        [[ -x "$VK_IMAGE_BINARY" ]] || die "VK_IMAGE_BINARY=$VK_IMAGE_BINARY is not an executable"
        cp "$VK_IMAGE_BINARY" "$d/out/vk-sandbox"
      else
        local target
        case "$arch" in
          amd64) target=x86_64-unknown-linux-musl ;;
          arm64) target=aarch64-unknown-linux-musl ;;
        esac
        "$root/e2e/musl-build.sh" "$target" "$d/out/vk-sandbox" >&2
      fi
      chmod 0755 "$d/out/vk-sandbox"
      local desc
      desc=$(file -b "$d/out/vk-sandbox")
      [[ "$desc" == *"statically linked"* || "$desc" == *"static-pie linked"* ]] ||
        die "the binary is not static: $desc"
      ;;
    *) die "COPY --from=$name: no recipe for the stage $name here (only rootfs and build)" ;;
  esac
  stages[$name]=$d
  echo "$d"
}

# json_array "a" "b": a JSON array of the words (for exec-form lines).
exec_form() {
  jq -ce 'if type == "array" and all(type == "string") then . else error("not a JSON string array") end' <<<"$1" 2>/dev/null ||
    die "$2 must use the exec form [\"...\"], got: $1"
}

build_product() {
  local out=$1 tag=$2; shift 2
  local lines=() i last=-1 n=0
  mapfile -t lines < <(dockerfile_lines "$root/Dockerfile")
  for i in "${!lines[@]}"; do
    [[ "${lines[$i]}" =~ ^FROM[[:space:]] ]] && last=$i
  done
  ((last >= 0)) || die "no FROM in the Dockerfile"
  [[ "${lines[$last]}" =~ ^FROM[[:space:]]+scratch([[:space:]]|$) ]] ||
    die "the Dockerfile's final stage must start FROM scratch (it is rebuilt here), got: ${lines[$last]}"
  config=$(jq -n '{Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}')
  local line instr rest
  for ((i = last + 1; i < ${#lines[@]}; i++)); do
    line=${lines[$i]}
    instr=${line%%[[:space:]]*}
    rest=${line#"$instr"}
    rest=${rest#"${rest%%[![:space:]]*}"}
    case "$instr" in
      COPY)
        [[ "$rest" =~ ^--from=([A-Za-z0-9_-]+)[[:space:]]+([^[:space:]]+)[[:space:]]+([^[:space:]]+)$ ]] ||
          die "unsupported COPY (want COPY --from=STAGE SRC DEST): $line"
        local from=${BASH_REMATCH[1]} src=${BASH_REMATCH[2]} dst=${BASH_REMATCH[3]} sdir staged
        sdir=$(stage_dir "$from")
        n=$((n + 1))
        staged="$work/layer-$n"
        mkdir -p "$staged"
        if [[ "$src" == */ ]]; then
          [[ -d "$sdir$src" ]] || die "COPY: $src is not a folder of stage $from"
          mkdir -p "$staged$dst"
          cp -a "$sdir$src." "$staged$dst"
        else
          [[ -e "$sdir$src" ]] || die "COPY: no $src in stage $from"
          mkdir -p "$staged$(dirname "$dst")"
          cp -a "$sdir$src" "$staged$dst"
        fi
        layers+=("$staged")
        history+=("$line")
        ;;
      ENV)
        [[ "$rest" =~ ^([A-Za-z_][A-Za-z0-9_]*)=([^[:space:]]*)$ ]] || die "unsupported ENV (want ENV KEY=value): $line"
        config=$(jq -c --arg k "${BASH_REMATCH[1]}" --arg v "${BASH_REMATCH[2]}" \
          '.Env = ([.Env[] | select(startswith($k + "=") | not)] + [$k + "=" + $v])' <<<"$config")
        ;;
      USER) config=$(jq -c --arg u "$rest" '.User = $u' <<<"$config") ;;
      WORKDIR) config=$(jq -c --arg w "$rest" '.WorkingDir = $w' <<<"$config") ;;
      EXPOSE)
        local p
        for p in $rest; do
          [[ "$p" == */* ]] || p="$p/tcp"
          config=$(jq -c --arg p "$p" '.ExposedPorts[$p] = {}' <<<"$config")
        done
        ;;
      ENTRYPOINT) config=$(jq -c --argjson e "$(exec_form "$rest" ENTRYPOINT)" '.Entrypoint = $e' <<<"$config") ;;
      CMD) config=$(jq -c --argjson e "$(exec_form "$rest" CMD)" '.Cmd = $e' <<<"$config") ;;
      LABEL)
        [[ "$rest" =~ ^([A-Za-z0-9._/-]+)=\"?([^\"]*)\"?$ ]] || die "unsupported LABEL (one KEY=value): $line"
        config=$(jq -c --arg k "${BASH_REMATCH[1]}" --arg v "${BASH_REMATCH[2]}" '.Labels[$k] = $v' <<<"$config")
        ;;
      *) die "the Dockerfile's final stage has $instr, which this builder does not reproduce: $line" ;;
    esac
  done
  ((${#layers[@]})) || die "the Dockerfile's final stage copies nothing"
  local kv
  for kv in "$@"; do
    [[ "$kv" == *=* ]] || die "label $kv: want KEY=VALUE"
    config=$(jq -c --arg k "${kv%%=*}" --arg v "${kv#*=}" '.Labels[$k] = $v' <<<"$config")
  done
  write_archive "$out" "$tag"
}

# ------------------------------------------------------------ test images
build_pause() {
  local out=$1 tag=$2 d="$work/pause"
  command -v musl-gcc >/dev/null || die "musl-gcc not found (Debian package musl-tools)"
  mkdir -p "$d"
  musl-gcc -Os -static -s -o "$d/pause" "$here/pause.c"
  config='{"Entrypoint":["/pause"],"User":"65535:65535"}'
  layers=("$d")
  history=("pause.c, static")
  write_archive "$out" "$tag"
}

build_busybox() {
  local out=$1 tag=$2 d="$work/busybox" bb=/bin/busybox a
  [[ -x "$bb" ]] && "$bb" --list >/dev/null 2>&1 || die "$bb not found (Debian package busybox-static)"
  file -b "$bb" | grep -q 'statically linked' || die "$bb is not static (install busybox-static, not busybox)"
  mkdir -p "$d/bin" "$d/tmp"
  chmod 1777 "$d/tmp"
  cp "$bb" "$d/bin/busybox"
  for a in $("$bb" --list); do
    [[ "$a" == busybox ]] || ln -s busybox "$d/bin/$a"
  done
  config='{"Env":["PATH=/bin"],"Cmd":["sh"]}'
  layers=("$d")
  history=("Debian busybox-static $(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || echo '?')")
  write_archive "$out" "$tag"
}

build_agent_sandbox() {
  local out=$1 tag=$2 bin=$3 d="$work/agent-sandbox"
  [[ -x "$bin" ]] || die "$bin is not an executable (e2e/agent-sandbox.sh build makes it)"
  file -b "$bin" | grep -qE 'statically linked|static-pie linked' || die "$bin is not static"
  mkdir -p "$d"
  cp "$bin" "$d/agent-sandbox-controller"
  chmod 0755 "$d/agent-sandbox-controller"
  VK_IMAGE_DEBS=${VK_IMAGE_DEBS:-$root/.cache/image-debs} "$here/rootfs.sh" "$work/rootfs" >&2
  config='{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"User":"65532:65532","WorkingDir":"/home/nonroot","Entrypoint":["/agent-sandbox-controller"]}'
  layers=("$work/rootfs" "$d")
  history=("e2e/image/rootfs.sh (distroless static nonroot style)" "COPY agent-sandbox-controller /agent-sandbox-controller")
  write_archive "$out" "$tag"
}

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "${1:-}" in
  product) (($# >= 3)) || usage; shift; build_product "$@" ;;
  pause) (($# == 3)) || usage; build_pause "$2" "$3" ;;
  busybox) (($# == 3)) || usage; build_busybox "$2" "$3" ;;
  agent-sandbox) (($# == 4)) || usage; build_agent_sandbox "$2" "$3" "$4" ;;
  *) usage ;;
esac
