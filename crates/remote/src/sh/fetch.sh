# cordon-remote content fetch (POSIX sh), for the fallback grep: reads NUL-separated absolute
# file names on stdin and writes a tar stream of them on stdout (several concatenated archives
# when xargs splits the list). With a literal pattern, only files that `grep -F` finds it in are
# sent. Unreadable files are named on stderr, one per line (`unreadable PATH`). Invoked as
#   sh -c "$SCRIPT" cordon-fetch [LITERAL]
LC_ALL=C
export LC_ALL
list=$(mktemp 2>/dev/null || echo "/tmp/cordon-fetch-$$")
cat >"$list"
xargs -0 -r sh -c 'for f; do [ -r "$f" ] || printf "unreadable %s\n" "$f" >&2; done' cordon-fetch <"$list"
exec <"$list"
rm -f "$list"
if [ -n "$1" ]; then
    xargs -0 grep -l -F -e "$1" -- 2>/dev/null | while IFS= read -r f; do
        printf '%s\0' "$f"
    done | xargs -0 -r tar -cf - 2>/dev/null
else
    xargs -0 -r tar -cf - 2>/dev/null
fi
exit 0
