//! The tunnel's channel limit: more concurrent streams than the host's `MaxSessions` wait for
//! a free channel on the one connection rather than opening new connections, and a channel the
//! server refuses on a live connection fails with an error instead of a reconnect.

use std::num::NonZeroUsize;
use std::sync::Arc;

use cordon_backend_ssh::AgentSource;
use cordon_backend_ssh::tunnel::{Tunnel, TunnelConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::support::{self, Server};

fn tunnel(server: &Server, max_channels: usize) -> Tunnel {
    Tunnel::new(TunnelConfig {
        host: format!("root@127.0.0.1:{}", server.port),
        identity: Some(server.client_key.clone()),
        known_hosts: Some(server.known_hosts.clone()),
        ssh_config: Some(server.dir.path().join("no_ssh_config")),
        agent: AgentSource::Disabled,
        max_channels: NonZeroUsize::new(max_channels),
        ..TunnelConfig::default()
    })
    .expect("tunnel")
}

/// How many connections sshd accepted (one log line per authenticated connection).
fn connections(server: &Server) -> usize {
    std::fs::read_to_string(server.dir.path().join("sshd.log"))
        .expect("sshd log")
        .lines()
        .filter(|line| line.contains("Accepted publickey"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_max_sessions_wait_on_one_connection() {
    let Some(server) = support::server_with_max_sessions(2) else {
        return;
    };
    let tunnel = Arc::new(tunnel(&server, 2));
    let (opened_tx, mut opened_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = watch::channel(false);
    let mut calls = Vec::new();
    for i in 0..6 {
        let tunnel = Arc::clone(&tunnel);
        let opened = opened_tx.clone();
        let mut release = release_rx.clone();
        calls.push(tokio::spawn(async move {
            let mut stream = tunnel.open("cat").await?;
            let _ = opened.send(i);
            release.wait_for(|go| *go).await.expect("release");
            stream
                .write_all(format!("call {i}\n").as_bytes())
                .await
                .expect("write");
            stream.shutdown().await.expect("eof");
            let mut out = String::new();
            stream.read_to_string(&mut out).await.expect("read");
            Ok::<_, cordon_backend_ssh::SshError>(out)
        }));
    }
    // Both channels the server allows are open (and held) before any call goes on.
    for _ in 0..2 {
        opened_rx.recv().await.expect("a stream opened");
    }
    release_tx.send(true).expect("release");
    for (i, call) in calls.into_iter().enumerate() {
        let out = call
            .await
            .expect("join")
            .expect("every call gets a channel");
        assert_eq!(out, format!("call {i}\n"));
    }
    assert_eq!(connections(&server), 1, "one connection for all six calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_refused_on_a_live_connection_fails_without_reconnecting() {
    let Some(server) = support::server_with_max_sessions(1) else {
        return;
    };
    // A limit above the server's: the second stream is refused by sshd.
    let tunnel = tunnel(&server, 2);
    let held = tunnel.open("cat").await.expect("the first channel");
    let error = tunnel
        .open("cat")
        .await
        .expect_err("the server allows one channel");
    let message = error.to_string();
    assert!(message.contains("MaxSessions"), "{message}");
    assert_eq!(connections(&server), 1, "no new connection: {message}");
    drop(held);
}
