# cordon-remote file helper (POSIX sh), a function of the worker (run in a subshell):
#   cordon_fs OP NROOTS ROOT... ARG...
# Control records go to fd 3 (the exec's stderr) as NUL-terminated fields; file data goes to
# stdout; everything else the helper's commands print on stderr is captured or discarded, so
# the record stream stays parseable. Records:
#   canon PATH | err CODE PATH MESSAGE | ok | stat KIND SIZE MODE UID GID | ent NAME KIND ERROR
# CODE is one of outside notfound notdir isdir access loop io. After `run`'s `canon PATH ok`
# the stream carries the command's own stderr. Interactive operations read fd 0.

rec() { for f in "$@"; do printf '%s\0' "$f" >&3; done; }
fail() { rec err "$1" "$2" "$3"; exit 0; }
_nl='
'

# Resolve $1 like realpath(3), component by component, without requiring the tail to exist:
# symlinks are followed (at most 40), `..` after a resolved prefix is exact, components after
# the first missing one are appended lexically. Sets CANON; returns 1 on ELOOP, 2 on ENOTDIR.
canon() {
    _rest=$1
    _cur=
    _hops=0
    while :; do
        while :; do
            case $_rest in /*) _rest=${_rest#/} ;; *) break ;; esac
        done
        [ -z "$_rest" ] && break
        case $_rest in
            */*) _c=${_rest%%/*}; _rest=${_rest#*/} ;;
            *) _c=$_rest; _rest= ;;
        esac
        case $_c in
            .) continue ;;
            ..) _cur=${_cur%/*}; continue ;;
        esac
        _next=$_cur/$_c
        if [ -L "$_next" ]; then
            _hops=$((_hops + 1))
            [ "$_hops" -gt 40 ] && return 1
            _t=$(readlink -- "$_next") || return 1
            case $_t in /*) _cur= ;; esac
            if [ -n "$_rest" ]; then _rest=$_t/$_rest; else _rest=$_t; fi
        elif [ -e "$_next" ]; then
            if [ -n "$_rest" ] && [ ! -d "$_next" ]; then
                CANON=$_next
                return 2
            fi
            _cur=$_next
        else
            _cur=$_next
            while [ -n "$_rest" ]; do
                case $_rest in
                    */*) _c=${_rest%%/*}; _rest=${_rest#*/} ;;
                    *) _c=$_rest; _rest= ;;
                esac
                case $_c in
                    '' | .) ;;
                    ..) _cur=${_cur%/*} ;;
                    *) _cur=$_cur/$_c ;;
                esac
            done
            break
        fi
    done
    CANON=${_cur:-/}
    return 0
}

within() {
    _p=$1
    _old_ifs=$IFS
    IFS='
'
    for _r in $roots; do
        case $_p in "$_r" | "$_r"/*) IFS=$_old_ifs; return 0 ;; esac
        [ "$_r" = / ] && { IFS=$_old_ifs; return 0; }
    done
    IFS=$_old_ifs
    return 1
}

# Canonicalise and confine $1; sets C or reports the error and exits.
resolve() {
    canon "$1"
    case $? in
        0) ;;
        1) fail loop "$1" "too many levels of symbolic links" ;;
        2) fail notdir "$1" "not a directory" ;;
    esac
    C=$CANON
    within "$C" || fail outside "$1" "outside the allowed roots"
}

kind_of() {
    if [ -d "$1" ]; then K=d
    elif [ -f "$1" ]; then K=f
    elif [ -e "$1" ]; then K=o
    else K=
    fi
}

io_code() { # classify an error message from a failed command
    case $1 in
        *"No such file"*) echo notfound ;;
        *"Not a directory"*) echo notdir ;;
        *"Is a directory"*) echo isdir ;;
        *"Permission denied"* | *"Operation not permitted"*) echo access ;;
        *) echo io ;;
    esac
}

cordon_fs() {
    LC_ALL=C
    export LC_ALL
    op=$1
    nroots=$2
    shift 2
    roots=
    i=0
    while [ "$i" -lt "$nroots" ]; do
        roots="$roots$1$_nl"
        shift
        i=$((i + 1))
    done
    exec 4>&1
    case $op in
    canon)
        resolve "$1"
        rec canon "$C" ok
        ;;
    read)
        resolve "$1"
        rec canon "$C"
        [ -e "$C" ] || fail notfound "$1" "no such file or directory"
        [ -d "$C" ] && fail isdir "$1" "is a directory"
        [ -f "$C" ] || fail io "$1" "not a regular file"
        [ -r "$C" ] || fail access "$1" "permission denied"
        if [ -n "${3:-}" ] && [ "$3" != 0 ]; then
            # tail seeks to the offset on a regular file; only `$2` bytes are ever read.
            msg=$({ tail -c +"$(($3 + 1))" -- "$C" | head -c "$2"; } 2>&1 >&4)
        elif [ -n "$2" ]; then
            msg=$(head -c "$2" -- "$C" 2>&1 >&4)
        else
            msg=$(cat -- "$C" 2>&1 >&4)
        fi
        st=$?
        [ "$st" -eq 0 ] || fail "$(io_code "$msg")" "$1" "${msg:-read failed}"
        rec ok
        ;;
    stat)
        resolve "$1"
        rec canon "$C"
        [ -e "$C" ] || fail notfound "$1" "no such file or directory"
        s=$(stat -L -c '%f %s %u %g' -- "$C" 2>&1) || fail "$(io_code "$s")" "$1" "$s"
        kind_of "$C"
        set -- $s
        rec stat "$K" "$2" "$1" "$3" "$4" ok
        ;;
    list)
        resolve "$1"
        rec canon "$C"
        [ -e "$C" ] || fail notfound "$1" "no such file or directory"
        [ -d "$C" ] || fail notdir "$1" "not a directory"
        { [ -r "$C" ] && [ -x "$C" ]; } || fail access "$1" "permission denied"
        dir=$C
        [ "$dir" = / ] && dir=
        for e in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
            [ -e "$e" ] || [ -L "$e" ] || continue
            name=${e##*/}
            if [ -L "$e" ]; then
                canon "$e"
                case $? in
                    0)
                        if ! within "$CANON"; then
                            rec ent "$name" "" "path is outside the allowed roots: $CANON"
                            continue
                        fi
                        kind_of "$CANON"
                        if [ -z "$K" ]; then
                            rec ent "$name" "" "No such file or directory (os error 2)"
                        else
                            rec ent "$name" "$K" ""
                        fi
                        ;;
                    1) rec ent "$name" "" "Too many levels of symbolic links (os error 40)" ;;
                    *) rec ent "$name" "" "Not a directory (os error 20)" ;;
                esac
            else
                kind_of "$e"
                rec ent "$name" "${K:-o}" ""
            fi
        done
        rec ok
        ;;
    mkdir)
        # Interactive: after `canon`, stdin carries "go\n" (anything else aborts untouched).
        resolve "$1"
        rec canon "$C"
        IFS= read -r answer || exit 0
        [ "$answer" = go ] || exit 0
        if [ -e "$C" ] && [ ! -d "$C" ]; then fail notdir "$1" "not a directory"; fi
        msg=$(mkdir -p -- "$C" 2>&1) || fail "$(io_code "$msg")" "$1" "$msg"
        rec ok
        ;;
    write)
        # $1 = path. Interactive: after `canon`, stdin carries "go LENGTH\n" and exactly LENGTH
        # bytes (anything else aborts before the target is touched).
        # Checks that need the file system run after the answer, so the client always learns
        # the canonical path first (and judges its rules on it).
        resolve "$1"
        rec canon "$C"
        IFS= read -r answer || exit 0
        case $answer in "go "*) len=${answer#go } ;; *) exit 0 ;; esac
        case $len in '' | *[!0-9]*) exit 0 ;; esac
        [ -d "$C" ] && fail isdir "$1" "is a directory"
        # Replacing a file needs write permission on the FILE too (not only its directory), as
        # for any unprivileged writer: a 0444 file stays read-only.
        if [ -e "$C" ] && [ ! -w "$C" ]; then fail access "$1" "permission denied"; fi
        parent=${C%/*}
        [ -z "$parent" ] && parent=/
        [ -e "$parent" ] || fail notfound "$1" "no such file or directory"
        [ -d "$parent" ] || fail notdir "$1" "not a directory"
        mode=
        if [ -e "$C" ]; then
            mode=$(stat -L -c '%a' -- "$C" 2>/dev/null) || mode=
        fi
        if [ -z "$mode" ]; then
            mode=$(printf '%o' $(( 0644 & ~0$(umask) )))
        fi
        base=${C##*/}
        # Cordon's temp naming on every backend (.NAME.cordon-<16 hex>.tmp): listings and
        # searches leave it out, and a later session removes one a killed writer left.
        rand=$(od -An -N8 -tx1 /dev/urandom 2>/dev/null | tr -d ' \n')
        case $rand in *[!0-9a-f]*) rand= ;; esac
        [ ${#rand} -eq 16 ] || rand=$(printf '%016x' "$$")
        tmp=$parent/.$base.cordon-$rand.tmp
        umask 077
        msg=$( { head -c "$len" >"$tmp"; } 2>&1 ) || {
            rm -f -- "$tmp"
            fail "$(io_code "$msg")" "$1" "$msg"
        }
        got=$(wc -c <"$tmp")
        got=$((got + 0))
        if [ "$got" != "$len" ]; then
            rm -f -- "$tmp"
            fail io "$1" "input ended after $got of $len bytes; the file was not changed"
        fi
        msg=$(chmod "$mode" -- "$tmp" 2>&1) || { rm -f -- "$tmp"; fail "$(io_code "$msg")" "$1" "$msg"; }
        msg=$(mv -f -- "$tmp" "$C" 2>&1) || { rm -f -- "$tmp"; fail "$(io_code "$msg")" "$1" "$msg"; }
        rec ok
        ;;
    spill)
        # $1 = spill directory, $2 = file name. Creates the file exclusively (0600), reports it,
        # then appends stdin to it until EOF.
        umask 077
        msg=$(mkdir -p -- "$1" 2>&1) || fail "$(io_code "$msg")" "$1" "$msg"
        set -C
        msg=$( { : >"$1/$2"; } 2>&1) || fail "$(io_code "$msg")" "$1/$2" "$msg"
        set +C
        rec canon "$1/$2" ok
        exec cat >>"$1/$2"
        ;;
    run)
        # $1 = path, then a command: resolve and confine the path, report it, then run the
        # command with the canonical path appended (its stderr restored) — one exec for both.
        # The command runs in its own session; a line on stdin, or EOF (the client stopped
        # reading or went away), kills it, so a search cut at its limit never lingers blocked.
        resolve "$1"
        [ -e "$C" ] || fail notfound "$1" "no such file or directory"
        rec canon "$C" ok
        shift
        exec 5<&0
        if command -v setsid >/dev/null; then
            setsid "$@" "$C" 2>&3 3>&- 4>&- 5<&- </dev/null &
        else
            "$@" "$C" 2>&3 3>&- 4>&- 5<&- </dev/null &
        fi
        cmd=$!
        ( IFS= read -r _; kill -TERM -"$cmd" "$cmd" 2>/dev/null ) <&5 3>&- 4>&- &
        guard=$!
        wait "$cmd"
        kill "$guard" 2>/dev/null
        exit 0
        ;;
    cleanup)
        # $1 = spill directory, $2 = age in minutes: remove older spill files.
        if [ -d "$1" ]; then
            find "$1" -maxdepth 1 -type f -name 'cordon-bash-*.log' -mmin +"$2" -exec rm -f {} \;
        fi
        rec ok
        ;;
    *)
        fail io "$op" "unknown operation"
        ;;
    esac
}
