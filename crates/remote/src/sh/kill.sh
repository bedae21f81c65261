# cordon-remote kill script (POSIX sh): kill every process of one command, found by its tag,
# its shell and its session. Invoked as
#   sh -c "$SCRIPT" cordon-kill TAG PID SESSION TICKS
# Prints the record `killed` or `stuck` (NUL-terminated) on stderr.
exec 3>&2 2>/dev/null
tag=$1
main=$2
sess=$3
ticks=$4
own=0
start=0
out=
if killtree; then printf 'killed\0' >&3; else printf 'stuck\0' >&3; fi
