# cordon-remote content fetch (POSIX sh), for the fallback grep. stdin: a line with a byte
# count, then that many bytes of NUL-separated absolute file names; after that, stdin is the
# control input: a line or EOF kills the fetch (the client stopped reading). stdout: a tar
# stream of the files (several concatenated archives when xargs splits the list); with a
# literal pattern only files that `grep -F` finds it in are sent. stderr: `unreadable PATH`
# lines. Invoked as
#   sh -c "$SCRIPT" cordon-fetch [LITERAL]
LC_ALL=C
export LC_ALL
IFS= read -r len || exit 0
case $len in '' | *[!0-9]*) exit 0 ;; esac
list=$(mktemp 2>/dev/null || echo "/tmp/cordon-fetch-$$")
head -c "$len" >"$list"
xargs -0 -r sh -c 'for f; do [ -r "$f" ] || printf "unreadable %s\n" "$f" >&2; done' cordon-fetch <"$list"
pipeline='if [ -n "$1" ]; then
        xargs -0 grep -l -F -e "$1" -- 2>/dev/null | while IFS= read -r f; do
            printf "%s\0" "$f"
        done | xargs -0 -r tar -cf - 2>/dev/null
    else
        xargs -0 -r tar -cf - 2>/dev/null
    fi'
exec 5<&0
if command -v setsid >/dev/null; then
    setsid sh -c "$pipeline" cordon-fetch "$1" <"$list" 5<&- &
else
    sh -c "$pipeline" cordon-fetch "$1" <"$list" 5<&- &
fi
job=$!
( IFS= read -r _; kill -TERM -"$job" "$job" 2>/dev/null ) <&5 &
guard=$!
wait "$job"
kill "$guard" 2>/dev/null
rm -f "$list"
exit 0
