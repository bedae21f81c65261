#!/usr/bin/env bash
# Build `cordon` and `cordon-helper` (the program remote hosts run, docs/helper.md) for
# installing: stripped, whole-program LTO, statically linked (no shared libraries, not even
# libc), into dist/ with a SHA256SUMS file.
#
#   scripts/release.sh                       # x86_64, plus aarch64 where its toolchain is present
#   scripts/release.sh --arch x86_64         # one architecture (repeatable; an explicitly asked
#                                            # architecture that cannot be built is an error)
#   options: --out DIR (default dist/)
#
# x86_64 links against musl (rustup target x86_64-unknown-linux-musl, added when missing, plus
# musl-gcc from Debian's musl-tools for the C code of the TLS library); when either cannot be had
# it falls back to glibc's static libraries (`-C target-feature=+crt-static` on
# x86_64-unknown-linux-gnu). aarch64 is a cross build on x86_64-unknown-linux-gnu's sibling
# aarch64-unknown-linux-gnu with +crt-static; it needs that rustup target and the
# gcc-aarch64-linux-gnu package and is skipped with a message when they are missing. The commit
# `cordon --version` prints is HEAD (with `-dirty` when tracked files differ from it); set
# CORDON_COMMIT to override. Uses the `dist` cargo profile, niced, and CARGO_TARGET_DIR when set.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$here/dist"
arches=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift ;;
        --arch)
            case "$2" in
                x86_64|aarch64) arches+=("$2") ;;
                *) echo "release: unknown architecture $2 (x86_64 or aarch64)" >&2; exit 2 ;;
            esac
            shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "release: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
explicit=1
if [ "${#arches[@]}" = 0 ]; then
    arches=(x86_64 aarch64)
    explicit=0
fi

log() { printf 'release: %s\n' "$*" >&2; }

cd "$here"
target_dir="${CARGO_TARGET_DIR:-$here/target}"
if [ -z "${CORDON_COMMIT:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
    CORDON_COMMIT="$(git rev-parse --short=12 HEAD)"
    if ! git diff --quiet HEAD -- 2>/dev/null; then
        CORDON_COMMIT="$CORDON_COMMIT-dirty"
    fi
fi
export CORDON_COMMIT="${CORDON_COMMIT:-unknown}"

have_target() { rustup target list --installed 2>/dev/null | grep -qx "$1"; }
# The target's standard library, installed with rustup when missing (needs network access to
# the Rust toolchain server; fails cleanly without it).
ensure_target() {
    have_target "$1" && return 0
    command -v rustup >/dev/null 2>&1 || return 1
    log "adding rustup target $1"
    rustup target add "$1" >&2 || return 1
}

bin=""
helper=""
build() { # $1 = rust target, $2 = extra RUSTFLAGS; sets bin and helper to the binaries' paths
    local target="$1" flags="$2"
    log "building $target (profile dist${flags:+, RUSTFLAGS=$flags})"
    RUSTFLAGS="${RUSTFLAGS:-}${flags:+ $flags}" nice -n 10 \
        cargo build --locked --profile dist -p cordon -p cordon-helper --target "$target" >&2
    bin="$target_dir/$target/dist/cordon"
    helper="$target_dir/$target/dist/cordon-helper"
}

# A static binary has no program interpreter and needs no shared library.
assert_static() { # $1 = binary
    local headers
    headers="$(LC_ALL=C readelf -l -d "$1")"
    if grep -q 'program interpreter' <<<"$headers" || grep -q '(NEEDED)' <<<"$headers"; then
        log "$1 is not statically linked:"
        grep -E 'program interpreter|\(NEEDED\)' <<<"$headers" >&2
        exit 1
    fi
}

built=()
for arch in "${arches[@]}"; do
    case "$arch" in
        x86_64)
            if ensure_target x86_64-unknown-linux-musl && command -v musl-gcc >/dev/null 2>&1; then
                log "x86_64: musl"
                build x86_64-unknown-linux-musl ""
            else
                log "x86_64: musl unavailable (rustup target x86_64-unknown-linux-musl and musl-gcc from musl-tools); using glibc with +crt-static"
                build x86_64-unknown-linux-gnu "-C target-feature=+crt-static"
            fi
            ;;
        aarch64)
            if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! ensure_target aarch64-unknown-linux-gnu; then
                message="aarch64: not built here (needs rustup target aarch64-unknown-linux-gnu and the gcc-aarch64-linux-gnu package)"
                if [ "$explicit" = 1 ]; then
                    log "$message"
                    exit 1
                fi
                log "$message; skipped"
                continue
            fi
            log "aarch64: glibc with +crt-static, cross-linked with aarch64-linux-gnu-gcc"
            CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
                CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
                AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
                build aarch64-unknown-linux-gnu "-C target-feature=+crt-static"
            ;;
    esac
    assert_static "$bin"
    assert_static "$helper"
    mkdir -p "$out"
    install -m 0755 "$bin" "$out/cordon-$arch-linux"
    install -m 0755 "$helper" "$out/cordon-helper-$arch-linux"
    built+=("cordon-$arch-linux" "cordon-helper-$arch-linux")
    log "$out/cordon-$arch-linux ($(stat -c %s "$bin") bytes, commit $CORDON_COMMIT)"
    log "$out/cordon-helper-$arch-linux ($(stat -c %s "$helper") bytes)"
done

[ "${#built[@]}" -gt 0 ] || { log "nothing built"; exit 1; }
(cd "$out" && sha256sum "${built[@]}" >SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
log "wrote $out/SHA256SUMS"
