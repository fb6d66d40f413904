# syntax=docker/dockerfile:1
# vk-sandbox container image: `docker build -t vk-sandbox:dev .`
# Both architectures as one manifest list (the release path, `make
# image-multiarch`): docker buildx build --platform linux/amd64,linux/arm64 ...
#
# Stage `build` compiles the static musl binary on the builder's own
# platform for the target's architecture (e2e/musl-build.sh cross-compiles
# arm64 with Debian's aarch64 gcc: no emulation). Stage `rootfs` assembles
# a distroless-static style base from Debian packages (e2e/image/rootfs.sh:
# passwd/group with nonroot 65532, CA certificates, tzdata, os-release; no
# shell, no libc). The final stage is FROM scratch plus COPYs of what those
# two scripts made, so it is rebuilt without a container engine by
# e2e/image/build.sh (what the tests run on the real node, `make
# image-archive`): keep it to COPY --from, ENV, USER, EXPOSE, ENTRYPOINT.
#
# The image runs as UID/GID 65532 with the binary as its entrypoint. The
# state directory (VK_STATE_PATH, default /var/lib/vk-sandbox/claims.json)
# must be writable by UID 65532 — e.g. a hostPath chowned by an init
# container as in manifests/daemonset.yaml — or the binary refuses to start.
#
# Version stamp (the build context has no .git):
#   docker build --build-arg VK_VERSION=$(git describe --tags --always --dirty) \
#                --build-arg VK_REVISION=$(git rev-parse --short=12 HEAD) -t vk-sandbox:dev .

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
ARG VK_VERSION=dev
ARG VK_REVISION=unknown
ARG VK_BUILT_AT=unknown
WORKDIR /src
COPY . .
RUN set -eux; \
    case "${TARGETARCH:-$(dpkg --print-architecture)}" in \
      amd64) target=x86_64-unknown-linux-musl ;; \
      arm64) target=aarch64-unknown-linux-musl ;; \
      *) echo "unsupported architecture ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    apt-get update; \
    VK_VERSION="$VK_VERSION" VK_REVISION="$VK_REVISION" VK_BUILT_AT="$VK_BUILT_AT" VK_MUSL_LOCKED=1 \
      e2e/musl-build.sh "$target" /out/vk-sandbox

FROM --platform=$BUILDPLATFORM debian:bookworm-slim AS rootfs
COPY e2e/image/rootfs.sh /usr/local/bin/rootfs.sh
RUN apt-get update && /usr/local/bin/rootfs.sh /rootfs && rm -rf /var/lib/apt/lists/*

FROM scratch
COPY --from=rootfs /rootfs/ /
COPY --from=build /out/vk-sandbox /usr/local/bin/vk-sandbox
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
# Kubelet API (HTTPS) and admin (/metrics, /livez, /readyz).
EXPOSE 10260 10261
ENTRYPOINT ["/usr/local/bin/vk-sandbox"]
