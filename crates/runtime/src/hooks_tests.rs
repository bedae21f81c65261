//! One path, three readers: `cordon policy explain`, the policy hook (the paths the runtime
//! hands the policy) and the tool itself must resolve a model's path to the same place, or a
//! rule could judge one file while the tool opens another.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use cordon_core::CancellationToken;
use cordon_core::tool::{AgentTool, ToolInvocation};
use cordon_ops::{BackendId, DirEntry, FileMeta, FileOperations, FsError, Op, SpillWriter};
use cordon_policy::explain::{ExplainCliRequest, explain_cli};
use cordon_policy::{CompiledPolicy, EnvMap};
use cordon_tools::write::WriteTool;
use serde_json::json;

use super::RuntimeHooks;

const ROOT: &str = "/ws";
const HOME: &str = "/home/me";

/// A backend whose `canonicalize` is the identity (no symlinks anywhere), so what the hook
/// hands the policy is exactly its lexical resolution; it records where writes land.
struct RecordingFiles {
    id: BackendId,
    root: PathBuf,
    home: PathBuf,
    written: Mutex<Vec<PathBuf>>,
}

fn unused(path: &Path) -> FsError {
    FsError::Backend {
        op: "use",
        path: path.to_path_buf(),
        reason: "not used by this test".to_owned(),
    }
}

#[async_trait]
impl FileOperations for RecordingFiles {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn home(&self) -> Option<&Path> {
        Some(&self.home)
    }
    async fn read_file(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        Err(unused(path))
    }
    async fn read_head(&self, path: &Path, _max: usize) -> Result<Vec<u8>, FsError> {
        Err(unused(path))
    }
    async fn read_range(&self, path: &Path, _at: u64, _max: usize) -> Result<Vec<u8>, FsError> {
        Err(unused(path))
    }
    async fn write_file(&self, path: &Path, _data: &[u8]) -> Result<(), FsError> {
        self.written.lock().unwrap().push(path.to_path_buf());
        Ok(())
    }
    async fn create_dir_all(&self, _path: &Path) -> Result<(), FsError> {
        Ok(())
    }
    async fn metadata(&self, path: &Path) -> Result<FileMeta, FsError> {
        Err(FsError::NotFound {
            path: path.to_path_buf(),
        })
    }
    async fn read_dir(&self, path: &Path) -> Result<Vec<DirEntry>, FsError> {
        Err(unused(path))
    }
    async fn canonicalize(&self, path: &Path) -> Result<PathBuf, FsError> {
        Ok(path.to_path_buf())
    }
    async fn create_spill_file(&self) -> Result<(PathBuf, SpillWriter), FsError> {
        Err(unused(Path::new("spill")))
    }
}

/// (model path, where it must resolve). Unicode spaces become plain spaces; `~` and `~/…`
/// expand to the home directory, `~user` is a literal name; one leading `@` is dropped;
/// `file://` URLs (also `file://localhost`) are percent-decoded, and what an escape decodes
/// to is taken literally; `..` collapses and stops at `/`; NFC and NFD spellings are NOT
/// normalised: each names its own file, as the kernel sees it.
const CASES: &[(&str, &str)] = &[
    ("a\u{00A0}b.txt", "/ws/a b.txt"),
    ("a\u{202F}b", "/ws/a b"),
    ("a\u{2009}b\u{3000}c", "/ws/a b c"),
    ("~", HOME),
    ("~/x", "/home/me/x"),
    ("~user", "/ws/~user"),
    ("~user/x", "/ws/~user/x"),
    ("@x", "/ws/x"),
    ("@~/x", "/home/me/x"),
    ("file:///abs%20dir/x", "/abs dir/x"),
    ("file://localhost/x", "/x"),
    ("file:///a%C2%A0b", "/a\u{00A0}b"),
    ("/../../x", "/x"),
    ("../../../x", "/x"),
    ("./a/../b", "/ws/b"),
    ("a/./b/../../c", "/ws/c"),
    ("caf\u{e9}.txt", "/ws/caf\u{e9}.txt"),
    ("cafe\u{301}.txt", "/ws/cafe\u{301}.txt"),
];

