# The exec request (POSIX sh), a function of the worker:
#   cordon_exec TAG CWD COMMAND TICKS [NAME=VALUE...]
# Runs COMMAND with `bash -c` (`sh -c` without bash) in CWD, in its own process group and
# session (see worker_init), stdin from /dev/null, stdout+stderr merged on the worker's stdout,
# CORDON_EXEC_ID=TAG and the given variables in its environment. Records on fd 3:
#   nocwd | pid PID | sess SID | exit STATUS | oom | survivors | killed | stuck
# fd 5 is the control input: a line (`kill`) or EOF (the client went away) kills the command's
# whole tree: SIGTERM, TICKS x 50 ms grace, SIGKILL. After the shell exits, leftover processes
# are reported with `survivors` and killed once the client sends `kill` (after its output idle
# grace), so nothing outlives the call; the request returns once nothing is left.
oom_count() {
    OOM=0
    [ -n "$oom_file" ] || return 0
    while read -r _k _v; do
        [ "$_k" = oom_kill ] && { OOM=$_v; return 0; }
    done <"$oom_file"
}

cordon_exec() {
    tag=$1
    cwd=$2
    cmd=$3
    ticks=$4
    shift 4
    main=
    watcher=
    PIDS=
    cd "$cwd" 2>/dev/null || {
        printf 'nocwd\0' >&3
        return 0
    }
    oom_count
    oom_before=$OOM
    up_ticks
    start=$UPTICKS
    now_us
    t0=$NOW
    [ "$mode" = jobs ] && set -m
    if [ $# -gt 0 ]; then
        (
            export "$@"
            CORDON_EXEC_ID=$tag
            export CORDON_EXEC_ID
            exec $launcher "$shell" -c "$cmd"
        ) </dev/null 2>&1 3>&- 5<&- &
    else
        CORDON_EXEC_ID=$tag $launcher "$shell" -c "$cmd" </dev/null 2>&1 3>&- 5<&- &
    fi
    main=$!
    [ "$mode" = jobs ] && set +m
    case $mode in
        jobs) sess=$$ ;;
        setsid) sess=$main ;;
        *) sess= ;;
    esac
    printf 'pid\0%s\0sess\0%s\0' "$main" "$sess" >&3
    (
        IFS= read -r _line
        if killtree; then printf 'killed\0' >&3; else printf 'stuck\0' >&3; fi
    ) <&5 &
    watcher=$!
    wait "$main"
    status=$?
    printf 'exit\0%s\0' "$status" >&3
    if [ "$status" = 137 ] && [ -n "$oom_file" ]; then
        oom_count
        [ "$OOM" -gt "$oom_before" ] 2>/dev/null && printf 'oom\0' >&3
    fi
    quick || scan
    if [ -n "$PIDS" ]; then
        printf 'survivors\0' >&3
    else
        kill "$watcher" 2>/dev/null
    fi
    wait "$watcher"
    main=
    watcher=
}
