//! Pure conversions between Cordon's protocol types and MCP's: tool definitions to MCP tools
//! (with behaviour hints), tool results to `CallToolResult`, partial results to progress
//! messages. No I/O.

use cordon_core::protocol::{Content, ToolDefinition, ToolResult};
use cordon_core::sandbox::NetworkMode;
use cordon_core::tool::AgentToolResult;
use cordon_ops::ToolKind;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, MetaObject, Tool, ToolAnnotations};
use serde_json::Value;

use crate::McpError;

/// `_meta` key under which a result's `details` (diff, patch, truncation, full-output path)
/// travel to the host.
pub const DETAILS_META_KEY: &str = "dev.cordon/details";

/// Upper bound of a progress message: the tail of the partial output, in bytes.
pub const PROGRESS_MESSAGE_MAX_BYTES: usize = 4096;

/// The MCP tool for one enabled Cordon tool.
pub(crate) fn mcp_tool(
    definition: ToolDefinition,
    label: &str,
    network: NetworkMode,
) -> Result<Tool, McpError> {
    let ToolDefinition {
        name,
        description,
        parameters,
    } = definition;
    let Value::Object(schema) = parameters else {
        return Err(McpError::SchemaNotObject { tool: name });
    };
    let annotations = annotations_for(&name, network);
    let mut tool = Tool::new(name, description, schema).with_title(label);
    if let Some(annotations) = annotations {
        tool = tool.with_annotations(annotations);
    }
    Ok(tool)
}

/// Behaviour hints for the built-in tools (clients use them to decide what needs a user's
/// confirmation). Unknown tools get none: a hint must never be a guess.
fn annotations_for(name: &str, network: NetworkMode) -> Option<ToolAnnotations> {
    let kind = ToolKind::from_name(name)?;
    let hints = ToolAnnotations::new().open_world(false);
    Some(match kind {
        ToolKind::Read | ToolKind::Grep | ToolKind::Find | ToolKind::Ls => {
            hints.read_only(true).idempotent(true)
        }
        ToolKind::Write => hints.read_only(false).destructive(true).idempotent(true),
        ToolKind::Edit => hints.read_only(false).destructive(true).idempotent(false),
        ToolKind::Bash => {
            let open_world = match network {
                // Filtered still reaches the hosts the allow list names.
                NetworkMode::Enabled | NetworkMode::Filtered => true,
                NetworkMode::Disabled => false,
            };
            hints
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(open_world)
        }
    })
}

/// The MCP result of a finished call: content blocks, `isError`, `structuredContent` where the
/// tool has it, and `details` under [`DETAILS_META_KEY`] in `_meta`.
pub(crate) fn call_tool_result(result: ToolResult) -> CallToolResult {
    let ToolResult {
        tool_call_id: _,
        tool_name: _,
        content,
        details,
        structured_content,
        is_error,
    } = result;
    let blocks = content.into_iter().map(content_block).collect();
    let mut out = if is_error {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    };
    out.structured_content = structured_content.map(|value| match value {
        Value::Object(_) => value,
        // MCP structured content is an object; a bare value is wrapped rather than lost.
        other => serde_json::json!({ "value": other }),
    });
    if let Some(details) = details.filter(|details| !details.is_null()) {
        let mut meta = JsonObject::new();
        meta.insert(DETAILS_META_KEY.to_owned(), details);
        out.meta = Some(MetaObject(meta));
    }
    out
}

fn content_block(content: Content) -> ContentBlock {
    match content {
        Content::Text { text } => ContentBlock::text(text),
        Content::Image { data, mime_type } => ContentBlock::image(data, mime_type),
    }
}

