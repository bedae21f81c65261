# cordon-remote exec wrapper (POSIX sh). Invoked as
#   sh -c "$SCRIPT" cordon-exec TAG CWD COMMAND TICKS [NAME=VALUE...]
# Runs COMMAND with `bash -c` (`sh -c` without bash) in CWD, in its own session, stdin from
# /dev/null, stdout+stderr merged on this exec's stdout. Control records (NUL-terminated
# fields) go to this exec's stderr:
#   nocwd | pid PID | exit STATUS | oom | survivors | killed | stuck
# This exec's stdin is the control input: a line `kill` (or EOF: the client went away) kills
# the command's whole tree: SIGTERM, TICKS x 50 ms grace, SIGKILL. After the shell exits,
# leftover processes are reported with `survivors` and killed once the client sends `kill`
# (after its output idle grace) — so nothing outlives the call.
exec 3>&2 2>/dev/null 5<&0
tag=$1
cwd=$2
cmd=$3
ticks=$4
shift 4

oom_count() {
    OOM=0
    for _f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
        [ -r "$_f" ] || continue
        while read -r _k _v; do
            [ "$_k" = oom_kill ] && { OOM=$_v; return; }
        done <"$_f"
    done
}

cd "$cwd" || { printf 'nocwd\0' >&3; exit 125; }
if command -v bash >/dev/null; then shell=bash; else shell=sh; fi
if command -v setsid >/dev/null; then launcher=setsid; else launcher=; fi
oom_count
oom_before=$OOM

(
    exec 3>&- 5<&-
    [ $# -gt 0 ] && export "$@"
    CORDON_EXEC_ID=$tag
    export CORDON_EXEC_ID
    exec $launcher "$shell" -c "$cmd" </dev/null 2>&1
) &
pid=$!
if [ -n "$launcher" ]; then sess=$pid; else sess=; fi
main=$pid
# The shell may not have exec'd yet; its start time is fixed at fork, which is what counts.
start_of "$pid"
start=$START
printf 'pid\0%s\0' "$pid" >&3

(
    IFS= read -r line
    if killtree; then printf 'killed\0' >&3; else printf 'stuck\0' >&3; fi
) <&5 &
watcher=$!

wait "$pid"
status=$?
printf 'exit\0%s\0' "$status" >&3
oom_count
if [ "$status" = 137 ] && [ "$OOM" -gt "$oom_before" ] 2>/dev/null; then
    printf 'oom\0' >&3
fi
scan
if [ -n "$PIDS" ]; then
    printf 'survivors\0' >&3
    wait "$watcher"
else
    kill "$watcher" 2>/dev/null
fi
exit 0
