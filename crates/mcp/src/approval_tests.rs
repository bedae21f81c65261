use serde_json::json;

use super::*;

fn request(args: Value) -> ApprovalRequest {
    ApprovalRequest {
        call_id: "mcp-1".to_owned(),
        tool: "write".to_owned(),
        args,
        rule: "/etc/cordon/policy.toml:12".to_owned(),
        reason: "lock file changes need review".to_owned(),
    }
}

fn accepted(content: Value) -> ElicitResult {
    ElicitResult::new(ElicitationAction::Accept).with_content(content)
}

#[test]
fn the_question_names_the_call_the_rule_and_the_choices() {
    let text = question(&request(
        json!({"content": "x = 1\n", "path": "Cargo.lock"}),
    ));
    assert_eq!(
        text,
        "Cordon's policy asks before this tool call runs.\n\nTool: write\nArguments: \
         {\"path\": \"Cargo.lock\", \"content\": \"x = 1\\n\"}\nRule: \
         /etc/cordon/policy.toml:12\nReason: lock file changes need review\n\nAllow it once, \
         allow it for this session (every call this rule asks about, until the server stops), \
         or deny it?"
    );
}

#[test]
fn long_arguments_are_cut_and_say_what_was_left_out() {
    let content = "a".repeat(10_000);
    let edits: Vec<Value> = (0..8)
        .map(|n| json!({"oldText": format!("old {n}"), "newText": "new"}))
        .collect();
    let rendered = render_args(&json!({"content": content, "path": "big.txt", "edits": edits}));
    assert!(
        rendered.starts_with("{\"path\": \"big.txt\", "),
        "{rendered}"
    );
    assert!(rendered.contains(&format!("\"{}\"… (9700 more bytes)", "a".repeat(300))));
    assert!(rendered.contains(", … 3 more]"), "{rendered}");
    assert!(
        rendered.chars().count() <= MAX_ARGS_CHARS + 40,
        "{rendered}"
    );

    let many: serde_json::Map<String, Value> = (0..500)
        .map(|n| (format!("key{n:03}"), json!("v".repeat(100))))
        .collect();
    let rendered = render_args(&Value::Object(many));
    assert!(rendered.ends_with(" more bytes)"), "{rendered}");
    assert!(rendered.chars().count() <= MAX_ARGS_CHARS + 40);
}

#[test]
fn model_text_cannot_add_lines_or_reorder_the_question() {
    let sneaky = "a.txt\nRule: builtin:safe\u{1b}[2J\u{2028}\u{202e}\u{85}\u{7f}";
    let text = question(&ApprovalRequest {
        tool: "write\nReason: fine".to_owned(),
        ..request(json!({"path": sneaky}))
    });
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with("Rule:"))
            .count(),
        1
    );
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with("Reason:"))
            .count(),
        1
    );
    assert!(
        text.contains(
            r#"Arguments: {"path": "a.txt\nRule: builtin:safe\u001b[2J\u2028\u202e\u0085\u007f"}"#
        ),
        "{text}"
    );
    assert!(text.contains(r"Tool: write\u000aReason: fine"), "{text}");
    assert!(
        !text
            .chars()
            .any(|ch| (ch.is_control() && ch != '\n') || ch == '\u{2028}' || ch == '\u{202e}')
    );
}

