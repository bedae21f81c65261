//! A tiny scripted HTTP/1.1 server on 127.0.0.1 for tests of model clients and of
//! everything built on them (feature `testing`; the provider tests and `cordon run`'s tests
//! serve recorded SSE transcripts with it). It never listens beyond loopback.
//!
//! Each accepted connection reads one request (headers + `Content-Length` body), records it,
//! and answers with the next scripted [`Reply`]. Streams go out with chunked transfer coding,
//! one HTTP chunk per piece, flushed one by one, so the client sees the pieces' boundaries.
//! Every response says `Connection: close`, so one connection is one attempt.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};

/// What the server does with one request.
pub enum Reply {
    /// `200 text/event-stream`, the pieces as consecutive HTTP chunks, then the end.
    Stream(Vec<Vec<u8>>),
    /// `200 text/event-stream`, the pieces, then silence until the client hangs up; the
    /// sender fires when it did.
    StreamThenHold(Vec<Vec<u8>>, oneshot::Sender<()>),
    /// `200 text/event-stream`, the pieces, then the connection closes without the final
    /// chunk: the body is cut off (a dropped connection, as the client sees it).
    StreamThenClose(Vec<Vec<u8>>),
    /// A complete response with a `Content-Length` body.
    Status {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(&'static str, String)>,
        /// Content type of the body.
        content_type: &'static str,
        /// The body.
        body: String,
    },
    /// Read the request, then reset the connection (RST) without a byte of response.
    Reset,
}

impl Reply {
    /// A stream of one piece: the whole fixture.
    pub fn stream(body: &[u8]) -> Reply {
        Reply::Stream(vec![body.to_vec()])
    }

    /// A JSON error response.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::Status {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: body.to_owned(),
        }
    }

    /// A JSON error response with extra headers.
    pub fn json_with(status: u16, headers: Vec<(&'static str, String)>, body: &str) -> Reply {
        Reply::Status {
            status,
            headers,
            content_type: "application/json",
            body: body.to_owned(),
        }
    }
}

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `POST`, …
    pub method: String,
    /// The request target, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON (`Null` if it was not JSON).
    pub body: Value,
}

impl Recorded {
    /// The value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    request_seen: Notify,
}

/// The running server; stops when dropped.
pub struct TestServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Listen on an ephemeral loopback port and answer with `replies`, in order.
    pub async fn start(replies: Vec<Reply>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the test server");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            replies: Mutex::new(replies.into()),
            requests: Mutex::new(Vec::new()),
            request_seen: Notify::new(),
        });
        let state = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    // A failed write only means the client went away; the test sees that.
                    let _ = serve(socket, &state).await;
                });
            }
        });
        TestServer { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// How many requests (attempts) arrived.
    pub fn attempts(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }

    /// Wait until at least `count` requests arrived (generous timeout).
    pub async fn wait_for_requests(&self, count: usize) {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let notified = self.shared.request_seen.notified();
                if self.attempts() >= count {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("the client never sent the expected request");
    }
}

async fn serve(mut socket: TcpStream, state: &Shared) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    let Some(request) = read_request(&mut socket).await? else {
        return Ok(());
    };
    let reply = state.replies.lock().unwrap().pop_front();
    state.requests.lock().unwrap().push(request);
    state.request_seen.notify_waiters();
    let Some(reply) = reply else {
        let body = "the test server has no scripted reply left";
        let head = format!(
            "HTTP/1.1 599 Unscripted\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await?;
        return socket.write_all(body.as_bytes()).await;
    };
    match reply {
        Reply::Stream(pieces) => {
            write_stream_head(&mut socket).await?;
            for piece in pieces {
                write_chunk(&mut socket, &piece).await?;
            }
            socket.write_all(b"0\r\n\r\n").await?;
            socket.flush().await
        }
        Reply::StreamThenClose(pieces) => {
            write_stream_head(&mut socket).await?;
            for piece in pieces {
                write_chunk(&mut socket, &piece).await?;
            }
            socket.shutdown().await
        }
        Reply::StreamThenHold(pieces, hung_up) => {
            write_stream_head(&mut socket).await?;
            for piece in pieces {
                write_chunk(&mut socket, &piece).await?;
            }
            // Hold the stream open; the client's hang-up ends the read with 0 or an error.
            let mut sink = [0u8; 1024];
            loop {
                match socket.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            // The test may have stopped waiting for the hang-up.
            let _ = hung_up.send(());
            Ok(())
        }
        Reply::Status {
            status,
            headers,
            content_type,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-type: {content_type}\r\n\
                 content-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
            socket.flush().await
        }
        Reply::Reset => {
            socket.set_zero_linger()?;
            drop(socket);
            Ok(())
        }
    }
}

async fn write_stream_head(socket: &mut TcpStream) -> std::io::Result<()> {
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\
              cache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        )
        .await?;
    socket.flush().await
}

async fn write_chunk(socket: &mut TcpStream, piece: &[u8]) -> std::io::Result<()> {
    if piece.is_empty() {
        // A zero-size chunk would end the body.
        return Ok(());
    }
    socket
        .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
        .await?;
    socket.write_all(piece).await?;
    socket.write_all(b"\r\n").await?;
    socket.flush().await
}

async fn read_request(socket: &mut TcpStream) -> std::io::Result<Option<Recorded>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_owned();
    let path = request_line.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < header_end + length {
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    let body =
        serde_json::from_slice(&buffer[header_end..header_end + length]).unwrap_or(Value::Null);
    Ok(Some(Recorded {
        method,
        path,
        headers,
        body,
    }))
}
