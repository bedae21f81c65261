use super::*;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A connected loopback pair: the end the relay holds, and the test's end.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (theirs, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    (accepted.expect("accept").0, theirs.expect("connect"))
}

/// `len` bytes of a pattern that does not repeat every power of two, so a lost, doubled or
/// reordered piece shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_add(seed))
        .collect()
}

/// A failure deadline for a relay that stops moving; never reached when it works.
const STUCK: Duration = Duration::from_secs(60);

#[tokio::test]
async fn large_transfers_both_ways_at_once_arrive_whole_and_are_counted() {
    // Several pipes' worth each way, read by a slow reader (small reads, a yield between
    // them) on one side and a fast one on the other.
    let (client, mut client_end) = pair().await;
    let (upstream, mut upstream_end) = pair().await;
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let to_upstream = pattern(6 * CHUNK + 12_345, 1);
    let to_client = pattern(5 * CHUNK + 678, 2);
    let relaying = relay(&client, &upstream, &up, &down);
    let (mut client_in, mut client_out) = client_end.split();
    let (mut upstream_in, mut upstream_out) = upstream_end.split();
    let talking = async {
        let client_sends = async {
            client_out.write_all(&to_upstream).await.expect("send up");
            client_out.shutdown().await.expect("end up");
        };
        let upstream_sends = async {
            upstream_out.write_all(&to_client).await.expect("send down");
            upstream_out.shutdown().await.expect("end down");
        };
        let slow_client = async {
            let mut got = Vec::with_capacity(to_client.len());
            let mut piece = [0u8; 1000];
            loop {
                match client_in.read(&mut piece).await.expect("read down") {
                    0 => return got,
                    n => got.extend_from_slice(&piece[..n]),
                }
                tokio::task::yield_now().await;
            }
        };
        let fast_upstream = async {
            let mut got = Vec::with_capacity(to_upstream.len());
            upstream_in.read_to_end(&mut got).await.expect("read up");
            got
        };
        let ((), (), down_got, up_got) =
            tokio::join!(client_sends, upstream_sends, slow_client, fast_upstream);
        assert!(down_got == to_client, "the bytes down arrived changed");
        assert!(up_got == to_upstream, "the bytes up arrived changed");
    };
    let (relayed, ()) = tokio::time::timeout(STUCK, async { tokio::join!(relaying, talking) })
        .await
        .expect("the relay stopped moving");
    relayed.expect("relay");
    assert_eq!(
        (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed)),
        (to_upstream.len() as u64, to_client.len() as u64)
    );
}

/// The client's end says `first` and ends (or the upstream's, when `upstream_first`), the
/// other end reads to the end, then answers `second` and ends: a half-close passes through
/// and the open direction still works.
async fn half_close(upstream_first: bool) {
    let (client, client_end) = pair().await;
    let (upstream, upstream_end) = pair().await;
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let (first, second) = (b"the request".as_slice(), b"and its answer".as_slice());
    let (mut opener, mut answerer) = if upstream_first {
        (upstream_end, client_end)
    } else {
        (client_end, upstream_end)
    };
    let relaying = relay(&client, &upstream, &up, &down);
    let talking = async {
        opener.write_all(first).await.expect("send first");
        opener.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        answerer.read_to_end(&mut got).await.expect("read first");
        assert_eq!(got, first);
        answerer.write_all(second).await.expect("answer");
        answerer.shutdown().await.expect("end");
        let mut got = Vec::new();
        opener.read_to_end(&mut got).await.expect("read the answer");
        assert_eq!(got, second);
    };
    let (relayed, ()) = tokio::time::timeout(STUCK, async { tokio::join!(relaying, talking) })
        .await
        .expect("the relay stopped moving");
    relayed.expect("relay");
    let (first, second) = (first.len() as u64, second.len() as u64);
    let expected = if upstream_first {
        (second, first)
    } else {
        (first, second)
    };
    assert_eq!(
        (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed)),
        expected
    );
}

#[tokio::test]
async fn the_client_half_closing_first_leaves_the_way_back_open() {
    half_close(false).await;
}

#[tokio::test]
async fn the_upstream_half_closing_first_leaves_the_way_up_open() {
    half_close(true).await;
}

#[tokio::test]
async fn a_reset_destination_ends_the_relay_with_an_error_and_keeps_the_count() {
    let (client, mut client_end) = pair().await;
    let (upstream, mut upstream_end) = pair().await;
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let relaying = relay(&client, &upstream, &up, &down);
    let talking = async {
        client_end.write_all(b"hello").await.expect("send");
        let mut got = [0u8; 5];
        upstream_end.read_exact(&mut got).await.expect("receive");
        // Closing with a zero linger time resets the connection instead of ending it.
        upstream_end.set_zero_linger().expect("linger");
        drop(upstream_end);
    };
    let (relayed, ()) = tokio::time::timeout(STUCK, async { tokio::join!(relaying, talking) })
        .await
        .expect("the relay did not notice the reset");
    assert!(relayed.is_err(), "a reset is an error: {relayed:?}");
    assert!(up.load(Ordering::Relaxed) >= 5);
}
