# Process-tree helpers shared by the exec wrapper and the kill script (POSIX sh, /proc).
# Expects: $tag (the CORDON_EXEC_ID value marking a command's processes), $sess (the session id
# of the command's shell, or empty), $main (the shell's pid, or empty), $start (the shell's
# start time, or 0) and $ticks (the grace period in 50 ms ticks).

# Set PIDS to every live process of the command: the shell, its session/group, and processes
# tagged in their environment (setsid/nohup escapees keep their environment). Environments
# are only read for processes that could be escapees: started no earlier than the shell
# ($start, clock ticks), not children of this script, and — inside a PID namespace (exec'd
# processes have PPID 0) — orphans (parent PID 1), since a tagged process with a living parent
# is found once that parent is killed. A few are read with shell builtins, more with one grep.
scan() {
    PIDS=
    _cand=
    _ncand=0
    for _d in /proc/[0-9]*; do
        _p=${_d#/proc/}
        [ "$_p" = "$$" ] && continue
        _line=
        { read -r _line <"$_d/stat"; } 2>/dev/null || continue
        [ -n "$_line" ] || continue
        set -- ${_line##*) }
        [ "$1" = Z ] && continue
        if [ "$_p" = "$main" ] || { [ -n "$sess" ] && { [ "$3" = "$sess" ] || [ "$4" = "$sess" ]; }; }; then
            PIDS="$PIDS $_p"
        elif [ "$2" != "$$" ] && [ "${20}" -ge "${start:-0}" ] && { [ "$PPID" != 0 ] || [ "$2" = 1 ]; }; then
            _cand="$_cand $_p"
            _ncand=$((_ncand + 1))
        fi
    done
    [ "$_ncand" = 0 ] && return 0
    if [ "$_ncand" -le 3 ]; then
        for _p in $_cand; do
            _l=
            while IFS= read -r _l || [ -n "$_l" ]; do
                case $_l in *"CORDON_EXEC_ID=$tag"*) PIDS="$PIDS $_p"; break ;; esac
                _l=
            done 2>/dev/null <"/proc/$_p/environ" || :
        done
    else
        _files=
        for _p in $_cand; do _files="$_files $_p/environ"; done
        _hits=$(cd /proc && grep -l -z -x -F "CORDON_EXEC_ID=$tag" $_files 2>/dev/null)
        for _p in $_cand; do
            case "
$_hits
" in *"
$_p/environ
"*) PIDS="$PIDS $_p" ;; esac
        done
    fi
}

# The start time (clock ticks since boot) of process $1, in START (0 when unknown).
start_of() {
    START=0
    _line=
    { read -r _line <"/proc/$1/stat"; } 2>/dev/null || return 0
    set -- ${_line##*) }
    START=${20:-0}
}

# SIGTERM everything (again each tick during the grace, for processes found late), then
# SIGKILL until nothing is left (new forks are caught by rescanning). Returns 1 if processes
# survive 10 s of SIGKILL (uninterruptible sleep).
killtree() {
    scan
    [ -z "$PIDS" ] && return 0
    kill -TERM $PIDS 2>/dev/null
    kill -CONT $PIDS 2>/dev/null
    _n=0
    while :; do
        sleep 0.05
        scan
        [ -z "$PIDS" ] && return 0
        _n=$((_n + 1))
        if [ "$_n" -ge "$ticks" ]; then
            kill -KILL $PIDS 2>/dev/null
        else
            kill -TERM $PIDS 2>/dev/null
            kill -CONT $PIDS 2>/dev/null
        fi
        [ "$_n" -ge $((ticks + 200)) ] && return 1
    done
}
