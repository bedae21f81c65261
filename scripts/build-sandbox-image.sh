#!/usr/bin/env bash
# Build Cordon's sandbox image OFFLINE (no registry needed) and tag it.
#
#   scripts/build-sandbox-image.sh              # cordon-sandbox:latest from Dockerfile.sandbox
#   scripts/build-sandbox-image.sh --busybox    # cordon-sandbox-busybox:latest, a ~2 MB test image
#   scripts/build-sandbox-image.sh --cordon     # both images: cordon-sandbox:latest and
#                                               # cordon:latest (Cordon itself, for CI steps)
#   options: --tag NAME  --build-essentials  --force
#            --cordon-binary PATH (default dist/cordon-x86_64-linux, built by scripts/release.sh
#            when missing)  --cordon-tag NAME (default cordon:latest)
#
# The Debian image starts from a local base `cordon-base:bookworm`, made once with
# `debootstrap --variant=minbase bookworm` from the Debian mirror apt already uses (override with
# DEBIAN_MIRROR) and `docker import`; Dockerfile.sandbox is then built on top with
# `--network host` so apt can reach the mirror. The busybox image is `FROM scratch` with the
# host's busybox-static (no network at all). Idempotent and fast: an image whose recipe hash
# label matches is kept as is. Cordon's own image is the sandbox image plus the static `cordon`
# binary at /usr/local/bin/cordon (same user, same userland for the commands it runs); running
# its sandbox inside a container needs `--security-opt seccomp=unconfined --security-opt
# systempaths=unconfined` (README, "Install"). Needs a reachable engine (see
# scripts/docker-start.sh); installs debootstrap / busybox-static with apt-get when missing and
# running as root.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=debian
tag=""
essentials=0
force=0
cordon=0
cordon_binary=""
cordon_tag="cordon:latest"
while [ $# -gt 0 ]; do
    case "$1" in
        --busybox) mode=busybox ;;
        --tag) tag="$2"; shift ;;
        --build-essentials) essentials=1 ;;
        --force) force=1 ;;
        --cordon) cordon=1 ;;
        --cordon-binary) cordon=1; cordon_binary="$2"; shift ;;
        --cordon-tag) cordon=1; cordon_tag="$2"; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "build-sandbox-image: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

log() { printf 'build-sandbox-image: %s\n' "$*" >&2; }

if [ "$cordon" = 1 ] && [ "$mode" = busybox ]; then
    log "--cordon builds on the Debian sandbox image, not --busybox"
    exit 2
fi

if ! docker version >/dev/null 2>&1; then
    log "no Docker engine reachable (DOCKER_HOST=${DOCKER_HOST:-unset}); run: export DOCKER_HOST=\"\$(scripts/docker-start.sh)\""
    exit 1
fi

need_pkg() { # $1 = command, $2 = Debian package
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing $2"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2 \
            || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2; }
    fi
    command -v "$1" >/dev/null 2>&1 || { log "$1 is required (package $2)"; exit 1; }
}

