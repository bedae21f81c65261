//! POSIX shell quoting, for transports that take one command line instead of an argv (SSH
//! exec requests). Docker exec takes an argv and needs none of this.

/// Quote one word for a POSIX shell: single quotes, with `'` written as `'\''`. Words made only
/// of safe characters are returned as they are.
pub fn quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if safe {
        return word.to_owned();
    }
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for ch in word.chars() {
        if ch == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(ch);
        }
    }
    out.push('\'');
    out
}

/// Join an argv into one command line that a POSIX shell splits back into the same words.
pub fn command_line(argv: &[String]) -> String {
    argv.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(quote("abc/d.e"), "abc/d.e");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote("$HOME;rm"), "'$HOME;rm'");
    }

    #[test]
    fn command_line_round_trips_through_sh() {
        let argv: Vec<String> = ["printf", "%s|", "a b", "it's", "$x", "\n", "*"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let line = command_line(&argv);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&line)
            .output()
            .expect("sh runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|it's|$x|\n|*|");
    }
}
