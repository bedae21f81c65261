//! A small, incremental Server-Sent Events parser (the `text/event-stream` format of the
//! WHATWG HTML standard, §9.2).
//!
//! It owns line splitting and field handling only: bytes go in as they arrive from the
//! network, in chunks that may end anywhere (inside a line, between a CR and its LF, inside a
//! multi-byte UTF-8 character), and complete events come out. It knows nothing about HTTP or
//! about what the providers put in `data`.
//!
//! Handled: LF, CRLF and lone CR line endings; `event:`, multi-line `data:` (joined with `\n`),
//! `id:`, `retry:` (ignored) and unknown fields (ignored); comment lines starting with `:`; one
//! optional space after the colon; a UTF-8 byte-order mark at the start of the stream.
//! Invalid UTF-8 inside a line is replaced with U+FFFD rather than failing the stream.
//!
//! One deliberate leniency: at the end of the stream, [`SseParser::finish`] dispatches an event
//! whose terminating blank line never came (the standard discards it). Some local servers end
//! the body right after the last `data:` line; the caller only calls `finish` after a clean end
//! of the body, so a connection that dropped mid-event is reported as such, not half-parsed.

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, or `message` when the event had none.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen on the stream, if any.
    pub id: Option<String>,
}

/// Incremental parser state. Feed bytes with [`SseParser::feed`], then call
/// [`SseParser::finish`] once the body ended cleanly.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended with CR: a leading LF of the next chunk belongs to it.
    after_cr: bool,
    /// Whether the start of the stream (where a BOM may sit) has been passed.
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consume `chunk` and append every event it completes to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) {
        if chunk.is_empty() {
            return;
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while let Some(end) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&chunk[..end]);
            let was_cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if was_cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    // The LF of a CRLF may be the first byte of the next chunk.
                    None => self.after_cr = true,
                }
            }
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
        }
        self.line.extend_from_slice(chunk);
    }

    /// The body ended cleanly: treat an unterminated last line as complete and dispatch a
    /// pending event even without its blank line.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
        }
        self.dispatch(out);
    }

    fn process_line(&mut self, mut line: &[u8], out: &mut Vec<SseEvent>) {
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix("\u{feff}".as_bytes()) {
                line = rest;
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"event" => self.event = value.into_owned(),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"id" if !value.contains('\0') => self.last_id = Some(value.into_owned()),
            // `retry` only matters to browsers reconnecting an EventSource; unknown fields are
            // ignored by the standard.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        parser.feed(input, &mut out);
        parser.finish(&mut out);
        out
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: None,
        }
    }

    #[test]
    fn parses_events_data_and_comments() {
        let input = b": keep-alive\n\nevent: ping\ndata: {\"a\":1}\n\ndata:no-space\n\n";
        assert_eq!(
            parse_all(input),
            vec![ev("ping", "{\"a\":1}"), ev("message", "no-space")]
        );
    }

    #[test]
    fn joins_multi_line_data_and_keeps_extra_spaces() {
        let input = b"data: first\ndata:  second\ndata\n\n";
        assert_eq!(parse_all(input), vec![ev("message", "first\n second\n")]);
    }

    #[test]
    fn accepts_crlf_and_lone_cr_line_endings() {
        let input = b"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n";
        assert_eq!(
            parse_all(input),
            vec![ev("a", "1"), ev("b", "2"), ev("message", "3")]
        );
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_resets_type() {
        let input = b"event: lonely\n\ndata: x\n\n";
        assert_eq!(parse_all(input), vec![ev("message", "x")]);
    }

    #[test]
    fn strips_leading_bom_and_tracks_ids() {
        let input = "\u{feff}id: 7\ndata: x\n\ndata: y\n\n".as_bytes();
        let events = parse_all(input);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].id.as_deref(), Some("7"));
        assert_eq!(events[1].id.as_deref(), Some("7"));
        assert_eq!(events[0].event, "message");
    }

    #[test]
    fn finish_dispatches_an_unterminated_last_event() {
        assert_eq!(parse_all(b"data: [DONE]"), vec![ev("message", "[DONE]")]);
        assert_eq!(parse_all(b"data: [DONE]\n"), vec![ev("message", "[DONE]")]);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(
            parse_all(b"data: a\xffb\n\n"),
            vec![ev("message", "a\u{fffd}b")]
        );
    }

    /// Every way of cutting the stream into two or three chunks yields the same events,
    /// including cuts inside a multi-byte character and between CR and LF.
    #[test]
    fn chunk_boundaries_anywhere_give_identical_events() {
        let input =
            "event: a\r\ndata: héllo 🌍\r\n\r\n: c\r\ndata: x\rdata: y\r\r\ndata: é\n\n".as_bytes();
        let expected = parse_all(input);
        assert_eq!(
            expected,
            vec![
                ev("a", "héllo 🌍"),
                ev("message", "x\ny"),
                ev("message", "é")
            ]
        );
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let mut parser = SseParser::new();
                let mut out = Vec::new();
                parser.feed(&input[..i], &mut out);
                parser.feed(&input[i..j], &mut out);
                parser.feed(&input[j..], &mut out);
                parser.finish(&mut out);
                assert_eq!(out, expected, "split at {i} and {j}");
            }
        }
    }

    #[test]
    fn byte_by_byte_feeding_matches() {
        let input = b"event: e\ndata: 1\ndata: 2\n\n";
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for b in input {
            parser.feed(std::slice::from_ref(b), &mut out);
        }
        assert_eq!(out, vec![ev("e", "1\n2")]);
    }
}
