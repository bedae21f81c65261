//! Newline-delimited framing of the incoming byte stream (MCP stdio transport): splitting it
//! into one JSON-RPC message per line without ever buffering more than the size limit, and
//! the readers that feed the framer from stdin or from any async reader.
//!
//! It owns no JSON: parsing and the error replies live in `transport`. Stdin is read on a
//! plain thread rather than tokio's blocking pool, because a pending blocking read cannot be
//! cancelled and would keep the runtime from shutting down after a signal.

use std::io::Read;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// Default cap on one incoming message (one line), in bytes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Frames buffered between the reader and the transport (backpressure for a fast writer).
const FRAME_CHANNEL_CAPACITY: usize = 2;

/// Read size of the input readers.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// One unit of input, in arrival order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A complete line without its terminating newline (a final unterminated line at end of
    /// input counts too).
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes were dropped as they arrived.
    Oversized {
        /// The line's length in bytes (without the newline).
        bytes: usize,
    },
    /// The input could not be read.
    ReadFailed(String),
}

/// Splits a byte stream into lines of at most `max` bytes.
#[derive(Debug)]
pub(crate) struct LineFramer {
    max: usize,
    line: Vec<u8>,
    /// Bytes of the current line dropped so far, once it went over the limit.
    discarded: Option<usize>,
}

impl LineFramer {
    pub(crate) fn new(max: usize) -> Self {
        LineFramer {
            max,
            line: Vec::new(),
            discarded: None,
        }
    }

    /// Feed the next chunk; complete frames are appended to `out`.
    pub(crate) fn push(&mut self, mut chunk: &[u8], out: &mut Vec<Frame>) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|byte| *byte == b'\n');
            let (part, rest) = match newline {
                Some(at) => (&chunk[..at], &chunk[at + 1..]),
                None => (chunk, &chunk[chunk.len()..]),
            };
            self.append(part);
            if newline.is_some() {
                out.push(self.take_frame());
            }
            chunk = rest;
        }
    }

    /// End of input: a pending unterminated line becomes a frame.
    pub(crate) fn finish(&mut self, out: &mut Vec<Frame>) {
        if !self.line.is_empty() || self.discarded.is_some() {
            out.push(self.take_frame());
        }
    }

    fn append(&mut self, part: &[u8]) {
        match &mut self.discarded {
            Some(dropped) => *dropped += part.len(),
            None if self.line.len() + part.len() > self.max => {
                self.discarded = Some(self.line.len() + part.len());
                self.line = Vec::new();
            }
            None => self.line.extend_from_slice(part),
        }
    }

    fn take_frame(&mut self) -> Frame {
        match self.discarded.take() {
            Some(bytes) => Frame::Oversized { bytes },
            None => Frame::Line(std::mem::take(&mut self.line)),
        }
    }
}

/// Frames from this process's standard input, read on a dedicated thread. The channel closes
/// at end of input.
pub(crate) fn stdin_frames(max: usize) -> mpsc::Receiver<Frame> {
    let (sender, receiver) = mpsc::channel(FRAME_CHANNEL_CAPACITY);
    let spawned = std::thread::Builder::new()
        .name("cordon-mcp-stdin".to_owned())
        .spawn(move || read_blocking(std::io::stdin().lock(), max, &sender));
    if let Err(error) = spawned {
        // Without a reader there is no input: the server sees a read failure, then EOF.
        let (sender, receiver) = mpsc::channel(1);
        // A fresh channel with room for one frame: this send cannot fail.
        let _ = sender.try_send(Frame::ReadFailed(format!(
            "failed to start the stdin reader thread: {error}"
        )));
        return receiver;
    }
    receiver
}

