//! The system prompt of `cordon run`: who the model is, the tools it has (each tool's own
//! prompt snippet and guidelines), the workspace root, and the sandbox facts that change what
//! the model should attempt (network, what it may not write or read, timeouts).
//!
//! A pure function of its inputs, so the whole text is tested here. It describes the sandbox;
//! it enforces nothing (the backend and the policy hooks do).

use std::path::Path;
use std::sync::Arc;

use cordon_core::sandbox::{NestedGit, NetworkMode, RootAccess, SandboxSpec};
use cordon_core::tool::AgentTool;

/// What the system prompt is built from.
pub struct PromptFacts<'a> {
    /// The tools the model is offered, in the order it sees them.
    pub tools: &'a [Arc<dyn AgentTool>],
    /// The workspace root in the backend's namespace.
    pub root: &'a Path,
    /// What the backend enforces.
    pub spec: &'a SandboxSpec,
    /// Today's date, `YYYY-MM-DD`.
    pub date: &'a str,
}

/// Guidelines that hold whatever the tools are.
const GENERAL_GUIDELINES: [&str; 3] = [
    "Be concise in your responses.",
    "Show file paths clearly when working with files.",
    "A call the policy blocks or the sandbox refuses returns an error saying why: do not try \
     to work around the sandbox or the policy; say what you could not do.",
];

/// The system prompt for `facts`.
pub fn system_prompt(facts: &PromptFacts<'_>) -> String {
    let PromptFacts {
        tools,
        root,
        spec,
        date,
    } = facts;
    let mut out = String::from(
        "You are an expert coding agent. You help the user by reading files, running commands, \
         editing code and writing new files, using only the tools below. Every tool call is \
         checked against the operator's policy and runs inside a sandbox.\n\nAvailable tools:\n",
    );
    for tool in tools.iter() {
        let line = tool.prompt_snippet().unwrap_or_else(|| tool.description());
        out.push_str(&format!("- {}: {}\n", tool.name(), one_line(line)));
    }
    out.push_str("\nGuidelines:\n");
    let mut seen: Vec<&str> = Vec::new();
    let tool_guidelines = tools.iter().flat_map(|tool| tool.prompt_guidelines());
    for guideline in tool_guidelines.chain(GENERAL_GUIDELINES.iter()) {
        if !seen.contains(guideline) {
            seen.push(guideline);
            out.push_str(&format!("- {}\n", one_line(guideline)));
        }
    }
    out.push_str(&format!(
        "\nWorkspace root: {} (relative paths in tool calls and the working directory of \
         commands).\n",
        root.display()
    ));
    out.push_str("\nSandbox:\n");
    for fact in sandbox_facts(spec) {
        out.push_str(&format!("- {fact}\n"));
    }
    out.push_str(&format!("\nCurrent date: {date}\n"));
    out
}

/// The sandbox facts a model should plan around, one sentence each.
fn sandbox_facts(spec: &SandboxSpec) -> Vec<String> {
    let SandboxSpec {
        workspace,
        readable_roots,
        writable_roots,
        protected,
        denied,
        network,
        unix_sockets,
        egress,
        limits,
        env: _,
        allow_degraded: _,
        nested_git,
        // Where the entries come from: for the notes on failed commands, not for the prompt.
        sources: _,
    } = spec;
    let mut facts = Vec::new();
    facts.push(match network {
        NetworkMode::Disabled => "Network: off. Commands cannot reach the network: no \
                                  downloads, no package registries, no git fetch or push. Work \
                                  with what is already on disk."
            .to_owned(),
        NetworkMode::Enabled if unix_sockets.is_empty() => {
            "Network: on for commands. Host Unix sockets (Docker, databases, agents) are out of \
             reach."
                .to_owned()
        }
        NetworkMode::Enabled => format!(
            "Network: on for commands. Of the host's Unix sockets only these are reachable: {}.",
            unix_sockets.join(", ")
        ),
        NetworkMode::Filtered => filtered_network_fact(&egress.allow, unix_sockets),
    });
    facts.push(match workspace {
        RootAccess::ReadWrite => "The workspace is readable and writable.".to_owned(),
        RootAccess::ReadOnly => {
            "The workspace is read-only: do not try to create or change files.".to_owned()
        }
    });
    if !protected.is_empty() {
        facts.push(format!(
            "Protected (readable, never writable, also by commands): {}.",
            protected.join(", ")
        ));
    }
    if !denied.is_empty() {
        facts.push(format!(
            "Denied (neither readable nor writable): {}.",
            denied.join(", ")
        ));
    }
    match nested_git {
        NestedGit::Quarantine => facts.push(
            "Do not create git repositories (`git init`, a `.git` anywhere, a bare repository \
             layout): the sandbox renames them to `*.cordon-quarantine` after every command."
                .to_owned(),
        ),
        NestedGit::Allow => {}
    }
    if !writable_roots.is_empty() {
        facts.push(format!(
            "Also writable outside the workspace: {}.",
            writable_roots.join(", ")
        ));
    }
    if !readable_roots.is_empty() {
        facts.push(format!(
            "Also readable outside the workspace: {}. Everything else outside the workspace \
             is out of reach.",
            readable_roots.join(", ")
        ));
    } else {
        facts.push("Everything outside the workspace is out of reach.".to_owned());
    }
    facts.push(format!(
        "Commands time out after {} s unless you pass a timeout (at most {} s).",
        limits.default_timeout.as_secs(),
        limits.max_timeout.as_secs()
    ));
    facts
}

