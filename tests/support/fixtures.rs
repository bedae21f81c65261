//! File contents and messages the suites share.

use std::fmt::Write as _;
use std::io::Cursor;

use base64::Engine as _;
use cordon_core::protocol::{AssistantContent, AssistantMessage, StopReason, ToolCall};
pub use image::ImageFormat;
use image::{Rgb, RgbImage};
use serde_json::Value;

/// A `width`×`height` image encoded as `format` (a simple gradient, so it is not blank).
pub fn image_bytes(width: u32, height: u32, format: ImageFormat) -> Vec<u8> {
    let image = RgbImage::from_fn(width, height, |x, y| {
        Rgb([(x * 40 % 256) as u8, (y * 40 % 256) as u8, 128])
    });
    let mut out = Cursor::new(Vec::new());
    image
        .write_to(&mut out, format)
        .expect("encoding a small image cannot fail");
    out.into_inner()
}

/// Base64 (standard alphabet, padded), as image blocks carry it.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decode an image block's data: format and dimensions.
pub fn decode_image(data_base64: &str) -> (ImageFormat, u32, u32) {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data_base64)
        .expect("image data is base64");
    let format = image::guess_format(&bytes).expect("image data has a known format");
    let image = image::load_from_memory(&bytes).expect("image data decodes");
    (format, image.width(), image.height())
}

/// `"{prefix}1\n{prefix}2\n…{prefix}N\n"`.
pub fn numbered_lines(prefix: &str, count: usize) -> String {
    let mut out = String::new();
    for i in 1..=count {
        writeln!(out, "{prefix}{i}").expect("writing to a String cannot fail");
    }
    out
}

/// The lines `from..=to` of [`numbered_lines`], each with its newline.
pub fn numbered_range(prefix: &str, from: usize, to: usize) -> String {
    let mut out = String::new();
    for i in from..=to {
        writeln!(out, "{prefix}{i}").expect("writing to a String cannot fail");
    }
    out
}

/// A tool call block.
pub fn tool_call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments,
    }
}

/// An assistant message asking for `calls` (stop reason `toolUse`).
pub fn assistant(calls: Vec<ToolCall>) -> AssistantMessage {
    AssistantMessage {
        content: calls.into_iter().map(AssistantContent::ToolCall).collect(),
        stop_reason: StopReason::ToolUse,
        ..AssistantMessage::default()
    }
}
