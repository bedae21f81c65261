# cordon-remote worker (POSIX sh; bash when the host has it). Two ways to run it:
#   sh -c "$SCRIPT" cordon-worker OP ARG...    one request from the arguments, then exit
#   sh -c "$SCRIPT" cordon-worker              requests from stdin, one after another
# OP is `exec` (cordon_exec) or `fs` (cordon_fs, in a subshell). Records go to fd 3 (this exec's
# stderr) as NUL-terminated fields; stderr itself is discarded; stdin is the control input.
# On stdin the worker first prints `ready`, then reads request lines
#   cordon-req ID OP ARG...
# whose words are single-quoted for `eval` (a newline inside a word is written '"$NL"'). Other
# lines (a late `kill`) are ignored. After each request it prints the end marker
# NUL ESC `cordon-end-ID` NUL on stdout and the record `done ID`: all output of the request
# comes before them. EOF on stdin ends the worker.
exec 3>&2 2>/dev/null 5<&0
NL='
'

# Facts fixed for the worker's life: the command shell; how commands get their own process
# group and session (bash job control inside the worker's own session when it leads one,
# which sshd and docker exec arrange, else setsid(1) per command, else neither); the fast
# check's time window; the cgroup OOM counter; the output commands inherit.
worker_init() {
    if command -v bash >/dev/null 2>&1; then shell=bash; else shell=sh; fi
    _lead=
    { read -r _lead <"/proc/$$/stat"; } 2>/dev/null
    set -- ${_lead##*) }
    if [ -n "${BASH_VERSION:-}" ] && [ "${4:-}" = "$$" ]; then
        mode=jobs
        launcher=
        own=1
    elif command -v setsid >/dev/null 2>&1; then
        mode=setsid
        launcher=setsid
        own=0
    else
        mode=none
        launcher=
        own=0
    fi
    window=
    _pm=
    { read -r _pm </proc/sys/kernel/pid_max; } 2>/dev/null
    case $_pm in '' | *[!0-9]*) ;; *) window=$((_pm / 2)) ;; esac
    oom_file=
    for _f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
        [ -r "$_f" ] && { oom_file=$_f; break; }
    done
    out=/proc/$$/fd/1
    [ -e "$out" ] || out=
}

dispatch() {
    _op=$1
    shift
    case $_op in
        exec) cordon_exec "$@" ;;
        fs) (cordon_fs "$@") <&5 ;;
    esac
}

worker_init
if [ $# -gt 0 ]; then
    dispatch "$@"
    exit 0
fi
printf 'ready\0' >&3
while IFS= read -r _req <&5; do
    case $_req in "cordon-req "*) ;; *) continue ;; esac
    eval "set -- ${_req#cordon-req }"
    _id=$1
    shift
    dispatch "$@"
    printf '\000\033cordon-end-%s\000' "$_id"
    printf 'done\0%s\0' "$_id" >&3
done
exit 0
