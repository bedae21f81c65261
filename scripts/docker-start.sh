#!/usr/bin/env bash
# Make a Docker engine reachable and print the DOCKER_HOST value to use (one line on stdout).
#
#   export DOCKER_HOST="$(scripts/docker-start.sh)"
#
# Order: an engine already reachable through $DOCKER_HOST or the default socket is used as is;
# otherwise a private dockerd is started (installing Debian's docker.io first when dockerd is
# missing and we are root) with its own data/exec roots and socket under $CORDON_DOCKER_DIR
# (default /var/tmp/cordon-docker), no bridge and no iptables changes. Idempotent: a private
# daemon started earlier is reused. Diagnostics go to stderr; exit 1 with a reason on failure.
set -euo pipefail

state_dir="${CORDON_DOCKER_DIR:-/var/tmp/cordon-docker}"
sock="$state_dir/docker.sock"

log() { printf 'docker-start: %s\n' "$*" >&2; }

reachable() {
    # `docker version` needs both client and server; a timeout keeps a hung socket from blocking.
    DOCKER_HOST="$1" timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

if [ -n "${DOCKER_HOST:-}" ] && command -v docker >/dev/null 2>&1 && reachable "$DOCKER_HOST"; then
    printf '%s\n' "$DOCKER_HOST"
    exit 0
fi
if [ -S /var/run/docker.sock ] && command -v docker >/dev/null 2>&1 && reachable unix:///var/run/docker.sock; then
    printf '%s\n' unix:///var/run/docker.sock
    exit 0
fi
if command -v docker >/dev/null 2>&1 && [ -S "$sock" ] && reachable "unix://$sock"; then
    printf '%s\n' "unix://$sock"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "no Docker engine is reachable and dockerd is not installed (install docker.io or set DOCKER_HOST)"
        exit 1
    fi
    log "installing docker.io with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q docker.io >&2; then
        apt-get update -q >&2
        apt-get install -y -q docker.io >&2
    fi
fi

mkdir -p "$state_dir/data" "$state_dir/exec"
pidfile="$state_dir/dockerd.pid"
if [ -f "$pidfile" ]; then
    old="$(cat "$pidfile" 2>/dev/null || true)"
    if [ -n "$old" ] && kill -0 "$old" 2>/dev/null; then
        log "a private dockerd (pid $old) exists but does not answer; stopping it"
        kill "$old" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
fi
rm -f "$sock"

log "starting a private dockerd (state in $state_dir)"
# From /: the daemon keeps its working directory for its whole life, which may be a checkout
# that is deleted later.
(cd / && exec setsid dockerd \
    --data-root "$state_dir/data" \
    --exec-root "$state_dir/exec" \
    --pidfile "$pidfile" \
    -H "unix://$sock" \
    --bridge=none --iptables=false --ip-masq=false \
    </dev/null >>"$state_dir/dockerd.log" 2>&1) &

for _ in $(seq 1 300); do
    if [ -S "$sock" ] && reachable "unix://$sock"; then
        printf '%s\n' "unix://$sock"
        exit 0
    fi
    sleep 0.1
done
log "dockerd did not become ready in 30 s; last log lines:"
tail -n 20 "$state_dir/dockerd.log" >&2 || true
exit 1
