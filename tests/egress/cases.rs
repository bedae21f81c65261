//! The egress cases: each opens a workspace with a filtered-network policy of its own and
//! checks what a command reaches, what it is told when refused (the proxy's 403 and the note
//! the bash result ends with, naming the entry to change), and that the refused destination
//! was never reached.

use std::net::Ipv4Addr;
use std::sync::Arc;

use cordon_runtime::{Approval, ApprovalRequest, Approver};
use cordon_tests::{Called, Harness, Workspace, WorkspaceOptions};
use serde_json::{Value, json};

use crate::servers::{DOMAIN, OTHER, Origin, PKG, git_server, host_addresses, publish_wheel};

const HELLO: &str = "hello through the proxy\n";

/// A policy with these `allow` entries (line 5) and `deny` entries (line 6).
fn policy(allow: &[String], deny: &[&str]) -> String {
    let list = |entries: &mut dyn Iterator<Item = String>| {
        entries
            .map(|entry| format!("{entry:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "version = 1\n[filesystem]\nwrite = [\"**\"]\n[network]\nallow = [{}]\n",
        list(&mut allow.iter().cloned())
    );
    if !deny.is_empty() {
        text.push_str(&format!(
            "deny = [{}]\n",
            list(&mut deny.iter().map(|d| (*d).to_owned()))
        ));
    }
    text
}

async fn open(h: &Arc<dyn Harness>, allow: &[String], deny: &[&str]) -> Workspace {
    Workspace::open_with(h, WorkspaceOptions::policy(&policy(allow, deny))).await
}

async fn bash(ws: &Workspace, command: &str) -> Called {
    ws.call("bash", json!({"command": command, "timeout": 300}))
        .await
}

/// The bash call's connection attempts (`details.egress`).
fn egress(run: &Called) -> Vec<Value> {
    run.details()["egress"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Panics unless `run` says the proxy refused `destination` because no entry allows it, and
/// names the entry to add.
#[track_caller]
fn assert_unlisted(run: &Called, destination: &str, entry: &str) {
    assert!(
        run.text.contains(&format!(
            "cordon: connection to {destination} refused by the network policy\nno entry allows \
             {destination}\nto allow it, add \"{entry}\" to [network] allow in the policy"
        )),
        "{}",
        run.text
    );
    assert!(
        run.text.contains(&format!(
            "no entry allows {destination}; to allow it, the operator can add \"{entry}\" to \
             `[network] allow` in $POLICY"
        )),
        "the note names the entry to add: {}",
        run.text
    );
}

/// A port no server listens on that is not `port`.
fn other_port(port: u16) -> u16 {
    if port == u16::MAX { port - 1 } else { port + 1 }
}

pub async fn allowed_name_over_http_and_connect(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let ws = open(
        &h,
        &[format!("{PKG}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let url = format!("http://{PKG}:{p}/hello.txt");
    // curl and python as they are: the proxy variables send HTTP as forward requests, and
    // `--proxytunnel`/`set_tunnel` make the same request through a CONNECT tunnel.
    let run = bash(
        &ws,
        &format!(
            "curl -sS {url} && curl -sS --proxytunnel {url} && python3 - <<'EOF'\n\
             import os, urllib.request, urllib.parse, http.client\n\
             print(urllib.request.urlopen('{url}').read().decode(), end='')\n\
             proxy = urllib.parse.urlsplit(os.environ['https_proxy'])\n\
             tunnel = http.client.HTTPConnection(proxy.hostname, proxy.port)\n\
             tunnel.set_tunnel('{PKG}', {p})\n\
             tunnel.request('GET', '/hello.txt')\n\
             print(tunnel.getresponse().read().decode(), end='')\n\
             EOF"
        ),
    )
    .await;
    run.assert_ok(&HELLO.repeat(4));
    let attempts = egress(&run);
    let seen: Vec<(String, String, String)> = attempts
        .iter()
        .map(|a| {
            (
                a["host"].as_str().unwrap_or_default().to_owned(),
                a["protocol"].as_str().unwrap_or_default().to_owned(),
                a["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let attempt = |protocol: &str| (PKG.to_owned(), protocol.to_owned(), "allowed".to_owned());
    assert_eq!(
        seen,
        [
            attempt("httpForward"),
            attempt("httpConnect"),
            attempt("httpForward"),
            attempt("httpConnect")
        ],
        "{attempts:#?}"
    );
    assert_eq!(origin.accepted(), 4);
}

pub async fn unlisted_name_is_refused_naming_the_entry_to_add(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let ws = open(
        &h,
        &[format!("{PKG}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let url = format!("http://{OTHER}:{p}/hello.txt");
    let run = bash(
        &ws,
        &format!(
            "curl -sS {url}; curl -sS --proxytunnel {url}; echo \"tunnel: $?\"; python3 - <<'EOF'\n\
             import urllib.request, urllib.error\n\
             try:\n    urllib.request.urlopen('{url}')\n\
             except urllib.error.HTTPError as error:\n    print('python:', error.code)\n\
             EOF"
        ),
    )
    .await;
    let destination = format!("{OTHER}:{p}");
    assert_unlisted(&run, &destination, &destination);
    assert!(run.text.contains("tunnel: 56\n"), "{}", run.text);
    assert!(run.text.contains("python: 403\n"), "{}", run.text);
    assert!(
        run.text
            .contains(&format!("- {destination} (3 attempts): no entry allows")),
        "{}",
        run.text
    );
    assert_eq!(origin.accepted(), 0);
}

pub async fn port_and_wildcard_entries(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let q = other_port(p);
    let ws = open(
        &h,
        &[format!("*.{DOMAIN}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    // A subdomain on the listed port: allowed.
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{p}/hello.txt")).await;
    run.assert_ok(HELLO);
    // Another port: refused.
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{q}/hello.txt")).await;
    assert_unlisted(&run, &format!("{PKG}:{q}"), &format!("{PKG}:{q}"));
    // The wildcard does not match the domain itself.
    let run = bash(&ws, &format!("curl -sS http://{DOMAIN}:{p}/hello.txt")).await;
    assert_unlisted(&run, &format!("{DOMAIN}:{p}"), &format!("{DOMAIN}:{p}"));
    assert_eq!(origin.accepted(), 1);
}

pub async fn deny_beats_allow(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let ws = open(
        &h,
        &[format!("*.{DOMAIN}:{p}"), format!("127.0.0.1/32:{p}")],
        &[&format!("{OTHER}:{p}")],
    )
    .await;
    let run = bash(&ws, &format!("curl -sS http://{OTHER}:{p}/hello.txt")).await;
    let destination = format!("{OTHER}:{p}");
    assert!(
        run.text.contains(&format!(
            "cordon: connection to {destination} refused by the network policy\ndeny entry \
             \"{destination}\" ($POLICY:6) matches {destination}\nto allow it, remove or narrow \
             that deny entry in [network] deny"
        )),
        "{}",
        run.text
    );
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{p}/hello.txt")).await;
    run.assert_ok(HELLO);
    assert_eq!(origin.accepted(), 1);
}

pub async fn ip_and_cidr_entries(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let q = other_port(p);
    let ws = open(&h, &[format!("127.0.0.0/8:{p}")], &[]).await;
    // Loopback is in NO_PROXY (a command's own servers); emptied, curl asks the proxy.
    let run = bash(
        &ws,
        &format!("NO_PROXY= no_proxy= curl -sS http://127.0.0.1:{p}/hello.txt"),
    )
    .await;
    run.assert_ok(HELLO);
    let run = bash(
        &ws,
        &format!("NO_PROXY= no_proxy= curl -sS http://127.0.0.1:{q}/hello.txt"),
    )
    .await;
    assert_unlisted(&run, &format!("127.0.0.1:{q}"), &format!("127.0.0.1:{q}"));
    // An address entry does not allow a name that resolves to it.
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{p}/hello.txt")).await;
    assert_unlisted(&run, &format!("{PKG}:{p}"), &format!("{PKG}:{p}"));
    assert_eq!(origin.accepted(), 1);
}

pub async fn rebinding_to_loopback_is_refused(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let ws = open(&h, &[format!("{PKG}:{p}")], &[]).await;
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{p}/hello.txt")).await;
    assert!(
        run.text.contains(&format!(
            "{PKG} resolved to 127.0.0.1, a loopback address, which a name entry alone does not \
             allow (the name is allowed by \"{PKG}:{p}\" ($POLICY:5))"
        )) && run
            .text
            .contains(&format!("add \"127.0.0.1/32:{p}\" to [network] allow")),
        "{}",
        run.text
    );
    assert_eq!(origin.accepted(), 0);
}

pub async fn direct_tcp_to_an_allowed_address_is_refused(h: Arc<dyn Harness>) {
    // On every address of the host, so that whatever a command could route to has it.
    let origin = Origin::serve(Ipv4Addr::UNSPECIFIED).await;
    let p = origin.port;
    let mut addresses = vec!["127.0.0.1".to_owned()];
    addresses.extend(host_addresses());
    let allow: Vec<String> = addresses.iter().map(|a| format!("{a}/32:{p}")).collect();
    let ws = open(&h, &allow, &[]).await;
    let list: Vec<String> = addresses.iter().map(|a| format!("'{a}'")).collect();
    let run = bash(
        &ws,
        &format!(
            "python3 - <<'EOF'\n\
             import socket\n\
             for address in [{}]:\n    \
                 try:\n        \
                     socket.create_connection((address, {p}), timeout=20).close()\n        \
                     print(address, 'reached')\n    \
                 except OSError as error:\n        \
                     print(address, 'refused', type(error).__name__)\n\
             EOF",
            list.join(", ")
        ),
    )
    .await;
    for address in &addresses {
        assert!(
            run.text.contains(&format!("{address} refused ")),
            "{address}: {}",
            run.text
        );
    }
    assert!(!run.text.contains("reached"), "{}", run.text);
    assert_eq!(origin.accepted(), 0, "{}", run.text);
    // Through the proxy the same address is reached.
    let run = bash(
        &ws,
        &format!("NO_PROXY= no_proxy= curl -sS http://127.0.0.1:{p}/hello.txt"),
    )
    .await;
    run.assert_ok(HELLO);
    assert_eq!(origin.accepted(), 1);
}

pub async fn udp_and_dns_are_refused(h: Arc<dyn Harness>) {
    let ws = open(&h, &["192.0.2.1/32:53".to_owned()], &[]).await;
    let mut addresses = vec!["192.0.2.1".to_owned(), "8.8.8.8".to_owned()];
    addresses.extend(host_addresses());
    let list: Vec<String> = addresses.iter().map(|a| format!("'{a}'")).collect();
    let run = bash(
        &ws,
        &format!(
            "python3 - <<'EOF'\n\
             import socket\n\
             for address in [{}]:\n    \
                 try:\n        \
                     socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', (address, 53))\n        \
                     print(address, 'sent')\n    \
                 except OSError as error:\n        \
                     print(address, 'refused', type(error).__name__)\n\
             try:\n    \
                 socket.getaddrinfo('example.com', 80)\n    \
                 print('dns answered')\n\
             except OSError as error:\n    \
                 print('dns refused', type(error).__name__)\n\
             EOF",
            list.join(", ")
        ),
    )
    .await;
    for address in &addresses {
        assert!(
            run.text.contains(&format!("{address} refused ")),
            "{address}: {}",
            run.text
        );
    }
    assert!(!run.text.contains(" sent"), "{}", run.text);
    assert!(run.text.contains("dns refused gaierror"), "{}", run.text);
}

/// `pip download` and `pip install` from the index at `host:port`, then the module imported.
fn pip_commands(host: &str, port: u16) -> String {
    let index = format!(
        "--index-url http://{host}:{port}/simple/ --trusted-host {host} --no-cache-dir \
         --disable-pip-version-check"
    );
    format!(
        "/usr/bin/python3 -m pip download {index} -d dl cordon-demo && \
         /usr/bin/python3 -m pip install {index} --break-system-packages --target site cordon-demo && \
         PYTHONPATH=site /usr/bin/python3 -c 'import cordon_demo; print(\"imported\", cordon_demo.VALUE)'"
    )
}

pub async fn pip_installs_from_an_allowed_index_only(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    publish_wheel(&origin);
    let p = origin.port;
    let ws = open(
        &h,
        &[format!("{PKG}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let run = bash(&ws, &pip_commands(PKG, p)).await;
    assert!(!run.is_error(), "{}", run.text);
    assert!(run.text.contains("imported 42"), "{}", run.text);
    assert!(ws.exists("dl/cordon_demo-0.1-py3-none-any.whl"));

    let ws = open(
        &h,
        &[format!("{OTHER}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let run = bash(&ws, &pip_commands(PKG, p)).await;
    assert!(run.is_error(), "{}", run.text);
    // pip hides the proxy's 403 at its default verbosity; the note names the entry to add.
    assert!(
        run.text.contains(&format!(
            "no entry allows {PKG}:{p}; to allow it, the operator can add \"{PKG}:{p}\" to \
             `[network] allow` in $POLICY"
        )),
        "{}",
        run.text
    );
    assert!(!ws.exists("site/cordon_demo"));
}

pub async fn git_clones_over_http_from_an_allowed_name_only(h: Arc<dyn Harness>) {
    let (_server, p, _dir) = git_server().await;
    let ws = open(
        &h,
        &[format!("{PKG}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let clone = |host: &str| {
        // Outside the workspace: a repository created there would be quarantined.
        format!(
            "d=$(mktemp -d) && git clone -q http://{host}:{p}/cgi-bin/git/repo.git \"$d/clone\" \
             && cat \"$d/clone/README\""
        )
    };
    let run = bash(&ws, &clone(PKG)).await;
    // (The local backend also reports the clone's metadata it quarantined.)
    assert!(
        !run.is_error() && run.text.starts_with("fetched through the proxy\n"),
        "{}",
        run.text
    );

    let ws = open(
        &h,
        &[format!("{PKG}:{p}"), format!("127.0.0.1/32:{p}")],
        &[],
    )
    .await;
    let run = bash(&ws, &clone(OTHER)).await;
    assert!(run.is_error(), "{}", run.text);
    assert!(
        run.text.contains("The requested URL returned error: 403"),
        "{}",
        run.text
    );
    assert!(
        run.text.contains(&format!(
            "no entry allows {OTHER}:{p}; to allow it, the operator can add \"{OTHER}:{p}\""
        )),
        "{}",
        run.text
    );
}

/// Approves every question once, recording the call each names.
#[derive(Default)]
struct ApproveOnce {
    asked: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl Approver for ApproveOnce {
    async fn approve(&self, request: ApprovalRequest) -> Approval {
        self.asked
            .lock()
            .expect("asked")
            .push((request.call_id, request.args["destination"].to_string()));
        Approval::Yes
    }
}

/// A workspace whose policy asks about `PKG:port` (the IP entry lets the test name's loopback
/// address pass the address check), asking `approver`.
async fn open_asking(h: &Arc<dyn Harness>, port: u16, approver: Arc<dyn Approver>) -> Workspace {
    let text = format!(
        "{}ask = [\"{PKG}:{port}\"]\n",
        policy(&[format!("127.0.0.1/32:{port}")], &[])
    );
    Workspace::open_with(
        h,
        WorkspaceOptions {
            approver: Some(approver),
            ..WorkspaceOptions::policy(&text)
        },
    )
    .await
}

/// A `[network] ask` destination is a question that names the tool call whose command
/// connected (so a front end serving several clients, MCP, asks that call's client); approved
/// once, the command reaches it.
pub async fn an_ask_question_names_the_call_that_connected(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let approver = Arc::new(ApproveOnce::default());
    let ws = open_asking(&h, p, approver.clone()).await;
    let run = bash(&ws, &format!("curl -sS http://{PKG}:{p}/hello.txt")).await;
    run.assert_ok(HELLO);
    let call = run
        .events
        .iter()
        .find_map(|event| match event {
            cordon_core::event::AgentEvent::ToolExecutionStart { tool_call_id, .. } => {
                Some(tool_call_id.clone())
            }
            _ => None,
        })
        .expect("the call started");
    assert_eq!(
        *approver.asked.lock().expect("asked"),
        vec![(call, format!("\"{PKG}:{p}\""))]
    );
    let attempts = egress(&run);
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["outcome"], "allowed", "{attempts:?}");
    assert_eq!(attempts[0]["asked"], "once", "{attempts:?}");
}

/// Never answers: tells when it is asked and when the question is withdrawn (its future
/// dropped, which is how the MCP front end withdraws a form from the person).
struct NeverAnswers {
    asked: tokio::sync::mpsc::UnboundedSender<()>,
    withdrawn: tokio::sync::mpsc::UnboundedSender<()>,
}

/// Sends on drop.
struct Withdrawal(tokio::sync::mpsc::UnboundedSender<()>);

impl Drop for Withdrawal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

#[async_trait::async_trait]
impl Approver for NeverAnswers {
    async fn approve(&self, _request: ApprovalRequest) -> Approval {
        let _withdrawal = Withdrawal(self.withdrawn.clone());
        let _ = self.asked.send(());
        std::future::pending().await
    }
}

/// A question whose command ended before anyone answered is withdrawn: the person is not
/// left with a question nobody waits for (wherever the proxy runs: over the helper's stream,
/// the helper withdraws it).
pub async fn an_ask_question_is_withdrawn_when_its_command_ends(h: Arc<dyn Harness>) {
    let origin = Origin::serve(Ipv4Addr::LOCALHOST).await;
    let p = origin.port;
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let (withdrawn_tx, mut withdrawn) = tokio::sync::mpsc::unbounded_channel();
    let approver = Arc::new(NeverAnswers {
        asked: asked_tx,
        withdrawn: withdrawn_tx,
    });
    let ws = open_asking(&h, p, approver).await;
    // curl gives up on its own (nobody answers); the command then ends.
    let run = bash(
        &ws,
        &format!("curl -sS --max-time 3 http://{PKG}:{p}/hello.txt; echo ended"),
    )
    .await;
    assert!(run.text.contains("ended"), "{}", run.text);
    assert!(asked.try_recv().is_ok(), "the question was asked");
    // Bounded only so that a question left open fails the test instead of hanging it.
    tokio::time::timeout(std::time::Duration::from_secs(60), withdrawn.recv())
        .await
        .expect("the question is withdrawn once its command ended")
        .expect("withdrawn");
}
