#!/usr/bin/env bash
# Make a Podman API socket reachable and print the DOCKER_HOST value to use (one line on stdout).
#
#   export DOCKER_HOST="$(scripts/podman-start.sh)"
#
# Starts (as root) `podman system service --time=0` on a private socket under
# $CORDON_PODMAN_DIR (default /var/tmp/cordon-podman, 0700) with its own storage root, run root
# and containers.conf (cgroupfs, file events: no systemd needed), installing Debian's podman and
# catatonit (the init `--init` runs) with apt-get when missing. The images Cordon's tests use are
# loaded offline from the Docker engine scripts/docker-start.sh provides (`docker save | podman
# load`; built with scripts/build-sandbox-image.sh when missing) unless --no-images is given.
# Idempotent: a service started earlier is reused, images already loaded are kept. Diagnostics go
# to stderr; exit 1 with a reason on failure.
#
# A system-wide Podman serves the same API at unix:///run/podman/podman.sock (rootful,
# `systemctl enable --now podman.socket`) or, rootless, at
# unix://$XDG_RUNTIME_DIR/podman/podman.sock (`systemctl --user enable --now podman.socket`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state_dir="${CORDON_PODMAN_DIR:-/var/tmp/cordon-podman}"
sock="$state_dir/podman.sock"
images=1
case "${1:-}" in
    --no-images) images=0 ;;
    "") ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "podman-start: unknown option $1" >&2; exit 2 ;;
esac

log() { printf 'podman-start: %s\n' "$*" >&2; }

reachable() {
    timeout 20 curl -fsS --unix-socket "$sock" http://podman/_ping >/dev/null 2>&1
}

podman_cmd() {
    CONTAINERS_CONF="$state_dir/containers.conf" podman \
        --root "$state_dir/root" --runroot "$state_dir/runroot" --tmpdir "$state_dir/tmp" "$@"
}

need_pkg() { # $1 = file that must exist, $2 = Debian package
    [ -e "$1" ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "$1 is missing (install $2)"
        exit 1
    fi
    log "installing $2 with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q "$2" >&2; then
        apt-get update -q >&2
        apt-get install -y -q "$2" >&2
    fi
}

need_pkg /usr/bin/podman podman
need_pkg /usr/libexec/podman/catatonit catatonit
need_pkg /usr/bin/curl curl

if ! reachable; then
    mkdir -p "$state_dir"
    chmod 0700 "$state_dir"
    mkdir -p "$state_dir/root" "$state_dir/runroot" "$state_dir/tmp"
    pidfile="$state_dir/podman.pid"
    if [ -f "$pidfile" ]; then
        old="$(cat "$pidfile" 2>/dev/null || true)"
        if [ -n "$old" ] && kill -0 "$old" 2>/dev/null; then
            log "a private podman service (pid $old) exists but does not answer; stopping it"
            kill "$old" 2>/dev/null || true
            for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    fi
    rm -f "$sock"
    # Podman gives every container nofile/nproc limits above its own hard limits unless told
    # otherwise; without CAP_SYS_RESOURCE (some VMs) runc then cannot set them. The service
    # runs once to learn the limits it runs with (it adjusts its own at start), then again with
    # those as the containers' defaults.
    write_conf() { # $1 = nofile, $2 = nproc ("" = podman's defaults)
        {
            if [ -n "$1" ]; then
                printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n\n' "$1" "$1" "$2" "$2"
            fi
            printf '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        } >"$state_dir/containers.conf"
    }
    start_service() {
        rm -f "$sock"
        # From /: the service keeps its working directory for its whole life, and podman
        # cannot start containers once that directory is gone (a deleted checkout).
        (cd / && CONTAINERS_CONF="$state_dir/containers.conf" exec setsid podman \
            --root "$state_dir/root" --runroot "$state_dir/runroot" --tmpdir "$state_dir/tmp" \
            system service --time=0 "unix://$sock" \
            </dev/null >>"$state_dir/podman.log" 2>&1) &
        echo $! >"$pidfile"
        for _ in $(seq 1 300); do
            reachable && return 0
            sleep 0.1
        done
        log "the podman service did not become ready in 30 s; last log lines:"
        tail -n 20 "$state_dir/podman.log" >&2 || true
        exit 1
    }
    hard_limit() { # $1 = pid, $2 = limit name as in /proc/PID/limits
        grep "^Max $2 " "/proc/$1/limits" | awk '{ print $(NF-1) }'
    }
    log "starting a private podman service (state in $state_dir)"
    write_conf "" ""
    start_service
    pid="$(cat "$pidfile")"
    nofile="$(hard_limit "$pid" "open files")"
    nproc="$(hard_limit "$pid" processes)"
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    write_conf "$nofile" "$nproc"
    start_service
fi

if [ "$images" = 1 ]; then
    missing=()
    for image in cordon-sandbox:latest cordon-sandbox-busybox:latest; do
        podman_cmd image exists "$image" || missing+=("$image")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        docker_host="$("$here/scripts/docker-start.sh")"
        DOCKER_HOST="$docker_host" "$here/scripts/build-sandbox-image.sh" >/dev/null
        DOCKER_HOST="$docker_host" "$here/scripts/build-sandbox-image.sh" --busybox >/dev/null
        log "loading ${missing[*]} from the Docker engine at $docker_host"
        DOCKER_HOST="$docker_host" docker save "${missing[@]}" | podman_cmd load >&2
    fi
fi

printf 'unix://%s\n' "$sock"
