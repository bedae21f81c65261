//! The shared orchestration over a transport that starts local processes (the smallest
//! transport there is, in a few lines): commands through `RemoteBash` reuse one worker, a
//! worker that died while idle is replaced within the call, a transport that cannot start a
//! worker is reported, refusals and early cancels never reach the transport, and one-shot
//! commands are collected whole; the file operations run on the same workers.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use cordon_core::sandbox::SandboxSpec;
use cordon_ops::{
    BackendId, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, FileOperations,
    FsError, Termination,
};
use cordon_remote::file_ops::{FileHost, RemoteFiles};
use cordon_remote::files::{PathRules, Root};
use cordon_remote::pool::PooledWorker;
use cordon_remote::runner::{Attempt, Command, CommandHost, Lease, RemoteBash, Runner};
use cordon_remote::transport::{Collected, Control, Events, Process, StdinEnd, Transport};
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::transport;

/// Processes on this machine; counts how many it started, and can be told to refuse.
#[derive(Default)]
struct LocalTransport {
    started: AtomicUsize,
    pids: std::sync::Mutex<Vec<u32>>,
    broken: bool,
}

struct LocalProcess {
    _child: Child,
    events: Events<'static>,
    stdin: Option<ChildStdin>,
}

/// A process's stdin: shutting it down closes the pipe (EOF), as a transport's must.
struct Stdin<'a>(&'a mut Option<ChildStdin>);

impl AsyncWrite for Stdin<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut().0.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().0.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(stdin) = this.0.as_mut() {
            std::task::ready!(Pin::new(stdin).poll_flush(cx))?;
        }
        *this.0 = None;
        Poll::Ready(Ok(()))
    }
}

impl Transport for LocalTransport {
    type Process = LocalProcess;

    async fn start(&self, argv: Vec<String>) -> Result<LocalProcess, String> {
        if self.broken {
            return Err("failed to start a process: the transport is down".to_owned());
        }
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        self.started.fetch_add(1, Ordering::SeqCst);
        if let Some(pid) = child.id() {
            self.pids.lock().expect("pids").push(pid);
        }
        let (events, stdin) = transport(&mut child);
        Ok(LocalProcess {
            _child: child,
            events: Box::pin(events),
            stdin: Some(stdin),
        })
    }
}

impl PooledWorker for LocalProcess {
    fn idle_alive(&mut self) -> bool {
        self.events.next().now_or_never().is_none()
    }
}

impl Process for LocalProcess {
    fn io(&mut self) -> (Events<'_>, Control<'_>) {
        (Box::pin(&mut self.events), Box::pin(Stdin(&mut self.stdin)))
    }
}

/// A backend whose only part of a command is giving the worker back and settling.
struct Host {
    id: BackendId,
    runner: Arc<Runner<LocalTransport>>,
    refuse: bool,
}

impl Host {
    fn new(transport: LocalTransport) -> Arc<Host> {
        Arc::new(Host {
            id: BackendId::new("local-test"),
            runner: Arc::new(Runner::new(transport, 2)),
            refuse: false,
        })
    }
}

impl CommandHost for Host {
    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn admit(&self) -> Result<(), ExecError> {
        if self.refuse {
            return Err(ExecError::Sandbox {
                layer: "test",
                reason: "refused".to_owned(),
            });
        }
        Ok(())
    }

    async fn run(&self, command: Command) -> Result<ExecOutcome, ExecError> {
        let Command {
            line,
            request,
            cwd,
            output: _,
        } = command;
        let (outcome, process) = match self.runner.run(&line.line, &request).await? {
            Attempt::Ran {
                outcome,
                lease: Lease { process, .. },
            } => (outcome, process),
            Attempt::NoWorker(reason) => return Err(ExecError::Backend { reason }),
        };
        self.runner.release(process, outcome.reusable);
        self.runner.settle(&line.tag, &outcome).await;
        if outcome.missing_cwd {
            return Err(ExecError::MissingCwd { cwd });
        }
        Ok(ExecOutcome {
            status: outcome.status,
            termination: outcome.termination,
            notes: Vec::new(),
            egress: Vec::new(),
        })
    }
}

/// Run `command` in `/tmp` through `RemoteBash`: (result, output).
async fn exec(
    host: &Arc<Host>,
    command: &str,
    cancel: CancellationToken,
) -> (Result<ExecOutcome, ExecError>, String) {
    exec_in(host, command, "/tmp", cancel).await
}

