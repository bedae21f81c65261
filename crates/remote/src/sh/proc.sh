# Process-tree helpers shared by the exec wrapper and the kill script (POSIX sh, /proc).
# Expects: $tag (the CORDON_EXEC_ID value marking a command's processes), $sess (the session id
# of the command's shell, or empty), $main (the shell's pid, or empty) and $ticks (the grace
# period in 50 ms ticks).

# Set PIDS to every live process of the command: tagged in its environment (this catches
# setsid/nohup escapees, which keep their environment) or in the command's session/group.
scan() {
    PIDS=
    _env_hits=$(grep -l -z -x -F "CORDON_EXEC_ID=$tag" /proc/[0-9]*/environ 2>/dev/null)
    for _d in /proc/[0-9]*; do
        _p=${_d#/proc/}
        [ "$_p" = "$$" ] && continue
        _line=
        { read -r _line <"$_d/stat"; } 2>/dev/null || continue
        [ -n "$_line" ] || continue
        set -- ${_line##*) }
        [ "$1" = Z ] && continue
        _hit=
        if [ "$_p" = "$main" ]; then
            _hit=1
        elif [ -n "$sess" ] && { [ "$3" = "$sess" ] || [ "$4" = "$sess" ]; }; then
            _hit=1
        else
            case "
$_env_hits
" in *"
$_d/environ
"*) _hit=1 ;; esac
        fi
        [ -n "$_hit" ] && PIDS="$PIDS $_p"
    done
}

# SIGTERM everything, wait up to the grace period, then SIGKILL until nothing is left (new
# forks are caught by rescanning). Returns 1 if processes survive 10 s of SIGKILL (D state).
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
        fi
        [ "$_n" -ge $((ticks + 200)) ] && return 1
    done
}