/// Most allow entries the prompt lists; the rest are counted.
const PROMPT_EGRESS_ENTRIES: usize = 20;

/// The network fact in filtered mode: which destinations the proxy lets through.
fn filtered_network_fact(allow: &[String], unix_sockets: &[String]) -> String {
    let mut listed = allow
        .iter()
        .take(PROMPT_EGRESS_ENTRIES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if allow.len() > PROMPT_EGRESS_ENTRIES {
        listed.push_str(&format!(
            " and {} more",
            allow.len() - PROMPT_EGRESS_ENTRIES
        ));
    }
    let sockets = if unix_sockets.is_empty() {
        "Host Unix sockets (Docker, databases, agents) are out of reach.".to_owned()
    } else {
        format!(
            "Of the host's Unix sockets only these are reachable: {}.",
            unix_sockets.join(", ")
        )
    };
    format!(
        "Network: filtered. Commands reach only these destinations, through Cordon's proxy \
         (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; ordinary tools use them): {listed}. \
         Anything else is refused and the command's result says which entry to add. {sockets}"
    )
}

/// Tool texts wrapped over several source lines become one line of the list.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use cordon_core::sandbox::Limits;
    use cordon_core::tool::{AgentToolResult, ToolError, ToolInvocation};
    use serde_json::{Value, json};

    use super::*;

    struct FakeTool {
        name: &'static str,
        snippet: Option<&'static str>,
        guidelines: &'static [&'static str],
        parameters: Value,
    }

    #[async_trait]
    impl AgentTool for FakeTool {
        fn name(&self) -> &str {
            self.name
        }
        fn label(&self) -> &str {
            self.name
        }
        fn description(&self) -> &str {
            "A tool without a snippet,\n  described over two lines."
        }
        fn parameters(&self) -> &Value {
            &self.parameters
        }
        fn prompt_snippet(&self) -> Option<&str> {
            self.snippet
        }
        fn prompt_guidelines(&self) -> &[&str] {
            self.guidelines
        }
        async fn execute(&self, _: ToolInvocation) -> Result<AgentToolResult, ToolError> {
            Ok(AgentToolResult::text("unused"))
        }
    }

    fn tool(
        name: &'static str,
        snippet: Option<&'static str>,
        guidelines: &'static [&'static str],
    ) -> Arc<dyn AgentTool> {
        Arc::new(FakeTool {
            name,
            snippet,
            guidelines,
            parameters: json!({"type": "object"}),
        })
    }

    #[test]
    fn lists_tools_guidelines_root_and_sandbox_facts() {
        let tools = [
            tool("read", Some("Read file contents"), &["Use read, not cat."]),
            tool("custom", None, &["Use read, not cat.", "Custom rule."]),
        ];
        let spec = SandboxSpec {
            denied: vec!["**/.env".into()],
            limits: Limits {
                default_timeout: Duration::from_secs(120),
                max_timeout: Duration::from_secs(1800),
                ..Limits::default()
            },
            ..SandboxSpec::default()
        };
        let prompt = system_prompt(&PromptFacts {
            tools: &tools,
            root: Path::new("/work/project"),
            spec: &spec,
            date: "2026-01-02",
        });
        assert_eq!(
            prompt,
            "You are an expert coding agent. You help the user by reading files, running \
             commands, editing code and writing new files, using only the tools below. Every \
             tool call is checked against the operator's policy and runs inside a sandbox.\n\
             \n\
             Available tools:\n\
             - read: Read file contents\n\
             - custom: A tool without a snippet, described over two lines.\n\
             \n\
             Guidelines:\n\
             - Use read, not cat.\n\
             - Custom rule.\n\
             - Be concise in your responses.\n\
             - Show file paths clearly when working with files.\n\
             - A call the policy blocks or the sandbox refuses returns an error saying why: do \
             not try to work around the sandbox or the policy; say what you could not do.\n\
             \n\
             Workspace root: /work/project (relative paths in tool calls and the working \
             directory of commands).\n\
             \n\
             Sandbox:\n\
             - Network: off. Commands cannot reach the network: no downloads, no package \
             registries, no git fetch or push. Work with what is already on disk.\n\
             - The workspace is readable and writable.\n\
             - Protected (readable, never writable, also by commands): .git/**.\n\
             - Denied (neither readable nor writable): **/.env.\n\
             - Do not create git repositories (`git init`, a `.git` anywhere, a bare \
             repository layout): the sandbox renames them to `*.cordon-quarantine` after every \
             command.\n\
             - Everything outside the workspace is out of reach.\n\
             - Commands time out after 120 s unless you pass a timeout (at most 1800 s).\n\
             \n\
             Current date: 2026-01-02\n"
        );
    }

    #[test]
    fn states_network_read_only_workspace_and_extra_roots() {
        let spec = SandboxSpec {
            workspace: RootAccess::ReadOnly,
            network: NetworkMode::Enabled,
            unix_sockets: vec!["/run/postgresql/.s.PGSQL.5432".into()],
            protected: Vec::new(),
            readable_roots: vec!["~/.cargo".into()],
            writable_roots: vec!["/tmp/build".into()],
            nested_git: NestedGit::Allow,
            ..SandboxSpec::default()
        };
        assert_eq!(
            sandbox_facts(&spec),
            vec![
                "Network: on for commands. Of the host's Unix sockets only these are reachable: \
                 /run/postgresql/.s.PGSQL.5432."
                    .to_owned(),
                "The workspace is read-only: do not try to create or change files.".to_owned(),
                "Also writable outside the workspace: /tmp/build.".to_owned(),
                "Also readable outside the workspace: ~/.cargo. Everything else outside the \
                 workspace is out of reach."
                    .to_owned(),
                "Commands time out after 120 s unless you pass a timeout (at most 1800 s)."
                    .to_owned(),
            ]
        );
    }

    #[test]
    fn filtered_network_lists_the_allowed_destinations_bounded() {
        let spec = SandboxSpec {
            network: NetworkMode::Filtered,
            egress: cordon_core::sandbox::EgressSpec {
                allow: vec!["crates.io".into(), "*.crates.io".into()],
                deny: vec!["evil.crates.io".into()],
                ask: Vec::new(),
            },
            ..SandboxSpec::default()
        };
        assert_eq!(
            sandbox_facts(&spec)[0],
            "Network: filtered. Commands reach only these destinations, through Cordon's proxy \
             (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set; ordinary tools use them): \
             crates.io, *.crates.io. Anything else is refused and the command's result says \
             which entry to add. Host Unix sockets (Docker, databases, agents) are out of reach."
        );
        let many = (0..25).map(|i| format!("h{i}.test")).collect::<Vec<_>>();
        let fact = filtered_network_fact(&many, &["/run/x.sock".to_owned()]);
        assert!(fact.contains("h19.test and 5 more."), "{fact}");
        assert!(!fact.contains("h20.test"), "{fact}");
        assert!(
            fact.ends_with("Of the host's Unix sockets only these are reachable: /run/x.sock."),
            "{fact}"
        );
    }
}
