//! Small pieces the file tools (`read`, `write`, `edit`, `ls`) share: decoding a tool's
//! arguments, whole-number parameters, the cancellation check, and the model-facing text of a
//! [`FsError`].
//!
//! It owns no tool behaviour of its own; each tool keeps its messages in its own module.

use cordon_core::excerpt::excerpt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use cordon_ops::FsError;

/// The message every file tool reports when its call was cancelled
/// (docs/semantics.md#cancellation).
pub(crate) const ABORTED: &str = "Operation aborted";

/// Decode a tool's arguments into its typed argument struct. Unknown fields are ignored (the
/// schemas do not forbid extra properties). The error text names the tool and what is wrong.
pub(crate) fn decode_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, String> {
    serde_json::from_value(args).map_err(|e| {
        // serde quotes the offending value; a huge one is cut.
        format!(
            "Invalid arguments for {tool}: {}. Check the tool's parameter schema and retry.",
            excerpt(&e.to_string())
        )
    })
}

/// A non-negative whole number parameter (`offset`, `limit`), sent as a JSON number.
/// `minimum` is the smallest accepted value.
pub(crate) fn whole_number(name: &str, value: f64, minimum: u64) -> Result<u64, String> {
    if !value.is_finite() || value.fract() != 0.0 {
        return Err(format!("{name} must be a whole number, got {value}."));
    }
    if value < minimum as f64 {
        return Err(match minimum {
            0 => format!("{name} must not be negative, got {value}."),
            _ => format!("{name} must be at least {minimum}, got {value}."),
        });
    }
    // Saturate absurdly large values; they behave like "no limit".
    Ok(if value >= u64::MAX as f64 {
        u64::MAX
    } else {
        value as u64
    })
}

/// The part of a file-operation failure the model reads after `Could not … file: PATH. `:
/// the short `Error code: ENOENT.` form where a POSIX code says it all, otherwise the
/// backend's explanation (policy, confinement, transport) so the model knows what to do.
pub(crate) fn fs_error_text(error: &FsError) -> String {
    match error {
        FsError::NotFound { .. }
        | FsError::PermissionDenied { .. }
        | FsError::NotADirectory { .. }
        | FsError::IsADirectory { .. } => match error.errno_name() {
            Some(code) => format!("Error code: {code}."),
            None => format!("{error}."),
        },
        FsError::Io { .. } => match error.errno_name() {
            Some(code) => format!("Error code: {code} ({error})."),
            None => format!("{error}."),
        },
        FsError::OutsideRoot { path } => format!(
            "The path {} is outside the directories this sandbox may access; use a path inside \
             the workspace.",
            path.display()
        ),
        FsError::Protected { path } => format!(
            "The path {} is protected (read-only) by the sandbox policy and cannot be modified.",
            path.display()
        ),
        FsError::Denied { path } => format!(
            "Access to {} is denied by the sandbox policy.",
            path.display()
        ),
        FsError::Backend { .. } | FsError::GitMetadata { .. } => format!("{error}."),
        FsError::Cancelled => format!("{ABORTED}."),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn whole_numbers() {
        assert_eq!(whole_number("offset", 0.0, 0), Ok(0));
        assert_eq!(whole_number("offset", 51.0, 0), Ok(51));
        assert_eq!(
            whole_number("offset", -1.0, 0),
            Err("offset must not be negative, got -1.".to_owned())
        );
        assert_eq!(
            whole_number("limit", 0.0, 1),
            Err("limit must be at least 1, got 0.".to_owned())
        );
        assert_eq!(
            whole_number("limit", 2.5, 1),
            Err("limit must be a whole number, got 2.5.".to_owned())
        );
        assert_eq!(whole_number("limit", 1e30, 1), Ok(u64::MAX));
    }

    #[test]
    fn fs_error_texts() {
        let path = PathBuf::from("/w/a.txt");
        assert_eq!(
            fs_error_text(&FsError::NotFound { path: path.clone() }),
            "Error code: ENOENT."
        );
        assert_eq!(
            fs_error_text(&FsError::PermissionDenied { path: path.clone() }),
            "Error code: EACCES."
        );
        assert!(fs_error_text(&FsError::Protected { path: path.clone() }).contains("protected"));
        let backend = FsError::Backend {
            op: "stat",
            path,
            reason: "disk offline".to_owned(),
        };
        assert_eq!(
            fs_error_text(&backend),
            "failed to stat /w/a.txt: backend unavailable: disk offline."
        );
    }
}

/// Helpers for the file tools' tests.
#[cfg(test)]
pub(crate) mod test_util {
    use std::sync::Arc;

    use cordon_core::tool::{AgentTool, AgentToolResult, ToolError, ToolInvocation};
    use serde_json::Value;
    use tokio_util::sync::CancellationToken;

    /// Run `tool` once with `args`, a fresh token and no update sink.
    pub(crate) async fn call(
        tool: &dyn AgentTool,
        args: Value,
    ) -> Result<AgentToolResult, ToolError> {
        call_with(tool, args, CancellationToken::new()).await
    }

    /// Run `tool` once with `args` and the given token.
    pub(crate) async fn call_with(
        tool: &dyn AgentTool,
        args: Value,
        cancel: CancellationToken,
    ) -> Result<AgentToolResult, ToolError> {
        tool.execute(ToolInvocation {
            call_id: "call-1".to_owned(),
            args,
            cancel,
            on_update: Arc::new(|_| {}),
        })
        .await
    }

    /// The text of a result's first content block.
    pub(crate) fn text(result: &AgentToolResult) -> &str {
        result.content[0].as_text().expect("first block is text")
    }

    /// The error message of a failed call.
    pub(crate) fn error(outcome: Result<AgentToolResult, ToolError>) -> String {
        match outcome {
            Ok(result) => panic!("expected an error, got {result:?}"),
            Err(error) => error.to_string(),
        }
    }
}
