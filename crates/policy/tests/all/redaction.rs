//! Redaction configured by a policy file: a pattern and a named environment variable's value
//! are removed from text content and from nested structured content and details.

use cordon_core::protocol::Content;
use cordon_core::tool::AgentToolResult;
use cordon_policy::{CompiledPolicy, EnvMap};
use serde_json::json;

const POLICY: &str = r#"version = 1
[redact]
patterns = ["tok_[A-Za-z0-9]{12}"]
env = ["DEPLOY_KEY", "UNSET_VAR", "EMPTY_VAR", "TINY_VAR"]
"#;

fn env() -> EnvMap {
    let mut env = EnvMap::new();
    env.insert("DEPLOY_KEY".into(), "k3y-0f-the-deploy".into());
    env.insert("EMPTY_VAR".into(), String::new());
    env.insert("TINY_VAR".into(), "1234".into());
    env.insert("UNRELATED".into(), "not-named-in-policy".into());
    env
}

#[test]
fn tokens_are_removed_everywhere_the_model_looks() {
    let p = CompiledPolicy::from_toml("r.toml", POLICY, &env()).unwrap();
    let result = AgentToolResult {
        content: vec![
            Content::text("token tok_ABCDEFGHIJKL, key k3y-0f-the-deploy, tiny 1234"),
            Content::Image {
                data: "AAAA".into(),
                mime_type: "image/png".into(),
            },
        ],
        details: Some(json!({"fullOutputPath": "/tmp/out", "env": {"k3y-0f-the-deploy": true}})),
        structured_content: Some(json!({
            "output": "tok_ABCDEFGHIJKL",
            "nested": [{"deep": ["x k3y-0f-the-deploy y", 7]}],
            "exitCode": 0
        })),
        is_error: false,
        terminate: false,
    };
    let mut redacted = result.clone();
    p.redactor()
        .redact_result(&result)
        .expect("something to redact")
        .apply(&mut redacted);
    assert_eq!(
        redacted.content,
        vec![
            Content::text("token [REDACTED], key [REDACTED], tiny 1234"),
            Content::Image {
                data: "AAAA".into(),
                mime_type: "image/png".into(),
            },
        ]
    );
    assert_eq!(
        redacted.structured_content,
        Some(json!({
            "output": "[REDACTED]",
            "nested": [{"deep": ["x [REDACTED] y", 7]}],
            "exitCode": 0
        }))
    );
    assert_eq!(
        redacted.details,
        Some(json!({"fullOutputPath": "/tmp/out", "env": {"[REDACTED]": true}, "redactions": 5}))
    );
    let serialized = serde_json::to_string(&redacted).unwrap();
    assert!(!serialized.contains("k3y-0f-the-deploy") && !serialized.contains("tok_ABC"));
}

#[test]
fn skipped_variables_are_noted() {
    let p = CompiledPolicy::from_toml("r.toml", POLICY, &env()).unwrap();
    let notes = p.notes().join("\n");
    assert!(notes.contains("UNSET_VAR is not set"), "{notes}");
    assert!(notes.contains("EMPTY_VAR is empty"), "{notes}");
    assert!(
        notes.contains("TINY_VAR is shorter than 8 characters"),
        "{notes}"
    );
    assert!(!notes.contains("DEPLOY_KEY"), "{notes}");
}

#[test]
fn env_values_are_read_at_compile_time_only() {
    let mut env = env();
    let p = CompiledPolicy::from_toml("r.toml", POLICY, &env).unwrap();
    env.insert("DEPLOY_KEY".into(), "a-different-value".into());
    assert_eq!(
        p.redactor().redact_text("k3y-0f-the-deploy").0,
        "[REDACTED]"
    );
    assert_eq!(
        p.redactor().redact_text("a-different-value").0,
        "a-different-value"
    );
}

#[test]
fn decisions_do_not_echo_secrets() {
    let p = CompiledPolicy::from_toml(
        "r.toml",
        "version = 1\ndefault = \"deny\"\n[redact]\nenv = [\"DEPLOY_KEY\"]\n",
        &env(),
    )
    .unwrap();
    let got = crate::support::bash(&p, "curl -H 'auth: k3y-0f-the-deploy' x");
    assert!(!got.reason.contains("k3y-0f-the-deploy"), "{}", got.reason);
    assert!(got.reason.contains("[REDACTED]"), "{}", got.reason);
}
