# Process-tree helpers shared by the worker's exec requests and the kill script (POSIX sh, /proc).
# Expects:
#   $tag     the CORDON_EXEC_ID value marking the command's processes (setsid/nohup escapees keep
#            their environment)
#   $sess    the session that belongs to the command: the command shell's own (setsid), or the
#            worker's when commands run as job-control groups inside it; empty: none
#   $own     1 when $sess is this script's own session: its direct children (watcher, helpers)
#            are then not the command's
#   $main    the command shell's pid, or empty
#   $start   clock ticks since boot no later than the command's start (0: unknown)
#   $ticks   the SIGTERM -> SIGKILL grace in 50 ms ticks
#   $out     a path naming the output the command inherited (/proc/<worker>/fd/1), or empty: a
#            process holding it got it from the command, even with a scrubbed environment
#   $window  the largest time span (us) in which the PID counter cannot wrap, or empty
#   $t0      the time (us, see now_us) taken just before the command's shell was forked

# NOW = a time in microseconds: bash's EPOCHREALTIME, else /proc/uptime (10 ms steps; RES says
# by how much a span measured with it may fall short).
now_us() {
    if [ -n "${EPOCHREALTIME:-}" ]; then
        _e=$EPOCHREALTIME
        NOW=${_e%[.,]*}${_e#*[.,]}
        RES=0
    else
        _u=
        { read -r _u _x </proc/uptime; } 2>/dev/null
        case $_u in
            *.??) NOW=$(((${_u%.*} * 100 + 1${_u#*.} - 100) * 10000)) ;;
            *) NOW= ;;
        esac
        RES=10000
    fi
}

# UPTICKS = clock ticks (1/100 s) since boot, rounded down, minus one for safety.
up_ticks() {
    UPTICKS=0
    _u=
    { read -r _u _x </proc/uptime; } 2>/dev/null
    case $_u in
        *.??) UPTICKS=$((${_u%.*} * 100 + 1${_u#*.} - 100 - 1)) ;;
    esac
}

# Whether process $1 exists and is not a zombie.
live() {
    _st=
    { read -r _st <"/proc/$1/stat"; } 2>/dev/null || return 1
    set -- ${_st##*) }
    [ -n "$1" ] && [ "$1" != Z ]
}

# A byte no environment record holds: records are compared between two of them.
_soh=$(printf '\001')

# Whether process $1 is tagged in its environment: a record exactly `CORDON_EXEC_ID=<tag>`. Two
# things hide the tag of a process in the middle of execve: its environment reads as empty until
# the new image's is set up, and a read that spans the exec is cut short where the old image went
# away. So the environment is read in a single read call (`dd`, 16 MiB: the kernel reads it whole
# in one call; the shell's own `read` takes a byte at a time, `cat` 64 or 128 KiB), and an empty
# one is read again, every 10 ms, while the process lives and its environment can be opened; one
# that stays empty (started with `env -i`) is not tagged. The re-reads are counted in _retries
# and share one bound of 20 per check (`quick`, `scan` reset it): processes started with an
# empty environment cannot stretch a check by 200 ms each.
_retries=0
tagged() {
    { true <"/proc/$1/environ"; } 2>/dev/null || return 1
    while :; do
        _env=$(dd if="/proc/$1/environ" bs=16M count=1 2>/dev/null | tr '\0' '\1')
        case "$_soh$_env" in *"${_soh}CORDON_EXEC_ID=$tag${_soh}"*) return 0 ;; esac
        # Any bytes, NULs too (setproctitle pads with them), mean it was read.
        [ -n "$_env" ] && return 1
        [ "$_retries" -lt 20 ] && live "$1" || return 1
        _retries=$((_retries + 1))
        sleep 0.01
    done
}

# Whether process $1 can write to the command's output ($out): a descriptor on the same pipe
# opened for writing (the reader, sshd or the test harness, holds the same pipe read-only).
holds_out() {
    [ -n "$out" ] || return 1
    for _f in /proc/"$1"/fd/*; do
        [ "$_f" -ef "$out" ] || continue
        _fl=
        while read -r _k _v; do
            [ "$_k" = flags: ] && { _fl=$_v; break; }
        done 2>/dev/null <"/proc/$1/fdinfo/${_f##*/}" || :
        # O_WRONLY or O_RDWR in the octal flags' last digit.
        case $_fl in *[123567]) return 0 ;; esac
    done
    return 1
}

# Whether process $1 is the command's: its shell, a member of its session or group (not this
# script's own helpers), or tagged, or holding its output. Zombies and vanished processes are not.
member() {
    _line=
    { read -r _line <"/proc/$1/stat"; } 2>/dev/null || return 1
    [ -n "$_line" ] || return 1
    _m=$1
    set -- ${_line##*) }
    [ "$1" = Z ] && return 1
    # A kernel thread (PF_KTHREAD in the flags) is nobody's command.
    [ $((${7:-0} & 2097152)) = 0 ] || return 1
    [ "$_m" = "$main" ] && return 0
    if [ -n "$sess" ] && { [ "$3" = "$sess" ] || [ "$4" = "$sess" ]; }; then
        [ "$own" = 1 ] && [ "$2" = "$$" ] && return 1
        return 0
    fi
    [ "$2" = "$$" ] && return 1
    tagged "$_m" && return 0
    holds_out "$_m"
}

# The fast check once the command's shell was reaped: only the PIDs handed out since the shell's
# can belong to the command, so those few are examined instead of all of /proc. That is exact
# as long as the PID counter did not wrap meanwhile, so it is only trusted when the last PID
# handed out (/proc/loadavg) is at most 256 past the shell's and less time has passed than the
# kernel needs to hand out half of pid_max PIDs at one per microsecond ($window). Sets PIDS;
# returns 1 when the full scan is needed instead.
quick() {
    PIDS=
    _retries=0
    [ -n "$main" ] && [ -n "$window" ] && [ -n "$t0" ] || return 1
    _last=
    { read -r _x _x _x _x _last _x </proc/loadavg; } 2>/dev/null || return 1
    case $_last in '' | *[!0-9]*) return 1 ;; esac
    [ "$_last" -ge "$main" ] && [ $((_last - main)) -le 256 ] || return 1
    now_us
    [ -n "$NOW" ] || return 1
    _span=$((NOW - t0 + RES))
    [ "$_span" -ge 0 ] && [ "$_span" -le "$window" ] || return 1
    _n=$((main + 1))
    while [ "$_n" -le "$_last" ]; do
        if [ "$_n" != "$watcher" ] && [ -e "/proc/$_n" ] && member "$_n"; then
            PIDS="$PIDS $_n"
        fi
        _n=$((_n + 1))
    done
    return 0
}

# The full scan: set PIDS to every live process of the command. Environments and descriptors are
# only examined for processes that could be escapees: started no earlier than the command
# ($start, clock ticks), not children of this script, and — inside a PID namespace (exec'd
# processes have PPID 0) — orphans (parent PID 1), since such a process with a living parent is
# found once that parent is killed. A few are read with shell builtins, more with one grep.
scan() {
    PIDS=
    _retries=0
    _cand=
    _whole=
    _ncand=0
    for _d in /proc/[0-9]*; do
        _p=${_d#/proc/}
        [ "$_p" = "$$" ] && continue
        _line=
        { read -r _line <"$_d/stat"; } 2>/dev/null || continue
        [ -n "$_line" ] || continue
        set -- ${_line##*) }
        [ "$1" = Z ] && continue
        if [ "$_p" = "$main" ]; then
            PIDS="$PIDS $_p"
        elif [ -n "$sess" ] && { [ "$3" = "$sess" ] || [ "$4" = "$sess" ]; }; then
            [ "$own" = 1 ] && [ "$2" = "$$" ] && continue
            PIDS="$PIDS $_p"
        elif [ "$2" != "$$" ] && [ "${20}" -ge "${start:-0}" ] && { [ "$PPID" != 0 ] || [ "$2" = 1 ]; } &&
            [ $((${7:-0} & 2097152)) = 0 ]; then
            _cand="$_cand $_p"
            _ncand=$((_ncand + 1))
            # An environment grep might not read in one call (over 64 KiB), or one not set up
            # (env_end 0: in the middle of execve, or not ours to see), goes to `tagged`.
            case ${49:-} in
                '') ;;
                0) _whole="$_whole $_p " ;;
                *) [ $((${49} - ${48:-0})) -le 65536 ] || _whole="$_whole $_p " ;;
            esac
        fi
    done
    [ "$_ncand" = 0 ] && return 0
    _rest=
    if [ "$_ncand" -le 3 ]; then
        for _p in $_cand; do
            if tagged "$_p"; then PIDS="$PIDS $_p"; else _rest="$_rest $_p"; fi
        done
    else
        _files=
        for _p in $_cand; do
            case $_whole in *" $_p "*) ;; *) _files="$_files $_p/environ" ;; esac
        done
        # One read of each environment, reduced to a line "T:PID/environ" for a tagged one and
        # "N:PID/environ" for one that is not; none for one that read as empty (see `tagged`:
        # in the middle of execve, gone, or started without an environment), which is then
        # looked at again by `tagged`, as is one grep does not read (`_whole`). grep prints only the tag or a record's first letter,
        # never a value, so no line can be forged by what a process puts in its environment.
        # The letter is never C: a grep may print the shorter of two matches (busybox's does),
        # and the tag's record must print as the tag; an environment of C… records only is
        # left to `tagged`.
        _hits=
        [ -z "$_files" ] || _hits=$(cd /proc && grep -o -H -z -E -e "^CORDON_EXEC_ID=$tag\$" -e '^[A-BD-Za-z_]' $_files 2>/dev/null |
            tr '\0' '\n' |
            awk -F: -v t="CORDON_EXEC_ID=$tag" '
                $2 == t { s[$1] = "T"; next }
                !($1 in s) { s[$1] = "N" }
                END { for (f in s) print s[f] ":" f }')
        for _p in $_cand; do
            case "
$_hits
" in
                *"
T:$_p/environ
"*) PIDS="$PIDS $_p" ;;
                *"
N:$_p/environ
"*) _rest="$_rest $_p" ;;
                *)
                    if tagged "$_p"; then PIDS="$PIDS $_p"; else _rest="$_rest $_p"; fi
                    ;;
            esac
        done
    fi
    [ -n "$out" ] || return 0
    for _p in $_rest; do
        holds_out "$_p" && PIDS="$PIDS $_p"
    done
    return 0
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
