#!/usr/bin/env bash
# Run Cordon's whole test suite on a fresh Debian/Ubuntu machine (as root, or with sudo).
#
# Installs what the suite needs (openssh-server for the SSH backend tests, docker.io and the
# offline sandbox image for the Docker backend tests, podman and catatonit for the same backend
# on Podman's API, the Python MCP SDK for the MCP end-to-end tests), starts a private dockerd
# and a private Podman service when none is reachable, then runs every test of the workspace. Nothing is skipped: a component that cannot be provided makes its tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# command → Debian package, for every external program a suite drives.
need_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || need_pkgs+=("$2"); }
need sshd openssh-server            # SSH backend tests (a throwaway sshd on 127.0.0.1)
need ssh-keygen openssh-client
need ssh-agent openssh-client
need dockerd docker.io              # Docker backend tests (a private dockerd)
need podman podman                  # the Docker backend on Podman's API (a private service)
[ -x /usr/libexec/podman/catatonit ] || need_pkgs+=(catatonit)  # Podman's --init
need debootstrap debootstrap        # the offline sandbox image
need busybox busybox-static         # the tiny fallback-search test image
need git git
need patch patch                    # edit patches applied with patch -p0
need rg ripgrep                     # remote search and the grep benchmark
need curl curl                      # sandbox escape cases
need nc netcat-openbsd
need gdb gdb
need setcap libcap2-bin
need unshare util-linux
need script util-linux              # cordon run approvals on a pseudo-terminal
need getent libc-bin
need python3 python3
need openssl openssl                # test certificates: a TLS docker engine, the egress proxy over https
# the local egress test runs the system python's pip (a pyenv shim cannot rehash in the sandbox)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need_pkgs+=(python3-pip)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! python3 -c 'import mcp' >/dev/null 2>&1; then
  log "installing the Python MCP SDK (for the MCP end-to-end tests)"
  python3 -m pip install -q 'mcp>=1.9' || python3 -m pip install -q --break-system-packages 'mcp>=1.9'
fi

if ! python3 -c 'import yaml' >/dev/null 2>&1; then
  log "installing PyYAML (the CI examples test parses their YAML)"
  python3 -m pip install -q pyyaml || python3 -m pip install -q --break-system-packages pyyaml
fi

log "Docker engine"
DOCKER_HOST="$(scripts/docker-start.sh)"
export DOCKER_HOST
log "sandbox image"
scripts/build-sandbox-image.sh
log "Podman service (the images loaded from the Docker engine)"
scripts/podman-start.sh >/dev/null

log "cargo test --workspace"
cargo test --workspace --no-fail-fast "$@"

# The escape suite again, through cordon-helper: over a local pipe, over SSH with commands
# enforced on the (local test) host, and in a Docker container under its container profile.
for backend in helper_pipe ssh_helper docker_helper; do
  log "escape suite over $backend"
  CORDON_ESCAPE_BACKEND=$backend cargo test -p cordon-tests --test escape
done
