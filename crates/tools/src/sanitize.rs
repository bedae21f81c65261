//! Sanitising command output for the model (docs/semantics.md#bash): ANSI escape sequences (CSI,
//! OSC, DCS/SOS/PM/APC strings, other `ESC` sequences, and their C1 forms) and stray control
//! characters are removed; `\n` and `\t` are kept, `\r\n` becomes `\n`, a lone `\r` is removed.
//!
//! It never removes a `\n` — an escape sequence cut by a newline ends there — so a sanitised
//! text has exactly as many lines as the raw output, and line numbers in the bash footer point
//! at the same lines of the raw spill file. It does not decode bytes (see [`crate::output`]).

use std::borrow::Cow;

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;

/// The model-facing form of `text`. Borrows when nothing needs to change (the common case).
pub fn sanitize(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let Some(first) = (0..bytes.len()).find(|&i| needs_care(bytes, i)) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut i = first;
    let mut copy_from = first;
    while i < bytes.len() {
        if !needs_care(bytes, i) {
            i += 1;
            continue;
        }
        out.push_str(&text[copy_from..i]);
        i = skip_special(bytes, i, &mut out);
        copy_from = i;
    }
    out.push_str(&text[copy_from..]);
    Cow::Owned(out)
}

/// Whether byte `i` starts something other than plain text: a C0 control other than `\n` and
/// `\t`, DEL, or a C1 control (U+0080..U+009F, encoded `C2 80`..`C2 9F`).
fn needs_care(bytes: &[u8], i: usize) -> bool {
    match bytes[i] {
        b'\n' | b'\t' => false,
        0x00..=0x1f | 0x7f => true,
        0xc2 => bytes.get(i + 1).is_some_and(|b| (0x80..=0x9f).contains(b)),
        _ => false,
    }
}

/// Handle the special sequence starting at `i`; returns the index after it. Everything it
/// consumes is dropped except a `\n` produced from `\r\n`.
fn skip_special(bytes: &[u8], i: usize, out: &mut String) -> usize {
    match bytes[i] {
        b'\r' => {
            if bytes.get(i + 1) == Some(&b'\n') {
                out.push('\n');
                i + 2
            } else {
                i + 1
            }
        }
        ESC => skip_escape(bytes, i + 1),
        0xc2 => match bytes[i + 1] {
            // C1 CSI
            0x9b => skip_csi(bytes, i + 2),
            // C1 OSC, DCS, SOS, PM, APC: control strings
            0x9d | 0x90 | 0x98 | 0x9e | 0x9f => skip_string(bytes, i + 2),
            _ => i + 2,
        },
        _ => i + 1,
    }
}

/// After `ESC`: the sequence kinds of ECMA-48.
fn skip_escape(bytes: &[u8], i: usize) -> usize {
    match bytes.get(i) {
        None => i,
        Some(b'[') => skip_csi(bytes, i + 1),
        Some(b']' | b'P' | b'X' | b'^' | b'_') => skip_string(bytes, i + 1),
        Some(_) => {
            // nF: intermediates 0x20..=0x2F, then a final byte 0x30..=0x7E (Fp, Fe, Fs have
            // no intermediates). Anything else ends the sequence without being consumed.
            let mut j = i;
            while j < bytes.len() && (0x20..=0x2f).contains(&bytes[j]) {
                j += 1;
            }
            match bytes.get(j) {
                Some(0x30..=0x7e) => j + 1,
                _ => j,
            }
        }
    }
}

/// A control sequence: parameters 0x30..=0x3F, intermediates 0x20..=0x2F, final 0x40..=0x7E.
/// A malformed sequence ends before the offending byte, which is then handled as text.
fn skip_csi(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && (0x30..=0x3f).contains(&bytes[i]) {
        i += 1;
    }
    while i < bytes.len() && (0x20..=0x2f).contains(&bytes[i]) {
        i += 1;
    }
    match bytes.get(i) {
        Some(0x40..=0x7e) => i + 1,
        _ => i,
    }
}

/// A control string (OSC, DCS, …): ends with BEL, `ESC \` or C1 ST; cut short (newline kept)
/// at a newline or the end of the text.
fn skip_string(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            BEL => return i + 1,
            ESC if bytes.get(i + 1) == Some(&b'\\') => return i + 2,
            ESC => return i,
            0xc2 if bytes.get(i + 1) == Some(&0x9c) => return i + 2,
            b'\n' => return i,
            _ => i += 1,
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> String {
        sanitize(text).into_owned()
    }

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(sanitize("a\tb\nc é 🙂"), Cow::Borrowed(_)));
    }

    #[test]
    fn strips_sgr_and_crlf() {
        assert_eq!(s("\x1b[31mred\x1b[0m\r\n"), "red\n");
        assert_eq!(s("\x1b[1;38;5;196mbold\x1b[m"), "bold");
    }

    #[test]
    fn lone_carriage_return_removed() {
        assert_eq!(s("10%\r20%\r30%\n"), "10%20%30%\n");
        assert_eq!(s("a\r\r\nb"), "a\nb");
        assert_eq!(s("end\r"), "end");
    }

    #[test]
    fn strips_osc_with_bel_and_st() {
        assert_eq!(s("\x1b]0;title\x07text"), "text");
        assert_eq!(
            s("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"),
            "link",
            "OSC 8 hyperlinks keep their text"
        );
        assert_eq!(s("\u{9d}0;title\u{9c}text"), "text");
    }

    #[test]
    fn strips_other_escapes() {
        assert_eq!(s("\x1b(Bx\x1b=y\x1b7z\x1bcw"), "xyzw");
        assert_eq!(s("\x1bP1$r\x1b\\after"), "after");
        assert_eq!(s("\u{9b}2Jclear"), "clear");
        assert_eq!(s("trailing\x1b"), "trailing");
    }

    #[test]
    fn strips_control_characters_keeps_tab_newline() {
        assert_eq!(s("a\x00b\x07c\x08d\x7fe\tf\ng"), "abcde\tf\ng");
        assert_eq!(s("x\u{85}y\u{80}z"), "xyz");
    }

    #[test]
    fn never_removes_a_newline() {
        // An unterminated OSC or a malformed CSI stops at the newline.
        assert_eq!(s("\x1b]0;title\nnext"), "\nnext");
        assert_eq!(s("\x1b[12\nnext"), "\nnext");
        assert_eq!(s("\x1b\nnext"), "\nnext");
        let noisy = "\x1b[31ma\r\n\x1b]0;t\nb\x1b(\nc\n";
        assert_eq!(s(noisy).matches('\n').count(), noisy.matches('\n').count());
    }

    #[test]
    fn malformed_csi_keeps_following_text() {
        assert_eq!(s("\x1b[12é"), "é");
        assert_eq!(s("\x1b[?25lcursor"), "cursor");
    }
}