/// Run `command` in `cwd` through `RemoteBash`: (result, output).
async fn exec_in(
    host: &Arc<Host>,
    command: &str,
    cwd: &str,
    cancel: CancellationToken,
) -> (Result<ExecOutcome, ExecError>, String) {
    let bash = RemoteBash(Arc::clone(host));
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
    let collector = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend(chunk);
        }
        out
    });
    let result = bash
        .exec(
            ExecRequest {
                call_id: None,
                command: command.to_owned(),
                cwd: cwd.into(),
                timeout: Duration::from_secs(120),
                env: vec![("WHO".to_owned(), "it's me".to_owned())],
            },
            cancel,
            tx,
        )
        .await;
    let output = collector.await.expect("collector");
    (result, String::from_utf8_lossy(&output).into_owned())
}

fn status(result: &Result<ExecOutcome, ExecError>) -> Option<ExitStatus> {
    match result {
        Ok(outcome) => outcome.status,
        Err(e) => panic!("the command failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reuse_one_worker_and_pass_their_environment() {
    let host = Host::new(LocalTransport::default());
    let (first, output) = exec(&host, "echo \"$WHO\"; exit 3", CancellationToken::new()).await;
    assert_eq!(status(&first), Some(ExitStatus::Code(3)));
    assert_eq!(output, "it's me\n");
    let (second, output) = exec(&host, "echo again", CancellationToken::new()).await;
    assert_eq!(status(&second), Some(ExitStatus::Code(0)));
    assert_eq!(output, "again\n");
    assert_eq!(
        host.runner.transport().started.load(Ordering::SeqCst),
        1,
        "the worker of the first command served the second"
    );
    let (missing, _) = exec_in(
        &host,
        "true",
        "/nonexistent-cordon-dir",
        CancellationToken::new(),
    )
    .await;
    assert!(
        matches!(missing, Err(ExecError::MissingCwd { .. })),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_died_while_idle_is_replaced_within_the_call() {
    let host = Host::new(LocalTransport::default());
    let (first, _) = exec(&host, "true", CancellationToken::new()).await;
    assert_eq!(status(&first), Some(ExitStatus::Code(0)));
    let pid = host.runner.transport().pids.lock().expect("pids")[0];
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Whether the pool notices the dead worker before it is leased or the request goes
    // unanswered, the command runs once on a fresh worker.
    let (second, output) = exec(&host, "echo fresh", CancellationToken::new()).await;
    assert_eq!(status(&second), Some(ExitStatus::Code(0)));
    assert_eq!(output, "fresh\n");
    assert_eq!(host.runner.transport().started.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_cancels_and_a_broken_transport_never_run_anything() {
    let broken = Host::new(LocalTransport {
        broken: true,
        ..LocalTransport::default()
    });
    let (result, _) = exec(&broken, "true", CancellationToken::new()).await;
    match result {
        Err(ExecError::Backend { reason }) => {
            assert!(reason.contains("the transport is down"), "{reason}")
        }
        other => panic!("{other:?}"),
    }

    let refusing = Arc::new(Host {
        id: BackendId::new("local-test"),
        runner: Arc::new(Runner::new(LocalTransport::default(), 2)),
        refuse: true,
    });
    let (result, _) = exec(&refusing, "true", CancellationToken::new()).await;
    assert!(
        matches!(result, Err(ExecError::Sandbox { layer: "test", .. })),
        "{result:?}"
    );

    let host = Host::new(LocalTransport::default());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let (result, output) = exec(&host, "echo never", cancel).await;
    let outcome = result.expect("a cancelled command is an outcome");
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert_eq!(outcome.status, None);
    assert_eq!(output, "");
    assert_eq!(host.runner.transport().started.load(Ordering::SeqCst), 0);
    assert_eq!(
        refusing.runner.transport().started.load(Ordering::SeqCst),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_commands_are_collected_whole() {
    let runner = Runner::new(LocalTransport::default(), 2);
    let argv = |script: &str| vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let Collected { stdout, stderr } = runner
        .collect(
            argv("cat; echo done >&2"),
            Some(b"input"),
            StdinEnd::AfterInput,
        )
        .await
        .expect("collected");
    assert_eq!(
        (stdout.as_slice(), stderr.as_slice()),
        (&b"input"[..], &b"done\n"[..])
    );
    // A script that answers first and stops at the end of its stdin only: AfterOutput keeps
    // stdin open until its output ended.
    let Collected { stdout, .. } = runner
        .collect(
            argv("head -c 3; echo; exec >&- 2>&-; cat >/dev/null"),
            Some(b"abcdef"),
            StdinEnd::AfterOutput,
        )
        .await
        .expect("collected");
    assert_eq!(stdout, b"abc\n");
}

/// File operations through the workers of the local-process transport.
struct Files {
    id: BackendId,
    runner: Arc<Runner<LocalTransport>>,
    workspace: PathBuf,
    spill_dir: PathBuf,
    roots: Vec<PathBuf>,
    rules: PathRules,
    gids: Vec<u32>,
}

impl FileHost for Files {
    type Transport = LocalTransport;

    fn runner(&self) -> &Arc<Runner<LocalTransport>> {
        &self.runner
    }

    fn backend_id(&self) -> &BackendId {
        &self.id
    }

    fn root(&self) -> &Path {
        &self.workspace
    }

    fn home(&self) -> Option<&Path> {
        None
    }

    fn spill_dir(&self) -> &Path {
        &self.spill_dir
    }

    fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn rules(&self) -> &PathRules {
        &self.rules
    }

    fn account(&self) -> (u32, &[u32]) {
        (u32::MAX, &self.gids)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations_run_on_the_workers_of_any_transport() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = std::fs::canonicalize(dir.path()).expect("canonical");
    let spill_dir = workspace.join("spill");
    std::fs::create_dir(&spill_dir).expect("spill dir");
    std::fs::create_dir(workspace.join(".git")).expect(".git");
    let rules = PathRules::new(
        &workspace,
        &SandboxSpec::default(),
        vec![Root {
            path: spill_dir.clone(),
            writable: false,
        }],
    )
    .expect("rules");
    let host = Arc::new(Files {
        id: BackendId::new("local-files-test"),
        runner: Arc::new(Runner::new(LocalTransport::default(), 2)),
        roots: rules.root_paths(),
        workspace: workspace.clone(),
        spill_dir: spill_dir.clone(),
        rules,
        gids: Vec::new(),
    });
    let files = RemoteFiles(Arc::clone(&host));
    let file = workspace.join("sub/a.txt");
    files
        .create_dir_all(&workspace.join("sub"))
        .await
        .expect("mkdir");
    files
        .write_file(&file, b"hello\nworld\n")
        .await
        .expect("write");
    assert_eq!(std::fs::read(&file).expect("on disk"), b"hello\nworld\n");
    assert_eq!(
        files.read_file(&file).await.expect("read"),
        b"hello\nworld\n"
    );
    assert_eq!(files.read_range(&file, 6, 3).await.expect("range"), b"wor");
    let meta = files.metadata(&file).await.expect("stat");
    assert_eq!(meta.size, 12);
    let entries = files.read_dir(&workspace.join("sub")).await.expect("list");
    assert_eq!(
        entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["a.txt"]
    );
    assert_eq!(
        files
            .canonicalize(&workspace.join("sub/../sub/a.txt"))
            .await
            .expect("canonical"),
        file
    );
    assert_eq!(
        host.runner.transport().started.load(Ordering::SeqCst),
        1,
        "one worker served every request"
    );
    // The rules are judged here on the canonical path before the helper writes anything.
    let protected = files
        .write_file(&workspace.join(".git/config"), b"x")
        .await
        .expect_err("protected");
    assert!(
        matches!(protected, FsError::Protected { .. }),
        "{protected:?}"
    );
    assert!(!workspace.join(".git/config").exists());
    let outside = files
        .read_file(Path::new("/etc/hostname"))
        .await
        .expect_err("outside");
    assert!(
        matches!(outside, FsError::OutsideRoot { .. }),
        "{outside:?}"
    );

    let (spill, mut writer) = files.create_spill_file().await.expect("spill");
    assert!(spill.starts_with(&spill_dir), "{}", spill.display());
    writer.write_all(b"spilled output").await.expect("write");
    writer.shutdown().await.expect("shutdown");
    assert_eq!(
        std::fs::read(&spill).expect("spill file"),
        b"spilled output"
    );
}