fn read_blocking(mut input: impl Read, max: usize, sender: &mpsc::Sender<Frame>) {
    let mut framer = LineFramer::new(max);
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let mut frames = Vec::new();
    loop {
        let read = match input.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                // The server stopped reading frames: it is shutting down and needs no error.
                let _ = sender.blocking_send(Frame::ReadFailed(error.to_string()));
                return;
            }
        };
        framer.push(&buffer[..read], &mut frames);
        for frame in frames.drain(..) {
            if sender.blocking_send(frame).is_err() {
                return;
            }
        }
    }
    framer.finish(&mut frames);
    for frame in frames {
        if sender.blocking_send(frame).is_err() {
            return;
        }
    }
}

/// Frames from an async reader (tests, in-process clients), read on a task. The channel
/// closes at end of input.
pub(crate) fn async_frames<R>(mut input: R, max: usize) -> mpsc::Receiver<Frame>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(FRAME_CHANNEL_CAPACITY);
    tokio::spawn(async move {
        let mut framer = LineFramer::new(max);
        let mut buffer = vec![0u8; READ_CHUNK_BYTES];
        let mut frames = Vec::new();
        loop {
            let read = match input.read(&mut buffer).await {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) => {
                    // The server stopped reading frames: it is shutting down and needs no error.
                    let _ = sender.send(Frame::ReadFailed(error.to_string())).await;
                    return;
                }
            };
            framer.push(&buffer[..read], &mut frames);
            for frame in frames.drain(..) {
                if sender.send(frame).await.is_err() {
                    return;
                }
            }
        }
        framer.finish(&mut frames);
        for frame in frames {
            if sender.send(frame).await.is_err() {
                return;
            }
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(max: usize, chunks: &[&[u8]]) -> Vec<Frame> {
        let mut framer = LineFramer::new(max);
        let mut out = Vec::new();
        for chunk in chunks {
            framer.push(chunk, &mut out);
        }
        framer.finish(&mut out);
        out
    }

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    #[test]
    fn splits_lines_across_chunk_boundaries() {
        assert_eq!(
            frames(
                100,
                &[b"{\"a\"", b":1}\n{\"b\":2}\n", b"\n{\"c\"", b":3}\n"]
            ),
            vec![
                line("{\"a\":1}"),
                line("{\"b\":2}"),
                line(""),
                line("{\"c\":3}")
            ]
        );
    }

    #[test]
    fn final_unterminated_line_is_a_frame() {
        assert_eq!(frames(100, &[b"one\ntwo"]), vec![line("one"), line("two")]);
        assert_eq!(frames(100, &[b"one\n"]), vec![line("one")]);
    }

    #[test]
    fn a_line_at_the_limit_passes_and_one_byte_more_is_dropped() {
        assert_eq!(frames(4, &[b"abcd\n"]), vec![line("abcd")]);
        assert_eq!(
            frames(4, &[b"ab", b"cde", b"fg\nok\n"]),
            vec![Frame::Oversized { bytes: 7 }, line("ok")]
        );
    }

    #[test]
    fn oversized_line_at_end_of_input_is_reported() {
        assert_eq!(
            frames(2, &[b"ok\n", b"toolong"]),
            vec![line("ok"), Frame::Oversized { bytes: 7 }]
        );
    }

    #[test]
    fn oversized_line_is_never_buffered() {
        let mut framer = LineFramer::new(8);
        let mut out = Vec::new();
        for _ in 0..1000 {
            framer.push(&[b'x'; 1024], &mut out);
            assert!(framer.line.capacity() <= 8, "buffer grew past the limit");
        }
        framer.push(b"\n", &mut out);
        assert_eq!(out, vec![Frame::Oversized { bytes: 1024 * 1000 }]);
    }

    /// What the framer must produce for `bytes`: one frame per `\n`-terminated line and one
    /// for a final unterminated line, lines over `max` reported by size.
    fn reference(max: usize, bytes: &[u8]) -> Vec<Frame> {
        let mut parts: Vec<&[u8]> = bytes.split(|byte| *byte == b'\n').collect();
        if bytes.is_empty() || bytes.ends_with(b"\n") {
            parts.pop();
        }
        parts
            .into_iter()
            .map(|part| {
                if part.len() > max {
                    Frame::Oversized { bytes: part.len() }
                } else {
                    Frame::Line(part.to_vec())
                }
            })
            .collect()
    }

    /// `bytes` cut at the given points (any order, duplicates allowed).
    fn chunks(bytes: &[u8], cuts: &[proptest::sample::Index]) -> Vec<Vec<u8>> {
        let mut at: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut out = Vec::new();
        let mut start = 0;
        for cut in at.into_iter().chain([bytes.len()]) {
            out.push(bytes[start..cut].to_vec());
            start = cut;
        }
        out
    }

    fn config() -> proptest::test_runner::Config {
        let cases = std::env::var("CORDON_PROPTEST_CASES")
            .map(|text| {
                text.parse()
                    .expect("CORDON_PROPTEST_CASES must be a number")
            })
            .unwrap_or(512);
        let rng_seed = match std::env::var("CORDON_PROPTEST_SEED").as_deref() {
            Ok("random") => proptest::test_runner::RngSeed::Random,
            Ok(text) => proptest::test_runner::RngSeed::Fixed(
                text.parse()
                    .expect("CORDON_PROPTEST_SEED must be a number or \"random\""),
            ),
            Err(_) => proptest::test_runner::RngSeed::Fixed(0xC0_4D_0A),
        };
        proptest::test_runner::Config {
            cases,
            rng_seed,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        }
    }

    /// Random bytes with many line breaks and runs long enough to go over a small limit.
    fn stream() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        prop::collection::vec(
            prop_oneof![
                3 => any::<u8>().prop_map(|byte| vec![byte]),
                1 => Just(b"\n".to_vec()),
                1 => (any::<u8>(), 1usize..40).prop_map(|(byte, n)| vec![byte; n]),
            ],
            0..64,
        )
        .prop_map(|pieces| pieces.concat())
    }

    #[test]
    fn any_split_of_any_stream_frames_like_the_whole_stream() {
        use proptest::prelude::*;
        let strategy = (
            stream(),
            prop::collection::vec(any::<proptest::sample::Index>(), 0..8),
            1usize..24,
        );
        proptest::test_runner::TestRunner::new(config())
            .run(&strategy, |(bytes, cuts, max)| {
                let pieces = chunks(&bytes, &cuts);
                let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
                prop_assert_eq!(frames(max, &pieces), reference(max, &bytes));
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn valid_frames_after_garbage_arrive_intact() {
        use proptest::prelude::*;
        let valid = prop::collection::vec(
            (0u32..1000)
                .prop_map(|id| format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}")),
            1..4,
        );
        let strategy = (
            stream(),
            valid,
            prop::collection::vec(any::<proptest::sample::Index>(), 0..8),
        );
        proptest::test_runner::TestRunner::new(config())
            .run(&strategy, |(garbage, valid, cuts)| {
                // Whatever came before, a line break ends it; the frames after it are whole.
                let mut bytes = garbage;
                bytes.push(b'\n');
                for line in &valid {
                    bytes.extend_from_slice(line.as_bytes());
                    bytes.push(b'\n');
                }
                let pieces = chunks(&bytes, &cuts);
                let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
                let out = frames(64, &pieces);
                let tail: Vec<Frame> = valid.iter().map(|line| self::line(line)).collect();
                prop_assert!(out.len() >= tail.len());
                prop_assert_eq!(&out[out.len() - tail.len()..], tail.as_slice());
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn blocking_reader_delivers_frames_then_closes() {
        let (sender, mut receiver) = mpsc::channel(16);
        read_blocking(&b"a\nb\n"[..], 10, &sender);
        drop(sender);
        assert_eq!(receiver.try_recv().unwrap(), line("a"));
        assert_eq!(receiver.try_recv().unwrap(), line("b"));
        assert!(receiver.try_recv().is_err());
    }
}
