# cordon-remote kill script (POSIX sh): kill every process of one command, found by its tag and
# session. Invoked as
#   sh -c "$SCRIPT" cordon-kill TAG SESSION TICKS
# Prints the record `killed` or `stuck` (NUL-terminated) on stderr.
exec 3>&2 2>/dev/null
tag=$1
sess=$2
main=$2
start=0
ticks=$3
if killtree; then printf 'killed\0' >&3; else printf 'stuck\0' >&3; fi
