//! The framing of the helper protocol (docs/helper.md#frames): one frame is an 8-byte prefix
//! (header length, payload length; both `u32` big-endian), a JSON header and a raw binary
//! payload. File contents and command output travel in the payload, never as JSON.
//!
//! Both lengths are checked against [`MAX_HEADER_BYTES`] and [`MAX_PAYLOAD_BYTES`] before
//! anything is allocated; a frame over a bound is an error of the whole stream (after it the
//! two sides no longer agree where a frame starts), which ends the connection.
//!
//! This module owns the byte layout only; what a header says is [`crate::protocol`]'s.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest JSON header accepted or sent (a grep result rides in one).
pub const MAX_HEADER_BYTES: usize = 32 * 1024 * 1024;

/// Largest payload accepted or sent (one whole file for `read_file`/`write_file`).
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024 * 1024;

/// One frame: a JSON header and its raw payload (often empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The JSON header (an [`Envelope`](crate::protocol::Envelope)).
    pub header: Vec<u8>,
    /// Raw bytes: file contents, write data, a chunk of command output.
    pub payload: Vec<u8>,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly before a new frame began.
    #[error("failed to read a frame: the stream ended")]
    Eof,
    /// The stream ended inside a frame.
    #[error("failed to read a frame: the stream ended inside one ({what})")]
    Truncated {
        /// Which part was cut short.
        what: &'static str,
    },
    /// A length over its bound.
    #[error("failed to {op} a frame: its {what} is {len} bytes, more than the limit of {max}")]
    TooLarge {
        /// "read" or "write".
        op: &'static str,
        /// "header" or "payload".
        what: &'static str,
        /// The length.
        len: u64,
        /// The bound.
        max: usize,
    },
    /// A frame without a header.
    #[error("failed to read a frame: its header is empty")]
    EmptyHeader,
    /// The stream failed.
    #[error("failed to {op} a frame: {source}")]
    Io {
        /// "read" or "write".
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Check both lengths against their bounds.
fn check(op: &'static str, header: u64, payload: u64) -> Result<(), FrameError> {
    if header > MAX_HEADER_BYTES as u64 {
        return Err(FrameError::TooLarge {
            op,
            what: "header",
            len: header,
            max: MAX_HEADER_BYTES,
        });
    }
    if payload > MAX_PAYLOAD_BYTES as u64 {
        return Err(FrameError::TooLarge {
            op,
            what: "payload",
            len: payload,
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Read one frame. A clean end of the stream before the first byte is [`FrameError::Eof`].
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame, FrameError> {
    let mut prefix = [0u8; 8];
    let mut filled = 0;
    while filled < prefix.len() {
        let read = reader
            .read(&mut prefix[filled..])
            .await
            .map_err(|source| FrameError::Io { op: "read", source })?;
        if read == 0 {
            return Err(if filled == 0 {
                FrameError::Eof
            } else {
                FrameError::Truncated { what: "prefix" }
            });
        }
        filled += read;
    }
    let [h0, h1, h2, h3, p0, p1, p2, p3] = prefix;
    let header_len = u32::from_be_bytes([h0, h1, h2, h3]);
    let payload_len = u32::from_be_bytes([p0, p1, p2, p3]);
    check("read", u64::from(header_len), u64::from(payload_len))?;
    if header_len == 0 {
        return Err(FrameError::EmptyHeader);
    }
    let header = read_part(reader, header_len as usize, "header").await?;
    let payload = read_part(reader, payload_len as usize, "payload").await?;
    Ok(Frame { header, payload })
}

async fn read_part<R: AsyncRead + Unpin>(
    reader: &mut R,
    len: usize,
    what: &'static str,
) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; len];
    match reader.read_exact(&mut buf).await {
        Ok(_) => Ok(buf),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(FrameError::Truncated { what })
        }
        Err(source) => Err(FrameError::Io { op: "read", source }),
    }
}

/// Write one frame (not flushed: the caller flushes when no other frame is waiting).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
) -> Result<(), FrameError> {
    check(
        "write",
        frame.header.len() as u64,
        frame.payload.len() as u64,
    )?;
    let io = |source| FrameError::Io {
        op: "write",
        source,
    };
    // Both lengths fit in u32: checked above against bounds below u32::MAX.
    let header_len = u32::try_from(frame.header.len()).unwrap_or(u32::MAX);
    let payload_len = u32::try_from(frame.payload.len()).unwrap_or(u32::MAX);
    let mut prefix = [0u8; 8];
    prefix[..4].copy_from_slice(&header_len.to_be_bytes());
    prefix[4..].copy_from_slice(&payload_len.to_be_bytes());
    writer.write_all(&prefix).await.map_err(io)?;
    writer.write_all(&frame.header).await.map_err(io)?;
    writer.write_all(&frame.payload).await.map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(header: u32, payload: u32) -> Vec<u8> {
        let mut bytes = header.to_be_bytes().to_vec();
        bytes.extend_from_slice(&payload.to_be_bytes());
        bytes
    }

    #[tokio::test]
    async fn round_trip_keeps_header_and_binary_payload() {
        let frame = Frame {
            header: br#"{"id":1}"#.to_vec(),
            payload: (0..=255u8).collect(),
        };
        let mut wire = Vec::new();
        write_frame(&mut wire, &frame).await.expect("write");
        assert_eq!(wire.len(), 8 + 8 + 256);
        let read = read_frame(&mut wire.as_slice()).await.expect("read");
        assert_eq!(read, frame);
    }

    #[tokio::test]
    async fn oversized_header_is_refused_before_allocating() {
        let wire = prefix(u32::MAX, 0);
        let error = read_frame(&mut wire.as_slice())
            .await
            .expect_err("too large");
        assert_eq!(
            error.to_string(),
            format!(
                "failed to read a frame: its header is {} bytes, more than the limit of {MAX_HEADER_BYTES}",
                u32::MAX
            )
        );
    }

    #[tokio::test]
    async fn oversized_payload_is_refused() {
        let wire = prefix(2, MAX_PAYLOAD_BYTES as u32 + 1);
        let error = read_frame(&mut wire.as_slice())
            .await
            .expect_err("too large");
        assert!(
            matches!(
                error,
                FrameError::TooLarge {
                    what: "payload",
                    ..
                }
            ),
            "{error}"
        );
        let big = Frame {
            header: b"{}".to_vec(),
            payload: vec![0; MAX_PAYLOAD_BYTES + 1],
        };
        let mut sink = Vec::new();
        let error = write_frame(&mut sink, &big).await.expect_err("too large");
        assert!(matches!(error, FrameError::TooLarge { op: "write", .. }));
        assert!(sink.is_empty(), "nothing of an oversized frame is written");
    }

    #[tokio::test]
    async fn clean_end_truncation_and_empty_header_are_told_apart() {
        let empty: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut &*empty).await,
            Err(FrameError::Eof)
        ));
        let cut = &prefix(4, 0)[..5];
        assert!(matches!(
            read_frame(&mut &*cut).await,
            Err(FrameError::Truncated { what: "prefix" })
        ));
        let mut short_header = prefix(4, 0);
        short_header.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame(&mut short_header.as_slice()).await,
            Err(FrameError::Truncated { what: "header" })
        ));
        let mut short_payload = prefix(2, 3);
        short_payload.extend_from_slice(b"{}x");
        assert!(matches!(
            read_frame(&mut short_payload.as_slice()).await,
            Err(FrameError::Truncated { what: "payload" })
        ));
        let zero = prefix(0, 0);
        assert!(matches!(
            read_frame(&mut zero.as_slice()).await,
            Err(FrameError::EmptyHeader)
        ));
    }
}
