#!/usr/bin/env bash
# Stop the private dockerd that scripts/docker-start.sh started (state in $CORDON_DOCKER_DIR,
# default /var/tmp/cordon-docker). Containers of live Cordon sessions die with it. Does nothing
# when no private daemon runs; never touches a system daemon.
set -euo pipefail
state_dir="${CORDON_DOCKER_DIR:-/var/tmp/cordon-docker}"
pidfile="$state_dir/dockerd.pid"
[ -f "$pidfile" ] || { echo "docker-stop: no private dockerd running" >&2; exit 0; }
pid="$(cat "$pidfile")"
if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "docker-stop: dockerd (pid $pid) did not stop in 30 s" >&2
        exit 1
    fi
fi
rm -f "$pidfile"
echo "docker-stop: stopped the private dockerd" >&2
