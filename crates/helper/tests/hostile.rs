//! Helpers that misbehave, played by the test over in-memory streams: the host at the far end
//! is not trusted, so what it answers must not make the client hold more than the protocol's
//! bounds, and a restarted helper must not give the session a weaker sandbox than it reports.

use std::path::Path;
use std::time::Duration;

use cordon_core::sandbox::SandboxSpec;
use cordon_helper::frame::{Frame, read_frame, write_frame};
use cordon_helper::protocol::{
    Envelope, OUTPUT_WINDOW, PROTOCOL_VERSION, Request, Response, SessionInfo, WireError,
};
use cordon_helper::{
    Connection, Connector, HelperBackend, HelperClient, HelperError, SessionStart,
};
use cordon_ops::{
    Backend, BashOperations, ExecError, ExecOutcome, ExecRequest, ExitStatus, Termination,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn send<W: AsyncWrite + Unpin>(writer: &mut W, id: u64, body: Response, payload: Vec<u8>) {
    let header = serde_json::to_vec(&Envelope { id, body }).expect("encode");
    write_frame(writer, &Frame { header, payload })
        .await
        .expect("send");
    writer.flush().await.expect("flush");
}

/// The next request that is not an `ack` (the client's acknowledgements of output).
async fn request<R: AsyncRead + Unpin>(reader: &mut R) -> Envelope<Request> {
    loop {
        let frame = read_frame(reader).await.expect("request");
        let envelope: Envelope<Request> = serde_json::from_slice(&frame.header).expect("json");
        if !matches!(envelope.body, Request::Ack { .. }) {
            return envelope;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_acknowledged_window_ends_the_connection() {
    let (client_side, helper_side) = tokio::io::duplex(64 * 1024);
    let (all_sent, sent_all) = tokio::sync::oneshot::channel::<()>();
    let (client_read, client_write) = tokio::io::split(client_side);
    let (mut from_client, mut to_client) = tokio::io::split(helper_side);
    let fake = tokio::spawn(async move {
        let hello = request(&mut from_client).await;
        assert!(matches!(hello.body, Request::Hello { .. }), "{hello:?}");
        let version = PROTOCOL_VERSION;
        let helper = "hostile".to_owned();
        send(
            &mut to_client,
            hello.id,
            Response::Hello { version, helper },
            Vec::new(),
        )
        .await;
        let start = request(&mut from_client).await;
        let session = Box::new(SessionInfo {
            backend_id: "local:/w".to_owned(),
            root: Path::new("/w").into(),
            home: None,
            spill_dir: Path::new("/w/.spill").into(),
            missing_layers: Vec::new(),
        });
        send(
            &mut to_client,
            start.id,
            Response::Started { session },
            Vec::new(),
        )
        .await;
        let exec = request(&mut from_client).await;
        assert!(matches!(exec.body, Request::Exec { .. }), "{exec:?}");
        // The caller takes one piece (and a second waits in its channel) before it stops:
        // the client never said it had room for all this, a window and two pieces more, sent
        // without waiting for acknowledgements.
        let acks = tokio::spawn(async move { while read_frame(&mut from_client).await.is_ok() {} });
        let piece = 64 * 1024;
        let pieces = usize::try_from(OUTPUT_WINDOW).unwrap() / piece + 2;
        for _ in 0..pieces {
            let body = Response::Output;
            let sent = async {
                let header = serde_json::to_vec(&Envelope { id: exec.id, body }).expect("encode");
                let frame = Frame {
                    header,
                    payload: vec![b'x'; piece],
                };
                write_frame(&mut to_client, &frame).await
            };
            if sent.await.is_err() {
                // The client closed the stream.
                return;
            }
        }
        let outcome = ExecOutcome {
            status: Some(ExitStatus::Code(0)),
            termination: Termination::Exited,
            notes: Vec::new(),
            egress: Vec::new(),
        };
        let header = serde_json::to_vec(&Envelope {
            id: exec.id,
            body: Response::Exec { outcome },
        })
        .expect("encode");
        let last = Frame {
            header,
            payload: Vec::new(),
        };
        // A notice larger than the stream's buffer: once it is written, the client has read
        // (and taken or refused) every frame before it.
        let notice = serde_json::to_vec(&Envelope {
            id: 0,
            body: Response::Error {
                error: WireError::Protocol {
                    message: "end of the test's frames".to_owned(),
                },
            },
        })
        .expect("encode");
        let notice = Frame {
            header: notice,
            payload: vec![0; 128 * 1024],
        };
        if write_frame(&mut to_client, &last).await.is_ok()
            && write_frame(&mut to_client, &notice).await.is_ok()
        {
            let _ = to_client.flush().await;
            let _ = all_sent.send(());
        }
        // Hold the stream open until the client is done with it.
        let _ = acks.await;
    });

    let start = SessionStart::new(Path::new("/w"), SandboxSpec::default());
    let client = HelperClient::start(client_read, client_write, start)
        .await
        .expect("session");
    // The caller is slow: it takes nothing until the connection ended or the client read
    // everything the helper sent.
    let (output, mut taken) = mpsc::channel(1);
    let request = ExecRequest {
        call_id: None,
        command: "yes".to_owned(),
        cwd: "/w".into(),
        timeout: Duration::from_secs(60),
        env: Vec::new(),
    };
    let exec = client.exec(request, CancellationToken::new(), output);
    let reader = async {
        tokio::select! {
            () = client.closed() => {}
            _ = sent_all => {}
        }
        let mut bytes = 0;
        while let Some(chunk) = taken.recv().await {
            bytes += chunk.len();
        }
        bytes
    };
    let (result, _) = tokio::join!(exec, reader);
    match result {
        Err(ExecError::Backend { reason }) => assert!(
            reason.contains("the helper broke the protocol: it sent")
                && reason.contains("more than the window of"),
            "{reason}"
        ),
        other => panic!("a helper ignoring the window was trusted: {other:?}"),
    }
    assert!(client.is_dead());
    drop(client);
    fake.await.expect("fake helper");
}

/// Plays a helper on `stream`: hello, a session on `/w` without `missing` layers, then an
/// error for every request, until `die` fires (then the stream closes) or the client leaves.
async fn scripted_helper(
    stream: tokio::io::DuplexStream,
    missing: Vec<String>,
    die: Option<tokio::sync::oneshot::Receiver<()>>,
) {
    let (mut from_client, mut to_client) = tokio::io::split(stream);
    let serve = async {
        let hello = request(&mut from_client).await;
        let version = PROTOCOL_VERSION;
        let helper = "scripted".to_owned();
        send(
            &mut to_client,
            hello.id,
            Response::Hello { version, helper },
            Vec::new(),
        )
        .await;
        let start = request(&mut from_client).await;
        let session = Box::new(SessionInfo {
            backend_id: "local:/w".to_owned(),
            root: Path::new("/w").into(),
            home: None,
            spill_dir: Path::new("/w/.spill").into(),
            missing_layers: missing,
        });
        send(
            &mut to_client,
            start.id,
            Response::Started { session },
            Vec::new(),
        )
        .await;
        loop {
            let Ok(frame) = read_frame(&mut from_client).await else {
                return;
            };
            let envelope: Envelope<Request> = serde_json::from_slice(&frame.header).expect("json");
            let error = WireError::Protocol {
                message: "the scripted helper answers nothing".to_owned(),
            };
            let body = Response::Error { error };
            let header = serde_json::to_vec(&Envelope {
                id: envelope.id,
                body,
            })
            .expect("encode");
            let frame = Frame {
                header,
                payload: Vec::new(),
            };
            if write_frame(&mut to_client, &frame).await.is_err()
                || to_client.flush().await.is_err()
            {
                return;
            }
        }
    };
    match die {
        Some(die) => tokio::select! {
            () = serve => {}
            _ = die => {}
        },
        None => serve.await,
    }
}

/// Hands out scripted helpers: the first with every layer, the next ones without Landlock.
struct Scripted {
    started: std::sync::Mutex<usize>,
    die_first: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

#[async_trait::async_trait]
impl Connector for Scripted {
    async fn connect(&self) -> Result<Connection, HelperError> {
        let first = {
            let mut started = self.started.lock().unwrap();
            *started += 1;
            *started == 1
        };
        let (client_side, helper_side) = tokio::io::duplex(64 * 1024);
        let (missing, die) = if first {
            (Vec::new(), self.die_first.lock().unwrap().take())
        } else {
            (
                vec!["landlock: not available on this kernel".to_owned()],
                None,
            )
        };
        tokio::spawn(scripted_helper(helper_side, missing, die));
        let (reader, writer) = tokio::io::split(client_side);
        Ok(Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            keep: Box::new(()),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_helper_with_a_weaker_sandbox_is_refused() {
    let (kill_first, die_first) = tokio::sync::oneshot::channel();
    let connector = Scripted {
        started: std::sync::Mutex::new(0),
        die_first: std::sync::Mutex::new(Some(die_first)),
    };
    let start = SessionStart::new(Path::new("/w"), SandboxSpec::default());
    let backend = HelperBackend::start(Box::new(connector), start)
        .await
        .expect("session");
    assert!(backend.missing_layers().is_empty());
    let first = backend.ops().current().await.expect("the first helper");
    kill_first.send(()).expect("the first helper runs");
    first.closed().await;
    // The next call starts a new helper, whose sandbox lacks Landlock: the session, which
    // reports no missing layer, must not run on it.
    let error = backend
        .files()
        .read_file(Path::new("/w/file"))
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(
            "failed to restart the helper: its sandbox lacks what the session started with \
             (landlock: not available on this kernel)"
        ),
        "{text}"
    );
    assert!(backend.missing_layers().is_empty());
}