#[tokio::test]
async fn explain_the_policy_hook_and_the_tool_resolve_the_same_path() {
    let policy = Arc::new(CompiledPolicy::builtin_default(&EnvMap::new()).unwrap());
    let files = Arc::new(RecordingFiles {
        id: BackendId::new("test:resolution"),
        root: PathBuf::from(ROOT),
        home: PathBuf::from(HOME),
        written: Mutex::new(Vec::new()),
    });
    let hooks = RuntimeHooks {
        policy: policy.clone(),
        files: files.clone(),
        backend: files.id.clone(),
        missing_layers: Vec::new(),
        audit: None,
        approver: None,
        approved_rules: Mutex::new(HashSet::new()),
        in_flight: Mutex::new(HashMap::new()),
    };
    let tool = WriteTool::new(files.clone());
    let mut failures = Vec::new();
    for (input, expected) in CASES {
        let args = json!({ "path": input, "content": "x" });

        let explained = explain_cli(
            &policy,
            &ExplainCliRequest {
                tool: "write",
                args_json: &args.to_string(),
                root: Path::new(ROOT),
                home: Some(Path::new(HOME)),
            },
        )
        .unwrap();
        let explain: Vec<(PathBuf, Op)> = explained
            .paths
            .into_iter()
            .map(|access| (access.canonical, access.op))
            .collect();

        let hook: Vec<(PathBuf, Op)> = match hooks.accesses("write", &args).await {
            Ok(accesses) => accesses
                .paths
                .into_iter()
                .map(|access| (access.canonical, access.op))
                .collect(),
            Err(refusal) => panic!("{input:?}: the hook refused: {refusal}"),
        };

        files.written.lock().unwrap().clear();
        tool.execute(ToolInvocation {
            call_id: "c".to_owned(),
            args: args.clone(),
            cancel: CancellationToken::new(),
            on_update: Arc::new(|_| {}),
        })
        .await
        .unwrap_or_else(|error| panic!("{input:?}: the write failed: {error}"));
        let opened = files.written.lock().unwrap().clone();

        let want = vec![(PathBuf::from(expected), Op::Write)];
        if explain != want || hook != want || opened != [PathBuf::from(expected)] {
            failures.push(format!(
                "{input:?}: expected {expected:?}; explain {explain:?}, hook {hook:?}, tool {opened:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An approver that gives scripted answers and records the questions it was asked.
struct ScriptedApprover {
    answers: Mutex<Vec<crate::approval::Approval>>,
    asked: Mutex<Vec<crate::approval::ApprovalRequest>>,
}

#[async_trait]
impl crate::approval::Approver for ScriptedApprover {
    async fn approve(
        &self,
        request: crate::approval::ApprovalRequest,
    ) -> crate::approval::Approval {
        self.asked.lock().unwrap().push(request);
        self.answers.lock().unwrap().remove(0)
    }
}

fn hooks_with_approver(approver: Arc<ScriptedApprover>) -> RuntimeHooks {
    let files = Arc::new(RecordingFiles {
        id: BackendId::new("test:approval"),
        root: PathBuf::from(ROOT),
        home: PathBuf::from(HOME),
        written: Mutex::new(Vec::new()),
    });
    RuntimeHooks {
        policy: Arc::new(CompiledPolicy::builtin_default(&EnvMap::new()).unwrap()),
        files: files.clone(),
        backend: files.id.clone(),
        missing_layers: Vec::new(),
        audit: None,
        approver: Some(approver),
        approved_rules: Mutex::new(HashSet::new()),
        in_flight: Mutex::new(HashMap::new()),
    }
}

fn ask(line: usize) -> cordon_policy::PolicyDecision {
    cordon_policy::PolicyDecision {
        decision: cordon_policy::Decision::Ask,
        rule: cordon_policy::RuleRef {
            file: Arc::from("policy.toml"),
            line,
        },
        reason: "changes need review".to_owned(),
        unanalysable: None,
        asked_by: Vec::new(),
    }
}

#[tokio::test]
async fn answers_to_ask_decide_the_call_and_always_covers_only_its_rule() {
    use crate::approval::Approval;
    use cordon_policy::Decision;

    let approver = Arc::new(ScriptedApprover {
        answers: Mutex::new(vec![
            Approval::Yes,
            Approval::Yes,
            Approval::Always,
            Approval::No,
            Approval::Unanswered("no answer within 1 s".to_owned()),
            Approval::Unavailable,
        ]),
        asked: Mutex::new(Vec::new()),
    });
    let hooks = hooks_with_approver(approver.clone());
    let args = json!({"path": "a.txt", "content": "x"});
    let resolve = |id: &'static str, line| hooks.resolve_ask(id, "write", &args, ask(line));

    // Once: the same call asks again.
    for id in ["c1", "c2"] {
        let decision = resolve(id, 3).await;
        assert_eq!(decision.decision, Decision::Allow);
        assert_eq!(decision.reason, "approved by the user: changes need review");
    }
    // Always: the rule's later calls run without asking; another rule still asks.
    let decision = resolve("c3", 3).await;
    assert_eq!(decision.decision, Decision::Allow);
    assert_eq!(
        decision.reason,
        "approved by the user for this session: changes need review"
    );
    let decision = resolve("c4", 3).await;
    assert_eq!(decision.decision, Decision::Allow);
    assert_eq!(
        decision.reason,
        "approved for this session: changes need review"
    );
    let declined = resolve("c5", 4).await;
    assert_eq!(declined.decision, Decision::Deny);
    assert_eq!(
        declined.reason,
        "the user declined this call (changes need review). Do not retry it; ask the user \
         what to do instead."
    );
    let unanswered = resolve("c6", 4).await;
    assert_eq!(unanswered.decision, Decision::Deny);
    assert_eq!(
        unanswered.reason,
        "approval required, but no answer was obtained (no answer within 1 s), so the call \
         was denied (changes need review). Do not retry it unchanged; tell the user it needs \
         their approval."
    );
    let unavailable = resolve("c7", 4).await;
    assert_eq!(unavailable, ask(4).non_interactive());

    let asked = approver.asked.lock().unwrap();
    let ids: Vec<&str> = asked
        .iter()
        .map(|request| request.call_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["c1", "c2", "c3", "c5", "c6", "c7"],
        "c4 was not asked"
    );
    assert_eq!(asked[0].rule, "policy.toml:3");
    assert_eq!(asked[0].tool, "write");
    assert_eq!(asked[0].args, args);
}

/// "Allow for this session" covers the rule the person was asked about and nothing more: a
/// later call that another asking rule also matches (one command approved for the session
/// chained with a second one that asks) is asked about again, and the question names every
/// rule that asks.
#[tokio::test]
async fn always_for_one_rule_does_not_approve_a_call_another_rule_asks_about() {
    use crate::approval::Approval;
    use cordon_policy::Decision;

    let policy = CompiledPolicy::from_toml(
        "p.toml",
        "version = 1\ndefault = \"allow\"\n\
         [tools]\nenabled = [\"bash\"]\n\
         [[rules]]\ncommand = [\"git\", \"push\"]\ndecision = \"ask\"\n\
         [[rules]]\ncommand = [\"rm\"]\ndecision = \"ask\"\n",
        &EnvMap::new(),
    )
    .unwrap();
    let approver = Arc::new(ScriptedApprover {
        answers: Mutex::new(vec![Approval::Always, Approval::No, Approval::Always]),
        asked: Mutex::new(Vec::new()),
    });
    let hooks = RuntimeHooks {
        policy: Arc::new(policy),
        ..hooks_with_approver(approver.clone())
    };
    let decide = |id: &'static str, command: &'static str| {
        let hooks = &hooks;
        async move {
            let args = json!({ "command": command });
            let decision = hooks.policy.decide(&cordon_policy::DecisionRequest {
                tool: "bash",
                args: &args,
                paths: &[],
                root: Path::new(ROOT),
                home: Some(Path::new(HOME)),
            });
            hooks.resolve_ask(id, "bash", &args, decision).await
        }
    };

    assert_eq!(decide("c1", "git push").await.decision, Decision::Allow);
    // Approved for the session: no question.
    assert_eq!(
        decide("c2", "git push origin").await.decision,
        Decision::Allow
    );
    // `rm` asks too: the session approval of `git push` does not cover it.
    assert_eq!(
        decide("c3", "git push && rm -rf src").await.decision,
        Decision::Deny
    );
    // An "always" for a call two rules ask about covers both.
    assert_eq!(
        decide("c4", "git push; rm -rf target").await.decision,
        Decision::Allow
    );
    assert_eq!(decide("c5", "rm -rf build").await.decision, Decision::Allow);

    let asked = approver.asked.lock().unwrap();
    let ids: Vec<&str> = asked.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, ["c1", "c3", "c4"]);
    assert_eq!(asked[0].rule, "p.toml:5");
    assert_eq!(asked[1].rule, "p.toml:5, p.toml:8");
}

/// A finished bash call's egress attempts land on its audit line, after `prev`, and the log
/// still verifies; another tool's details are never read as attempts.
#[tokio::test]
async fn a_bash_calls_egress_attempts_are_audited() {
    use cordon_core::hooks::{AfterToolCall, BeforeToolCall, ToolHooks};
    use cordon_core::protocol::{AssistantMessage, ToolCall};
    use cordon_core::tool::AgentToolResult;

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("audit.jsonl");
    let log = Arc::new(crate::audit::AuditLog::open(&log_path).unwrap());
    let files = Arc::new(RecordingFiles {
        id: BackendId::new("test:egress"),
        root: PathBuf::from(ROOT),
        home: PathBuf::from(HOME),
        written: Mutex::new(Vec::new()),
    });
    let hooks = RuntimeHooks {
        policy: Arc::new(CompiledPolicy::builtin_default(&EnvMap::new()).unwrap()),
        files: files.clone(),
        backend: files.id.clone(),
        missing_layers: Vec::new(),
        audit: Some(log.clone()),
        approver: None,
        approved_rules: Mutex::new(HashSet::new()),
        in_flight: Mutex::new(HashMap::new()),
    };
    let attempts = json!([
        {"protocol": "httpConnect", "host": "static.crates.io", "port": 443,
         "outcome": "allowed", "entry": "*.crates.io", "source": "p.toml:6",
         "reason": "relayed until both sides closed", "bytesUp": 517, "bytesDown": 40960,
         "durationMs": 12},
        {"protocol": "socks5", "host": "evil.test", "port": 22, "outcome": "denied",
         "suggestion": "evil.test:22", "reason": "no entry allows evil.test:22",
         "bytesUp": 0, "bytesDown": 0, "durationMs": 1},
    ]);
    let message = AssistantMessage::default();
    for (id, tool, args) in [
        ("b1", "bash", json!({"command": "cargo fetch"})),
        ("l1", "ls", json!({"path": "."})),
    ] {
        let call = ToolCall {
            id: id.to_owned(),
            name: tool.to_owned(),
            arguments: args.clone(),
        };
        let outcome = hooks
            .before_tool_call(
                BeforeToolCall {
                    assistant_message: &message,
                    tool_call: &call,
                    context: &[],
                },
                &mut args.clone(),
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(outcome, cordon_core::hooks::BeforeOutcome::Continue);
        let result = AgentToolResult {
            details: Some(json!({"egress": attempts.clone(), "egressOmitted": 4})),
            ..AgentToolResult::text("out")
        };
        hooks
            .after_tool_call(
                AfterToolCall {
                    assistant_message: &message,
                    tool_call: &call,
                    args: &args,
                    result: &result,
                    context: &[],
                },
                &CancellationToken::new(),
            )
            .await
            .unwrap();
    }
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        cordon_policy::audit::verify_audit_log(&text).unwrap().lines,
        4
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // The decision line has none; the finished bash line has them all; ls has none.
    assert_eq!(lines[0].get("egress"), None);
    assert_eq!(lines[1]["toolCallId"], "b1");
    assert_eq!(lines[1]["egress"], attempts);
    assert_eq!(lines[1]["egressOmitted"], 4);
    assert_eq!(lines[3]["toolCallId"], "l1");
    assert_eq!(lines[3].get("egress"), None);
    assert_eq!(lines[3].get("egressOmitted"), None);
    // `prev` comes before the attempts in the line's text.
    let raw = text.lines().nth(1).unwrap();
    assert!(
        raw.find("\"prev\"").unwrap() < raw.find("\"egress\"").unwrap(),
        "{raw}"
    );
}
