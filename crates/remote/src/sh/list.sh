# cordon-remote listing (POSIX sh): every entry under a search path, for find and for the
# fallback grep, plus the ignore files that decide what is skipped. Invoked as
#   sh -c "$SCRIPT" cordon-list PATH
# Output on stdout, NUL-terminated tokens:
#   T KIND                      kind of PATH itself: d f o or - (missing)
#   I FILE +LINE... -           an ignore file (.gitignore/.ignore) in PATH's ancestors or below
#   D DIR... <empty>            directories (PATH included), never inside .git
#   F FILE... <empty>           regular files
#   L KIND LINK... <empty>      symlinks with the kind of their target (f d o -)
# Error messages of find (unreadable directories) go to stderr as text lines.
LC_ALL=C
export LC_ALL
p=$1

kind() {
    if [ -f "$1" ]; then K=f
    elif [ -d "$1" ]; then K=d
    elif [ -e "$1" ]; then K=o
    else K=-
    fi
}

emit_ignore() {
    [ -f "$1" ] && [ -r "$1" ] || return 0
    printf 'I\0%s\0' "$1"
    while IFS= read -r line || [ -n "$line" ]; do
        printf '+%s\0' "$line"
    done <"$1"
    printf -- '-\0'
}

kind "$p"
printf 'T\0%s\0' "$K"
[ "$K" = d ] || [ "$K" = f ] || exit 0

# Ignore files of the ancestors, outermost first.
anc=
rest=${p#/}
while [ -n "$rest" ]; do
    emit_ignore "$anc/.gitignore"
    emit_ignore "$anc/.ignore"
    case $rest in
        */*) anc=$anc/${rest%%/*}; rest=${rest#*/} ;;
        *) rest= ;;
    esac
done
[ "$K" = d ] || { printf 'F\0%s\0\0' "$p"; exit 0; }

find "$p" \( -name .git -prune \) -o \( -name .gitignore -o -name .ignore \) -type f -exec sh -c '
    for f; do
        [ -r "$f" ] || continue
        printf "I\0%s\0" "$f"
        while IFS= read -r line || [ -n "$line" ]; do printf "+%s\0" "$line"; done <"$f"
        printf -- "-\0"
    done' cordon-list {} +
printf 'D\0'
find "$p" \( -name .git ! -path "$p" -prune \) -o -type d -print0 2>/dev/null
printf '\0F\0'
find "$p" \( -name .git -prune \) -o -type f -print0 2>/dev/null
printf '\0L\0'
find "$p" \( -name .git -prune \) -o -type l -exec sh -c '
    for l; do
        if [ -f "$l" ]; then k=f; elif [ -d "$l" ]; then k=d; elif [ -e "$l" ]; then k=o; else k=-; fi
        printf "%s\0%s\0" "$k" "$l"
    done' cordon-list {} + 2>/dev/null
printf '\0'
