# cordon-remote content fetch (POSIX sh), for the fallback grep: reads NUL-separated absolute
# file names on stdin and writes a tar stream of them on stdout (several concatenated archives
# when xargs splits the list). With a literal pattern, only files that `grep -F` finds it in are
# sent. Invoked as
#   sh -c "$SCRIPT" cordon-fetch [LITERAL]
LC_ALL=C
export LC_ALL
if [ -n "$1" ]; then
    xargs -0 grep -l -F -e "$1" -- 2>/dev/null | while IFS= read -r f; do
        printf '%s\0' "$f"
    done | xargs -0 -r tar -cf - 2>/dev/null
else
    xargs -0 -r tar -cf - 2>/dev/null
fi
exit 0
