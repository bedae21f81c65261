#!/usr/bin/env bash
# Run Cordon's whole test suite on a fresh Debian/Ubuntu machine (as root, or with sudo).
#
# Installs what the suite needs (openssh-server for the SSH backend tests, docker.io and the
# offline sandbox image for the Docker backend tests, the Python MCP SDK for the MCP end-to-end
# tests), starts a private dockerd when none is reachable, then runs every test of the
# workspace. Nothing is skipped: a component that cannot be provided makes its tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need_pkgs=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need_pkgs+=(openssh-client)
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need_pkgs+=(busybox-static)
command -v git >/dev/null 2>&1 || need_pkgs+=(git)
command -v patch >/dev/null 2>&1 || need_pkgs+=(patch)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! python3 -c 'import mcp' >/dev/null 2>&1; then
  log "installing the Python MCP SDK (for the MCP end-to-end tests)"
  python3 -m pip install -q 'mcp>=1.9'
fi

log "Docker engine"
DOCKER_HOST="$(scripts/docker-start.sh)"
export DOCKER_HOST
log "sandbox image"
scripts/build-sandbox-image.sh

log "cargo test --workspace"
cargo test --workspace --no-fail-fast "$@"