image_label() { # $1 = image, $2 = label; prints the value or nothing
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

build_busybox() {
    local name="${tag:-cordon-sandbox-busybox:latest}"
    need_pkg busybox busybox-static
    local bb
    bb="$(command -v busybox)"
    local recipe
    recipe="$( (sha256sum "$bb"; sed -n '/^build_busybox()/,/^}/p' "$0") | sha256sum | cut -c1-16)"
    if [ "$force" = 0 ] && [ "$(image_label "$name" org.cordon.recipe)" = "$recipe" ]; then
        log "$name is up to date"
        printf '%s\n' "$name"
        return
    fi
    local ctx
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"; trap - RETURN' RETURN
    cp "$bb" "$ctx/busybox"
    cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN mkdir -p /tmp /workspace /cordon-spill /home/cordon /usr/bin && chmod 1777 /tmp /cordon-spill /home/cordon && ln -s /bin/env /usr/bin/env
LABEL org.cordon.sandbox="1" org.cordon.recipe="$recipe"
ENV PATH=/bin LANG=C.UTF-8
WORKDIR /workspace
CMD ["/bin/sh", "-c", "while :; do sleep 86400; done"]
DOCKERFILE
    DOCKER_BUILDKIT=0 docker build -q -t "$name" "$ctx" >&2
    log "built $name"
    printf '%s\n' "$name"
}

build_base() {
    local base="cordon-base:bookworm"
    if docker image inspect "$base" >/dev/null 2>&1; then
        return
    fi
    need_pkg debootstrap debootstrap
    local mirror="${DEBIAN_MIRROR:-}"
    if [ -z "$mirror" ]; then
        # The mirror apt is configured with (deb822 or one-line format).
        mirror="$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
            | grep -v security | head -n1 | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//; s/[[:space:]].*$//' || true)"
    fi
    [ -n "$mirror" ] || { log "no Debian mirror found; set DEBIAN_MIRROR"; exit 1; }
    local rootfs
    rootfs="$(mktemp -d /var/tmp/cordon-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"; trap - RETURN' RETURN
    log "debootstrap --variant=minbase bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >&2
    tar -C "$rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' - "$base" >&2
    log "imported $base"
}

build_debian() {
    local name="${tag:-cordon-sandbox:latest}"
    build_base
    local base_id recipe
    base_id="$(docker image inspect --format '{{.Id}}' cordon-base:bookworm)"
    recipe="$( (cat "$here/Dockerfile.sandbox"; echo "$base_id essentials=$essentials") | sha256sum | cut -c1-16)"
    if [ "$force" = 0 ] && [ "$(image_label "$name" org.cordon.recipe)" = "$recipe" ]; then
        log "$name is up to date"
        printf '%s\n' "$name"
        return
    fi
    DOCKER_BUILDKIT=0 docker build --network host -q \
        --build-arg BASE=cordon-base:bookworm \
        --build-arg BUILD_ESSENTIALS="$essentials" \
        --label org.cordon.recipe="$recipe" \
        -f "$here/Dockerfile.sandbox" -t "$name" "$here/scripts" >&2
    log "built $name"
    printf '%s\n' "$name"
}

# $1 = the sandbox image to build on. Prints the image name.
build_cordon() {
    local sandbox="$1" bin="$cordon_binary"
    if [ -z "$bin" ]; then
        bin="$here/dist/cordon-x86_64-linux"
        if [ ! -x "$bin" ]; then
            log "$bin is missing; building it with scripts/release.sh --arch x86_64"
            "$here/scripts/release.sh" --arch x86_64 >&2
        fi
    fi
    [ -x "$bin" ] || { log "no executable cordon binary at $bin"; exit 1; }
    local sandbox_id recipe
    sandbox_id="$(docker image inspect --format '{{.Id}}' "$sandbox")"
    recipe="$( (sha256sum <"$bin"; echo "$sandbox_id"; sed -n '/^build_cordon()/,/^}/p' "$0") | sha256sum | cut -c1-16)"
    if [ "$force" = 0 ] && [ "$(image_label "$cordon_tag" org.cordon.recipe)" = "$recipe" ]; then
        log "$cordon_tag is up to date"
        printf '%s\n' "$cordon_tag"
        return
    fi
    local ctx
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"; trap - RETURN' RETURN
    cp "$bin" "$ctx/cordon"
    chmod 0755 "$ctx/cordon"
    # No ENTRYPOINT: CI systems (GitLab's `image:`, GitHub's `container:`) start their own shell.
    cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $sandbox
COPY cordon /usr/local/bin/cordon
LABEL org.cordon.recipe="$recipe"
CMD ["cordon", "--help"]
DOCKERFILE
    DOCKER_BUILDKIT=0 docker build -q -t "$cordon_tag" "$ctx" >&2
    log "built $cordon_tag"
    printf '%s\n' "$cordon_tag"
}

case "$mode" in
    busybox) build_busybox ;;
    debian)
        sandbox="$(build_debian)"
        printf '%s\n' "$sandbox"
        if [ "$cordon" = 1 ]; then
            build_cordon "$sandbox"
        fi
        ;;
esac
