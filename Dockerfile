# vk-sandbox container image: `docker build -t vk-sandbox:dev .`
#
# Stage 1 builds a static musl binary for the build platform's architecture
# (x86_64 or aarch64; for the other one build with --platform on a builder
# that can run it). Stage 2 puts it on distroless static, user nonroot
# (UID/GID 65532), with the binary as the entrypoint and no shell.
#
# The state directory (VK_STATE_PATH, default /var/lib/vk-sandbox/claims.json)
# must be writable by UID 65532 — e.g. a hostPath chowned by an init container
# as in manifests/daemonset.yaml — or the binary refuses to start.
#
# Version stamp (the build context has no .git):
#   docker build --build-arg VK_VERSION=$(git describe --tags --always --dirty) \
#                --build-arg VK_REVISION=$(git rev-parse --short=12 HEAD) -t vk-sandbox:dev .

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG VK_VERSION=dev
ARG VK_REVISION=unknown
ARG VK_BUILT_AT=unknown
RUN set -eux; \
    target="$(uname -m)-unknown-linux-musl"; \
    rustup target add "$target"; \
    export "CC_$(echo "$target" | tr - _)=musl-gcc"; \
    VK_VERSION="$VK_VERSION" VK_REVISION="$VK_REVISION" VK_BUILT_AT="$VK_BUILT_AT" \
    RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --locked --target "$target" --bin vk-sandbox; \
    install -D -m 0755 "target/$target/release/vk-sandbox" /out/vk-sandbox; \
    /out/vk-sandbox --version; \
    if file /out/vk-sandbox 2>/dev/null | grep -q 'dynamically linked'; then \
      echo "vk-sandbox is dynamically linked" >&2; exit 1; \
    fi

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/vk-sandbox /usr/local/bin/vk-sandbox
USER 65532:65532
# Kubelet API (HTTPS) and admin (/metrics, /livez, /readyz).
EXPOSE 10260 10261
ENTRYPOINT ["/usr/local/bin/vk-sandbox"]
