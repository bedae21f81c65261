//! Size bounds on the tools' model-controlled text arguments.
//!
//! The schemas advertise them (`maxLength`, checked by argument validation before a tool runs)
//! and the tools check them again, so a tool called without validation is bounded too. The
//! regex size limit keeps a short but explosive pattern (`(a{1000}){1000}`) from compiling into
//! gigabytes. This module owns the numbers only; each tool reports a violation in its own words.

/// Longest `path` argument, in characters (Linux `PATH_MAX`).
pub const MAX_PATH_CHARS: usize = 4096;

/// Longest grep regex (or literal), in characters.
pub const MAX_REGEX_CHARS: usize = 16 * 1024;

/// Longest glob (find's `pattern`, grep's `glob`), in characters.
pub const MAX_GLOB_CHARS: usize = 4096;

/// Longest bash `command`, in characters (1 MiB of ASCII; the kernel refuses a single
/// argument over 128 KiB anyway, so a longer script could only be run from a file).
pub const MAX_COMMAND_CHARS: usize = 1024 * 1024;

/// Compiled-program size limit for search regexes, in bytes (program and lazy DFA each).
pub const REGEX_SIZE_LIMIT: usize = 16 * 1024 * 1024;

/// `Err(text)` naming the argument, its size and the bound when `value` has more than `max`
/// characters; the text tells the model what to do instead.
pub fn check_length(tool: &str, name: &str, value: &str, max: usize) -> Result<(), String> {
    // Counting characters is linear; bytes are a cheap upper bound for the common case.
    if value.len() <= max || value.chars().count() <= max {
        return Ok(());
    }
    Err(format!(
        "Invalid arguments for {tool}: {name} is {} characters long; at most {max} are \
         accepted. Use a shorter {name}.",
        value.chars().count()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_counted_in_characters() {
        assert_eq!(check_length("find", "pattern", "*.rs", 4), Ok(()));
        assert_eq!(check_length("find", "pattern", "ééé", 3), Ok(()));
        assert_eq!(
            check_length("find", "pattern", "abcde", 4),
            Err(
                "Invalid arguments for find: pattern is 5 characters long; at most 4 are \
                 accepted. Use a shorter pattern."
                    .to_owned()
            )
        );
    }
}