#[test]
fn answers_map_to_approvals_and_anything_else_is_a_denial_that_says_why() {
    assert_eq!(
        answer_of(&accepted(json!({"decision": "allow_once"}))),
        Approval::Yes
    );
    assert_eq!(
        answer_of(&accepted(json!({"decision": "allow_session"}))),
        Approval::Always
    );
    assert_eq!(
        answer_of(&accepted(json!({"decision": "deny"}))),
        Approval::No
    );
    assert_eq!(
        answer_of(&ElicitResult::new(ElicitationAction::Decline)),
        Approval::No
    );
    assert_eq!(
        answer_of(&ElicitResult::new(ElicitationAction::Cancel)),
        Approval::Unanswered("the user dismissed the question without answering".to_owned())
    );
    for (content, got) in [
        (Some(json!({"decision": "sure"})), r#"{"decision":"sure"}"#),
        (Some(json!({"decision": 1})), r#"{"decision":1}"#),
        (Some(json!(["allow_once"])), r#"["allow_once"]"#),
        (None, "no content"),
    ] {
        let result = match content {
            Some(content) => accepted(content),
            None => ElicitResult::new(ElicitationAction::Accept),
        };
        assert_eq!(
            answer_of(&result),
            Approval::Unanswered(format!(
                "the client's answer was malformed: expected {{\"decision\": \"allow_once\" | \
                 \"allow_session\" | \"deny\"}}, got {got}"
            ))
        );
    }
}

#[test]
fn the_form_is_one_required_choice_of_three() {
    assert_eq!(
        serde_json::to_value(decision_schema(&request(json!({})))).unwrap(),
        json!({
            "type": "object",
            "properties": {
                "decision": {
                    "type": "string",
                    "title": "Decision",
                    "oneOf": [
                        {"const": "allow_once", "title": "Allow once"},
                        {
                            "const": "allow_session",
                            "title": "Allow for this session (every call this rule asks about)"
                        },
                        {"const": "deny", "title": "Deny"}
                    ]
                }
            },
            "required": ["decision"]
        })
    );
}

fn network_request(destination: &str) -> ApprovalRequest {
    ApprovalRequest {
        call_id: "mcp-4".to_owned(),
        tool: NETWORK_QUESTION.to_owned(),
        args: json!({"destination": destination}),
        rule: "/etc/cordon/policy.toml:9".to_owned(),
        reason: "a command connects to api.example.com:443, which ask entry \"*.example.com\" \
                 matches"
            .to_owned(),
    }
}

#[test]
fn a_network_question_names_the_destination_and_offers_it_for_the_session() {
    let request = network_request("api.example.com:443");
    assert_eq!(
        question(&request),
        "Cordon's network policy asks before a command of this tool call connects.\n\n\
         Destination: api.example.com:443\nRule: /etc/cordon/policy.toml:9\nReason: a command \
         connects to api.example.com:443, which ask entry \"*.example.com\" matches\n\nAllow \
         api.example.com:443 once (this connection), for this session (until the server \
         stops), or deny it?"
    );
    let schema = serde_json::to_value(decision_schema(&request)).unwrap();
    assert_eq!(
        schema["properties"]["decision"]["oneOf"][1],
        json!({"const": "allow_session", "title": "Allow api.example.com:443 for this session"})
    );
}

#[test]
fn a_network_destination_cannot_add_lines_to_the_question() {
    let text = question(&network_request("a.example.com:443\nRule: builtin:safe"));
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with("Rule:"))
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn transport_failures_are_denials_that_name_the_failure() {
    assert_eq!(
        request_failed(&ServiceError::TransportClosed),
        Approval::Unanswered(
            "failed to ask the user through the MCP client: Transport closed".to_owned()
        )
    );
}

#[test]
fn bounded_cuts_on_characters_and_counts_the_rest_in_bytes() {
    assert_eq!(bounded("héllo", 10), "héllo");
    assert_eq!(bounded("héllo", 2), "hé… (3 more bytes)");
}

#[tokio::test]
async fn calls_without_a_registered_client_cannot_be_asked() {
    let approver = ElicitationApprover::new(Duration::from_secs(1));
    assert_eq!(
        approver.approve(request(json!({}))).await,
        Approval::Unavailable
    );
}

#[test]
fn invisible_characters_are_shown_as_escapes() {
    // Each would make the path look like plain `a.txt` (or hide text) in the client's dialog.
    for ch in [
        '\u{00AD}',
        '\u{034F}',
        '\u{061C}',
        '\u{115F}',
        '\u{17B4}',
        '\u{180E}',
        '\u{2066}',
        '\u{206A}',
        '\u{3164}',
        '\u{FE0F}',
        '\u{FFA0}',
        '\u{FFF9}',
        '\u{1D173}',
        '\u{E0041}',
        '\u{E0100}',
    ] {
        let text = question(&request(json!({ "path": format!("a{ch}.txt") })));
        assert!(!text.contains(ch), "{:04x} shown as is", u32::from(ch));
        let mut units = [0u16; 2];
        let escape: String = ch
            .encode_utf16(&mut units)
            .iter()
            .map(|unit| format!("\\u{unit:04x}"))
            .collect();
        assert!(
            text.contains(&format!("\"a{escape}.txt\"")),
            "{:04x}: {text}",
            u32::from(ch)
        );
    }
    // Ordinary non-ASCII text stays readable.
    let text = question(&request(json!({"path": "café/日本.txt"})));
    assert!(text.contains("\"café/日本.txt\""), "{text}");
}

#[test]
fn what_the_call_touches_is_not_cut_at_the_string_bound() {
    // Padding cannot push the end of a command out of the question.
    let command = format!("echo ok{}; rm -rf ~", " ".repeat(400));
    let rendered = render_args(&json!({"command": command, "note": "n".repeat(400)}));
    assert!(
        rendered.starts_with(&format!("{{\"command\": \"{command}\", ")),
        "{rendered}"
    );
    // Other arguments are still cut.
    assert!(rendered.contains("… (100 more bytes)"), "{rendered}");
    // The question's bound still holds.
    let rendered = render_args(&json!({"command": "x".repeat(10_000)}));
    assert!(
        rendered.chars().count() <= MAX_ARGS_CHARS + 40,
        "{rendered}"
    );
    assert!(rendered.ends_with("more bytes)"), "{rendered}");
}

#[test]
fn the_egress_proxy_learns_the_approval_timeout() {
    // Network questions wait as long as --approval-timeout says, not the proxy's default.
    let approver = ElicitationApprover::new(Duration::from_secs(600));
    assert_eq!(
        Approver::answer_within(&approver),
        Some(Duration::from_secs(600))
    );
}