/// The progress message for a partial result: the tail of its text, at most
/// [`PROGRESS_MESSAGE_MAX_BYTES`], starting at a line start when the cut falls mid-line and a
/// later line exists. `None` when there is no text yet.
pub(crate) fn progress_message(partial: &AgentToolResult) -> Option<String> {
    let text: String = partial
        .content
        .iter()
        .filter_map(Content::as_text)
        .collect::<Vec<_>>()
        .join("\n");
    if text.is_empty() {
        return None;
    }
    if text.len() <= PROGRESS_MESSAGE_MAX_BYTES {
        return Some(text);
    }
    let mut start = text.len() - PROGRESS_MESSAGE_MAX_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let tail = &text[start..];
    let tail = match tail.find('\n') {
        Some(at) if at + 1 < tail.len() => &tail[at + 1..],
        _ => tail,
    };
    Some(tail.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn definition(name: &str, parameters: Value) -> ToolDefinition {
        ToolDefinition {
            name: name.to_owned(),
            description: format!("{name} things"),
            parameters,
        }
    }

    #[test]
    fn tool_carries_name_title_description_schema_and_hints() {
        let schema = json!({"type":"object","properties":{"path":{"type":"string"}},
                            "required":["path"]});
        let tool = mcp_tool(
            definition("read", schema.clone()),
            "Read",
            NetworkMode::Disabled,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&tool).unwrap(),
            json!({"name":"read","title":"Read","description":"read things",
                   "inputSchema":schema,
                   "annotations":{"readOnlyHint":true,"idempotentHint":true,
                                  "openWorldHint":false}})
        );
    }

    #[test]
    fn bash_is_open_world_only_with_network() {
        let schema = json!({"type":"object"});
        let hints = |network| {
            let tool = mcp_tool(definition("bash", schema.clone()), "Bash", network).unwrap();
            serde_json::to_value(tool.annotations.unwrap()).unwrap()
        };
        assert_eq!(
            hints(NetworkMode::Disabled),
            json!({"readOnlyHint":false,"destructiveHint":true,"idempotentHint":false,
                   "openWorldHint":false})
        );
        assert_eq!(hints(NetworkMode::Enabled)["openWorldHint"], true);
        assert_eq!(hints(NetworkMode::Filtered)["openWorldHint"], true);
    }

    #[test]
    fn unknown_tools_get_no_hints_and_non_object_schemas_are_refused() {
        let tool = mcp_tool(
            definition("custom", json!({"type":"object"})),
            "Custom",
            NetworkMode::Disabled,
        )
        .unwrap();
        assert!(tool.annotations.is_none());
        let error =
            mcp_tool(definition("odd", json!(true)), "Odd", NetworkMode::Disabled).unwrap_err();
        assert_eq!(
            error.to_string(),
            "failed to expose tool odd over MCP: its parameter schema is not a JSON object"
        );
    }

    fn result(content: Vec<Content>, is_error: bool) -> ToolResult {
        ToolResult {
            tool_call_id: "mcp-1".into(),
            tool_name: "bash".into(),
            content,
            details: None,
            structured_content: None,
            is_error,
        }
    }

    #[test]
    fn result_maps_text_image_error_structured_and_details() {
        let mut tool_result = result(
            vec![
                Content::text("hello"),
                Content::Image {
                    data: "AAAA".into(),
                    mime_type: "image/png".into(),
                },
            ],
            true,
        );
        tool_result.structured_content = Some(json!({"output":"hello","exitCode":3}));
        tool_result.details = Some(json!({"fullOutputPath":"/tmp/x"}));
        let mut wire = serde_json::to_value(call_tool_result(tool_result)).unwrap();
        wire.as_object_mut().unwrap().remove("resultType");
        assert_eq!(
            wire,
            json!({"content":[{"type":"text","text":"hello"},
                              {"type":"image","data":"AAAA","mimeType":"image/png"}],
                   "structuredContent":{"output":"hello","exitCode":3},
                   "isError":true,
                   "_meta":{"dev.cordon/details":{"fullOutputPath":"/tmp/x"}}})
        );
    }

    #[test]
    fn plain_success_has_no_structured_content_or_meta() {
        let mut wire =
            serde_json::to_value(call_tool_result(result(vec![Content::text("ok")], false)))
                .unwrap();
        wire.as_object_mut().unwrap().remove("resultType");
        assert_eq!(
            wire,
            json!({"content":[{"type":"text","text":"ok"}],"isError":false})
        );
    }

    #[test]
    fn non_object_structured_content_is_wrapped() {
        let mut tool_result = result(vec![Content::text("3")], false);
        tool_result.structured_content = Some(json!(3));
        assert_eq!(
            call_tool_result(tool_result).structured_content,
            Some(json!({"value":3}))
        );
    }

    fn partial(text: &str) -> AgentToolResult {
        AgentToolResult::text(text)
    }

    #[test]
    fn progress_message_is_none_without_text() {
        assert_eq!(progress_message(&AgentToolResult::default()), None);
        assert_eq!(progress_message(&partial("")), None);
    }

    #[test]
    fn short_progress_message_is_the_whole_text() {
        assert_eq!(
            progress_message(&partial("line 1\nline 2")),
            Some("line 1\nline 2".to_owned())
        );
    }

    #[test]
    fn long_progress_message_is_the_tail_from_a_line_start() {
        let text: String = (0..2000).map(|n| format!("line {n}\n")).collect();
        let message = progress_message(&partial(&text)).unwrap();
        assert!(message.len() <= PROGRESS_MESSAGE_MAX_BYTES);
        assert!(message.ends_with("line 1999\n"));
        assert!(message.starts_with("line "), "{:?}", &message[..20]);
        assert!(text.ends_with(&message));
    }

    #[test]
    fn progress_tail_never_splits_a_character() {
        let text = "é".repeat(PROGRESS_MESSAGE_MAX_BYTES);
        let message = progress_message(&partial(&text)).unwrap();
        assert!(message.len() <= PROGRESS_MESSAGE_MAX_BYTES);
        assert!(message.chars().all(|c| c == 'é'));
    }
}
