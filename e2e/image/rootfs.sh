#!/usr/bin/env bash
# The image's base, distroless-static style, assembled from Debian packages:
#
#   e2e/image/rootfs.sh DEST
#
# DEST receives /etc/passwd and /etc/group (root, nobody, and nonroot with
# UID/GID 65532, as distroless's :nonroot), /home/nonroot (65532, 0700),
# /root (0700), /tmp (1777), the CA bundle /etc/ssl/certs/ca-certificates.crt
# (the certificates of Debian's ca-certificates package, concatenated the
# way update-ca-certificates does), /usr/share/zoneinfo (tzdata),
# /etc/os-release and /usr/lib/os-release (base-files) and each package's
# copyright file. Nothing else: no shell, no libc, no package manager.
#
# The Dockerfile's `rootfs` stage runs this script; e2e/image/build.sh runs
# it on the host for the image the tests run (the same files either way).
# The .deb files come from apt (`apt-get download`, Debian's mirrors; run
# `apt-get update` first on a fresh machine); VK_IMAGE_DEBS is a folder that
# caches them. Needs root (files owned by 65532).
set -euo pipefail
dest=${1:?usage: rootfs.sh DEST}
pkgs=(base-files ca-certificates tzdata)

die() { echo "rootfs: error: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (the image's files are owned by root and by UID 65532)"
for cmd in apt-get dpkg-deb; do
  command -v "$cmd" >/dev/null || die "$cmd not found: the base is assembled from Debian packages"
done

debs=${VK_IMAGE_DEBS:-$(mktemp -d)}
mkdir -p "$debs"
work=$(mktemp -d)
trap 'rm -rf "$work"; [[ -n "${VK_IMAGE_DEBS:-}" ]] || rm -rf "$debs"' EXIT

for p in "${pkgs[@]}"; do
  version=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
  [[ -n "$version" && "$version" != "(none)" ]] ||
    die "apt knows no candidate for $p (run apt-get update first)"
  # A version's file name has its epoch ':' as %3a.
  file=$(compgen -G "$debs/${p}_${version//:/%3a}_*.deb" | head -1 || true)
  if [[ -z "$file" ]]; then
    (cd "$debs" && apt-get download -qq "$p=$version" 2>/dev/null) ||
      die "apt-get download $p=$version failed (no network to the Debian mirrors?)"
    file=$(compgen -G "$debs/${p}_${version//:/%3a}_*.deb" | head -1 || true)
    [[ -n "$file" ]] || die "apt-get download $p left no .deb in $debs"
  fi
  mkdir -p "$work/$p"
  dpkg-deb -x "$file" "$work/$p"
done

rm -rf "$dest"
install -d -m 0755 "$dest" "$dest/etc" "$dest/etc/ssl" "$dest/etc/ssl/certs" \
  "$dest/usr" "$dest/usr/lib" "$dest/usr/share" "$dest/usr/share/doc" \
  "$dest/usr/local" "$dest/usr/local/bin" "$dest/home" "$dest/var"
install -d -m 0700 "$dest/root"
install -d -m 0700 -o 65532 -g 65532 "$dest/home/nonroot"
install -d -m 1777 "$dest/tmp"

cat > "$dest/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$dest/etc/group" <<'EOF'
root:x:0:
tty:x:5:
staff:x:50:
nobody:x:65534:
nonroot:x:65532:
EOF
chmod 0644 "$dest/etc/passwd" "$dest/etc/group"

# ca-certificates ships the certificates; its postinst builds the bundle.
find "$work/ca-certificates/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z |
  xargs -0 cat > "$dest/etc/ssl/certs/ca-certificates.crt"
[[ -s "$dest/etc/ssl/certs/ca-certificates.crt" ]] || die "no certificates in the ca-certificates package"
chmod 0644 "$dest/etc/ssl/certs/ca-certificates.crt"

cp -a "$work/tzdata/usr/share/zoneinfo" "$dest/usr/share/zoneinfo"
cp -a "$work/base-files/usr/lib/os-release" "$dest/usr/lib/os-release"
ln -s ../usr/lib/os-release "$dest/etc/os-release"
for p in "${pkgs[@]}"; do
  install -D -m 0644 "$work/$p/usr/share/doc/$p/copyright" "$dest/usr/share/doc/$p/copyright"
done
echo "rootfs: $dest ($(du -sh "$dest" | cut -f1); ${pkgs[*]} from Debian)"
