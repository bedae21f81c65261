#!/usr/bin/env bash
# A throwaway OpenSSH server on 127.0.0.1 for trying and benchmarking the SSH backend.
#
#   scripts/ssh-test-server.sh start DIR [PORT]   # keys, config, sshd in the background
#   scripts/ssh-test-server.sh stop DIR           # stop it (sessions included)
#
# `start` prints shell assignments (CORDON_SSH_PORT, CORDON_SSH_KEY, CORDON_SSH_KNOWN_HOSTS,
# CORDON_SSH_ROOT) to eval. The server accepts root with a generated key, MaxSessions 1000,
# SFTP via internal-sftp, and `SetEnv SHLVL=1` so that bash, the login shell, skips
# ~/.bashrc (slow on these machines: `pyenv init`). With CORDON_SSH_LOGIN_RC=1 that line is
# left out, to measure what a slow rc file costs. Installs openssh-server with apt-get if sshd
# is missing.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
    echo "usage: $0 start DIR [PORT] | stop DIR" >&2
    exit 2
fi

case "$cmd" in
stop)
    if [ -f "$dir/sshd.pid" ]; then
        pid=$(cat "$dir/sshd.pid")
        pkill -KILL -P "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        rm -f "$dir/sshd.pid"
    fi
    exit 0
    ;;
start) ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac

sshd=$(command -v sshd || true)
[ -z "$sshd" ] && [ -x /usr/sbin/sshd ] && sshd=/usr/sbin/sshd
if [ -z "$sshd" ]; then
    echo "sshd not found, installing openssh-server" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >&2
    sshd=/usr/sbin/sshd
fi

mkdir -p "$dir" /run/sshd
dir=$(cd "$dir" && pwd -P)
port=${3:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_ed25519"
[ -f "$dir/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/client_ed25519"
cp "$dir/client_ed25519.pub" "$dir/authorized_keys"
mkdir -p "$dir/root"
cat >"$dir/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin yes
MaxSessions 1000
MaxStartups 100:30:200
Subsystem sftp internal-sftp
CONF
if [ "${CORDON_SSH_LOGIN_RC:-0}" != 1 ]; then
    echo "SetEnv SHLVL=1" >>"$dir/sshd_config"
fi
read -r ktype kdata _ <"$dir/host_ed25519.pub"
echo "[127.0.0.1]:$port $ktype $kdata" >"$dir/known_hosts"
"$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log"
for _ in $(seq 1 300); do
    if ssh-keyscan -p "$port" 127.0.0.1 >/dev/null 2>&1; then
        echo "CORDON_SSH_PORT=$port"
        echo "CORDON_SSH_KEY=$dir/client_ed25519"
        echo "CORDON_SSH_KNOWN_HOSTS=$dir/known_hosts"
        echo "CORDON_SSH_ROOT=$dir/root"
        exit 0
    fi
    sleep 0.1
done
echo "sshd did not start; see $dir/sshd.log" >&2
exit 1
