//! Images for the `read` tool (docs/semantics.md#read): detection by magic bytes, BMP to PNG
//! conversion, resizing to what a model accepts inline, and the bounds on decoding.
//!
//! The file extension is never consulted. An image already within the limits is returned
//! byte for byte; otherwise it is scaled to fit [`MAX_DIMENSION`] and re-encoded, trying PNG
//! and then JPEG at falling qualities, shrinking by a quarter until the base64 payload is under
//! [`MAX_BASE64_BYTES`].
//!
//! A small file can describe a huge image, so decoding is bounded three ways: [`plan_image`]
//! reads only the header and refuses images over [`MAX_DECODE_PIXELS`], [`MAX_DECODE_SIDE`]
//! or [`MAX_DECODED_BYTES`] before any pixel is decoded; [`DecodeJob::run`] decodes under an
//! allocation limit derived from that header, so a header that lies (or a decoder that needs
//! more) stops at the limit instead of allocating; and every decode of the process holds a
//! share of one memory budget while it runs ([`crate::decode_gate`]). Everything here is
//! CPU-bound and synchronous; callers run it on a blocking thread. This module does not own
//! reading the file (that is `read`, which also bounds the file's size).

use std::borrow::Cow;
use std::io::Cursor;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageDecoder as _, ImageError, ImageFormat, ImageReader, Limits};

/// Largest width and height sent inline.
pub const MAX_DIMENSION: u32 = 2000;
/// Largest base64 payload sent inline (4.5 MiB, measured on the base64 text).
pub const MAX_BASE64_BYTES: usize = 4_718_592;
/// How many leading bytes [`detect_image_mime`] looks at.
pub const SNIFF_BYTES: usize = 4100;
/// JPEG qualities tried after PNG, in order.
const JPEG_QUALITIES: [u8; 5] = [80, 85, 70, 55, 40];

/// The image formats `read` recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageMime {
    /// `image/png` (not animated).
    Png,
    /// `image/jpeg` (not JPEG-LS).
    Jpeg,
    /// `image/gif`.
    Gif,
    /// `image/webp`.
    Webp,
    /// `image/bmp`, converted to PNG before it is sent.
    Bmp,
}

impl ImageMime {
    /// The MIME type.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageMime::Png => "image/png",
            ImageMime::Jpeg => "image/jpeg",
            ImageMime::Gif => "image/gif",
            ImageMime::Webp => "image/webp",
            ImageMime::Bmp => "image/bmp",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            ImageMime::Png => ImageFormat::Png,
            ImageMime::Jpeg => ImageFormat::Jpeg,
            ImageMime::Gif => ImageFormat::Gif,
            ImageMime::Webp => ImageFormat::WebP,
            ImageMime::Bmp => ImageFormat::Bmp,
        }
    }
}

/// The image type of a file from its first bytes (at least [`SNIFF_BYTES`] where the file
/// has them), or `None` for anything that is not a supported image.
pub fn detect_image_mime(head: &[u8]) -> Option<ImageMime> {
    if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        // 0xF7 after the SOI marker is JPEG-LS, which models do not accept.
        return (head.get(3) != Some(&0xF7)).then_some(ImageMime::Jpeg);
    }
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        return is_still_png(head).then_some(ImageMime::Png);
    }
    if head.starts_with(b"GIF") {
        return Some(ImageMime::Gif);
    }
    if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        return Some(ImageMime::Webp);
    }
    if head.starts_with(b"BM") && is_valid_bmp_header(head) {
        return Some(ImageMime::Bmp);
    }
    None
}

/// A PNG whose first chunk is a 13-byte IHDR and that has no `acTL` (animation) chunk before
/// its first `IDAT`, as far as `head` reaches.
fn is_still_png(head: &[u8]) -> bool {
    let chunk = |at: usize| -> Option<(u32, &[u8])> {
        let length = u32::from_be_bytes(head.get(at..at + 4)?.try_into().ok()?);
        Some((length, head.get(at + 4..at + 8)?))
    };
    if chunk(8) != Some((13, b"IHDR".as_slice())) {
        return false;
    }
    let mut at = 8usize;
    while let Some((length, kind)) = chunk(at) {
        match kind {
            b"acTL" => return false,
            b"IDAT" => return true,
            _ => {}
        }
        // length + type + data + CRC
        at = match at.checked_add(12 + length as usize) {
            Some(next) => next,
            None => return true,
        };
    }
    true
}

/// `BM` followed by a plausible DIB header: size 12 (OS/2) or 40..=124, one plane, and a
/// standard bit depth.
fn is_valid_bmp_header(head: &[u8]) -> bool {
    let u16_at = |at: usize| {
        head.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let Some(dib_size) = head
        .get(14..18)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return false;
    };
    let (planes, bpp) = match dib_size {
        12 => (u16_at(22), u16_at(24)),
        40..=124 => (u16_at(26), u16_at(28)),
        _ => return false,
    };
    planes == Some(1) && matches!(bpp, Some(1 | 4 | 8 | 16 | 24 | 32))
}

/// An image ready to send inline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlineImage {
    /// Base64 of the image bytes.
    pub data_base64: String,
    /// Type of the bytes sent.
    pub mime: ImageMime,
    /// Notes for the model (`[Image converted …]`, `[Image: original …]`), in order.
    pub hints: Vec<String>,
}

/// Why an image could not be sent inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageOmitted {
    /// It could not be decoded or converted.
    Unconvertible,
    /// Even a 1×1 rendering did not fit the size limit.
    TooLarge,
    /// Its header describes an image over a decode bound; nothing was decoded.
    OverDecodeBound {
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// The bound it is over.
        bound: DecodeBound,
    },
    /// Decoding needed more memory than its header allows (a malformed or lying file); the
    /// decoder stopped at the limit.
    DecodeMemory {
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// The allocation limit the decode ran under, in bytes.
        max_alloc: u64,
    },
}

/// The decode bound an image's header is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeBound {
    /// More pixels than this.
    Pixels(u64),
    /// A side longer than this many pixels.
    Side(u32),
    /// More decoded bytes than `max`; the image needs `decoded`.
    Bytes {
        /// Bytes the decoded image would take.
        decoded: u64,
        /// The bound.
        max: u64,
    },
}

/// What the model is told to do about an image too big to decode.
const SMALLER_COPY: &str = "Make a smaller copy with an image tool first (for example \
ImageMagick: convert FILE -resize 4000x4000 small.png) and read that.";

impl ImageOmitted {
    /// The note for the model.
    pub fn note(self) -> String {
        match self {
            ImageOmitted::Unconvertible => {
                "[Image omitted: could not be converted to a supported inline image format.]"
                    .to_owned()
            }
            ImageOmitted::TooLarge => {
                "[Image omitted: could not be resized below the inline image size limit.]"
                    .to_owned()
            }
            ImageOmitted::OverDecodeBound {
                width,
                height,
                bound,
            } => {
                let over = match bound {
                    DecodeBound::Pixels(max) => format!(
                        "it is {width}x{height}, {} pixels; read decodes at most {max} pixels \
                         per image",
                        u64::from(width) * u64::from(height)
                    ),
                    DecodeBound::Side(max) => format!(
                        "it is {width}x{height}; read decodes at most {max} pixels per side"
                    ),
                    DecodeBound::Bytes { decoded, max } => format!(
                        "it is {width}x{height} and decodes to {decoded} bytes; read decodes \
                         at most {max} bytes per image"
                    ),
                };
                format!("[Image omitted: {over}. {SMALLER_COPY}]")
            }
            ImageOmitted::DecodeMemory {
                width,
                height,
                max_alloc,
            } => format!(
                "[Image omitted: decoding it needed more than {max_alloc} bytes, more than its \
                 {width}x{height} header allows; the file is malformed. {SMALLER_COPY}]"
            ),
        }
    }
}

/// Most pixels `read` decodes in one image: 64 Mi (8192×8192). Camera photos (12 to 50
/// megapixels), 5K and 8K screenshots fit; decoded as 8-bit RGBA that is 256 MiB.
pub const MAX_DECODE_PIXELS: u64 = 1 << 26;
/// Longest side `read` decodes, in pixels (the largest JPEG or GIF can have; tall page
/// screenshots fit).
pub const MAX_DECODE_SIDE: u32 = 65_535;
/// Most bytes one decoded image may take: [`MAX_DECODE_PIXELS`] of 8-bit RGBA (16-bit images
/// get half the pixels).
pub const MAX_DECODED_BYTES: u64 = 256 << 20;
/// What a decoder may allocate beyond the decoded image and a second image's worth: row
/// buffers, colour profiles, text chunks, a GIF frame of the image's own size.
const DECODER_SLACK_BYTES: u64 = 16 << 20;

/// The limits an inline image must respect, and the bounds on decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Largest width and height sent.
    pub max_dimension: u32,
    /// Base64 payloads must be strictly smaller.
    pub max_base64_bytes: usize,
    /// Most pixels decoded.
    pub max_decode_pixels: u64,
    /// Longest side decoded.
    pub max_decode_side: u32,
    /// Most bytes a decoded image may take.
    pub max_decoded_bytes: u64,
    /// What a decoder may allocate beyond twice the decoded image.
    pub decoder_slack_bytes: u64,
}

impl Bounds {
    pub(crate) const DEFAULT: Bounds = Bounds {
        max_dimension: MAX_DIMENSION,
        max_base64_bytes: MAX_BASE64_BYTES,
        max_decode_pixels: MAX_DECODE_PIXELS,
        max_decode_side: MAX_DECODE_SIDE,
        max_decoded_bytes: MAX_DECODED_BYTES,
        decoder_slack_bytes: DECODER_SLACK_BYTES,
    };

    fn fits(self, encoded: &[u8]) -> bool {
        base64_len(encoded.len()) < self.max_base64_bytes
    }

    /// `Some(bound)` when the header describes an image over a decode bound.
    fn exceeded_by(self, header: Header) -> Option<DecodeBound> {
        let Header {
            width,
            height,
            decoded_bytes,
        } = header;
        if width.max(height) > self.max_decode_side {
            Some(DecodeBound::Side(self.max_decode_side))
        } else if u64::from(width) * u64::from(height) > self.max_decode_pixels {
            Some(DecodeBound::Pixels(self.max_decode_pixels))
        } else if decoded_bytes > self.max_decoded_bytes {
            Some(DecodeBound::Bytes {
                decoded: decoded_bytes,
                max: self.max_decoded_bytes,
            })
        } else {
            None
        }
    }
}

/// What an image's header says, read without decoding any pixel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    width: u32,
    height: u32,
    /// Bytes of the decoded image in the decoder's colour type.
    decoded_bytes: u64,
}

impl Header {
    fn read(bytes: &[u8], mime: ImageMime, bounds: Bounds) -> Result<Header, ImageOmitted> {
        let mut reader = ImageReader::with_format(Cursor::new(bytes), mime.format());
        // No dimension limit here: the bounds are checked by the caller, so the note can say
        // which one was hit. The allocation limit covers what the header parse itself
        // allocates (a PNG's colour profile and text before its pixels).
        reader.limits(decode_limits(None, bounds.decoder_slack_bytes));
        let decoder = reader
            .into_decoder()
            .map_err(|_| ImageOmitted::Unconvertible)?;
        let (width, height) = decoder.dimensions();
        Ok(Header {
            width,
            height,
            decoded_bytes: decoder.total_bytes(),
        })
    }
}

fn decode_limits(max_side: Option<u32>, max_alloc: u64) -> Limits {
    let mut limits = Limits::no_limits();
    limits.max_image_width = max_side;
    limits.max_image_height = max_side;
    limits.max_alloc = Some(max_alloc);
    limits
}

/// What `read` does with an image file's bytes, decided from its header alone.
#[derive(Debug)]
pub enum ImagePlan {
    /// Nothing to decode: the result is ready.
    Ready(Result<InlineImage, ImageOmitted>),
    /// The image must be decoded: run the job on a blocking thread, holding a permit of the
    /// decode gate for [`DecodeJob::cost_bytes`].
    Decode(DecodeJob),
}

/// Decide from the header what to do with an image file's bytes: BMP is always converted to
/// PNG; with `auto_resize`, images over [`MAX_DIMENSION`] or [`MAX_BASE64_BYTES`] are scaled
/// and re-encoded, and images within the limits are returned untouched. Images over a decode
/// bound are omitted here, with a note naming the bound.
pub fn plan_image(bytes: Vec<u8>, mime: ImageMime, auto_resize: bool) -> ImagePlan {
    plan_image_within(bytes, mime, auto_resize, Bounds::DEFAULT)
}

/// [`plan_image`] with explicit limits.
pub(crate) fn plan_image_within(
    bytes: Vec<u8>,
    mime: ImageMime,
    auto_resize: bool,
    bounds: Bounds,
) -> ImagePlan {
    let convert = match mime {
        ImageMime::Bmp => true,
        ImageMime::Png | ImageMime::Jpeg | ImageMime::Gif | ImageMime::Webp => false,
    };
    if !convert && !auto_resize {
        return ImagePlan::Ready(Ok(untouched(&bytes, mime, Vec::new())));
    }
    let header = match Header::read(&bytes, mime, bounds) {
        Ok(header) => header,
        Err(omitted) => return ImagePlan::Ready(Err(omitted)),
    };
    if !convert
        && header.width <= bounds.max_dimension
        && header.height <= bounds.max_dimension
        && bounds.fits(&bytes)
    {
        return ImagePlan::Ready(Ok(untouched(&bytes, mime, Vec::new())));
    }
    if let Some(bound) = bounds.exceeded_by(header) {
        tracing::info!(
            mime = mime.as_str(),
            width = header.width,
            height = header.height,
            decoded_bytes = header.decoded_bytes,
            ?bound,
            "image not decoded: its header is over a decode bound"
        );
        return ImagePlan::Ready(Err(ImageOmitted::OverDecodeBound {
            width: header.width,
            height: header.height,
            bound,
        }));
    }
    ImagePlan::Decode(DecodeJob {
        bytes,
        mime,
        header,
        auto_resize,
        bounds,
    })
}

/// An image within the decode bounds that must be decoded (to convert or to resize it).
#[derive(Debug)]
pub struct DecodeJob {
    bytes: Vec<u8>,
    mime: ImageMime,
    header: Header,
    auto_resize: bool,
    bounds: Bounds,
}

impl DecodeJob {
    /// An upper estimate of the memory this job holds at its peak, in bytes: the decoded
    /// image plus the larger of what its decoder may allocate besides and what resizing and
    /// re-encoding it take.
    pub fn cost_bytes(&self) -> u64 {
        let decoded = self.header.decoded_bytes;
        let decoder = decoded.saturating_add(self.bounds.decoder_slack_bytes);
        decoded.saturating_add(decoder.max(self.work_bytes()))
    }

    /// The allocation limit of the decode: the image itself, as much again and the slack.
    fn max_alloc(&self) -> u64 {
        self.header
            .decoded_bytes
            .saturating_mul(2)
            .saturating_add(self.bounds.decoder_slack_bytes)
    }

    /// Memory beside the decoded image for converting, scaling and encoding it.
    fn work_bytes(&self) -> u64 {
        let Header {
            width,
            height,
            decoded_bytes,
        } = self.header;
        let pixels = (u64::from(width) * u64::from(height)).max(1);
        let per_pixel = decoded_bytes.div_ceil(pixels);
        // A BMP's PNG copy is at most about its decoded size.
        let converted = match self.mime {
            ImageMime::Bmp => decoded_bytes,
            ImageMime::Png | ImageMime::Jpeg | ImageMime::Gif | ImageMime::Webp => 0,
        };
        let (out_width, out_height) = fit_within(width, height, self.bounds.max_dimension);
        let out_pixels = u64::from(out_width) * u64::from(out_height);
        // Lanczos keeps an f32 RGBA copy of the source's width at the target's height.
        let resample = if uses_box_filter((width, height), (out_width, out_height)) {
            0
        } else {
            u64::from(width) * u64::from(out_height) * 16
        };
        // The scaled image, its RGB copy for JPEG, and an encoded payload.
        let output = out_pixels * (per_pixel + 3 + 4);
        converted + resample + output
    }

    /// Decode, convert and resize the image. Run it on a blocking thread, holding a decode
    /// gate permit for [`DecodeJob::cost_bytes`].
    pub fn run(self) -> Result<InlineImage, ImageOmitted> {
        let max_alloc = self.max_alloc();
        let DecodeJob {
            bytes,
            mime,
            header,
            auto_resize,
            bounds,
        } = self;
        let mut reader = ImageReader::with_format(Cursor::new(&bytes), mime.format());
        reader.limits(decode_limits(Some(bounds.max_decode_side), max_alloc));
        let image = reader.decode().map_err(|error| match error {
            ImageError::Limits(error) => {
                tracing::warn!(
                    mime = mime.as_str(),
                    width = header.width,
                    height = header.height,
                    max_alloc,
                    %error,
                    "image decode stopped at its allocation limit"
                );
                ImageOmitted::DecodeMemory {
                    width: header.width,
                    height: header.height,
                    max_alloc,
                }
            }
            _ => ImageOmitted::Unconvertible,
        })?;
        let mut hints = Vec::new();
        let (bytes, mime) = match mime {
            ImageMime::Bmp => {
                let png = encode_png(&image).ok_or(ImageOmitted::Unconvertible)?;
                hints.push(format!(
                    "[Image converted from {} to {}.]",
                    ImageMime::Bmp.as_str(),
                    ImageMime::Png.as_str()
                ));
                (png, ImageMime::Png)
            }
            ImageMime::Png | ImageMime::Jpeg | ImageMime::Gif | ImageMime::Webp => (bytes, mime),
        };
        let (width, height) = (image.width(), image.height());
        if !auto_resize
            || (width <= bounds.max_dimension
                && height <= bounds.max_dimension
                && bounds.fits(&bytes))
        {
            return Ok(untouched(&bytes, mime, hints));
        }
        drop(bytes);
        let (resized, out_mime, out_width, out_height) =
            shrink_until_it_fits(&image, bounds).ok_or(ImageOmitted::TooLarge)?;
        hints.push(format!(
            "[Image: original {width}x{height}, displayed at {out_width}x{out_height}. Multiply \
             coordinates by {:.2} to map to original image.]",
            f64::from(width) / f64::from(out_width)
        ));
        Ok(InlineImage {
            data_base64: BASE64.encode(&resized),
            mime: out_mime,
            hints,
        })
    }
}

fn untouched(bytes: &[u8], mime: ImageMime, hints: Vec<String>) -> InlineImage {
    InlineImage {
        data_base64: BASE64.encode(bytes),
        mime,
        hints,
    }
}

/// Length of the base64 encoding of `n` bytes (with padding).
fn base64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Scale to fit the maximum dimensions, then try PNG and the JPEG qualities in order; shrink
/// by a quarter and retry until something fits. Returns bytes, type and size.
fn shrink_until_it_fits(
    image: &DynamicImage,
    bounds: Bounds,
) -> Option<(Vec<u8>, ImageMime, u32, u32)> {
    let (mut width, mut height) = fit_within(image.width(), image.height(), bounds.max_dimension);
    loop {
        let scaled = scale_down(image, width, height);
        if let Some(png) = encode_png(&scaled).filter(|png| bounds.fits(png)) {
            return Some((png, ImageMime::Png, width, height));
        }
        let rgb = DynamicImage::ImageRgb8(scaled.to_rgb8());
        drop(scaled);
        for quality in JPEG_QUALITIES {
            if let Some(jpeg) = encode_jpeg(&rgb, quality).filter(|jpeg| bounds.fits(jpeg)) {
                return Some((jpeg, ImageMime::Jpeg, width, height));
            }
        }
        if (width, height) == (1, 1) {
            return None;
        }
        width = shrink(width);
        height = shrink(height);
    }
}

/// `image` at `width`×`height`: itself when the size is unchanged; Lanczos3 near the original
/// size; averaging of source boxes from twice the target size down, where averaging is a good
/// low-pass filter already and Lanczos would need an f32 copy of the image's full width.
fn scale_down(image: &DynamicImage, width: u32, height: u32) -> Cow<'_, DynamicImage> {
    let from = (image.width(), image.height());
    if from == (width, height) {
        Cow::Borrowed(image)
    } else if uses_box_filter(from, (width, height)) {
        Cow::Owned(image.thumbnail_exact(width, height))
    } else {
        Cow::Owned(image.resize_exact(width, height, FilterType::Lanczos3))
    }
}

/// Whether scaling `from` to `to` shrinks a side by half or more.
fn uses_box_filter(from: (u32, u32), to: (u32, u32)) -> bool {
    u64::from(from.0) >= 2 * u64::from(to.0) || u64::from(from.1) >= 2 * u64::from(to.1)
}

fn shrink(side: u32) -> u32 {
    // floor(side * 0.75), at least 1
    ((u64::from(side) * 3 / 4) as u32).max(1)
}

/// Scale `(width, height)` down (never up) so both fit `max`, keeping the aspect ratio
/// (rounded, at least 1).
fn fit_within(width: u32, height: u32, max: u32) -> (u32, u32) {
    let (mut w, mut h) = (f64::from(width), f64::from(height));
    let max = f64::from(max);
    if w > max {
        h = (h * max / w).round();
        w = max;
    }
    if h > max {
        w = (w * max / h).round();
        h = max;
    }
    (w.max(1.0) as u32, h.max(1.0) as u32)
}

fn encode_png(image: &DynamicImage) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    image
        .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
        .ok()?;
    Some(out)
}

fn encode_jpeg(rgb: &DynamicImage, quality: u8) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, quality)
        .encode_image(rgb)
        .ok()?;
    Some(out)
}

#[cfg(test)]
pub(crate) mod samples {
    //! Small encoded images for tests.

    use std::io::Cursor;

    use image::{DynamicImage, ImageFormat, Rgb, RgbImage};

    /// A `width`×`height` image with a gradient, encoded as `format`.
    pub(crate) fn encoded(width: u32, height: u32, format: ImageFormat) -> Vec<u8> {
        let image = RgbImage::from_fn(width, height, |x, y| {
            Rgb([(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
        });
        let mut out = Vec::new();
        DynamicImage::ImageRgb8(image)
            .write_to(&mut Cursor::new(&mut out), format)
            .unwrap();
        out
    }

    /// A `width`×`height` image of random noise as PNG (compresses badly).
    pub(crate) fn noise_png(width: u32, height: u32) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(7);
        let image = RgbImage::from_fn(width, height, |_, _| {
            Rgb([rng.u8(..), rng.u8(..), rng.u8(..)])
        });
        let mut out = Vec::new();
        DynamicImage::ImageRgb8(image)
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .unwrap();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{encoded, noise_png};
    use super::*;

    /// Plan and, where needed, decode at once (no gate: one image at a time).
    fn prepare_image_within(
        bytes: Vec<u8>,
        mime: ImageMime,
        auto_resize: bool,
        bounds: Bounds,
    ) -> Result<InlineImage, ImageOmitted> {
        match plan_image_within(bytes, mime, auto_resize, bounds) {
            ImagePlan::Ready(prepared) => prepared,
            ImagePlan::Decode(job) => job.run(),
        }
    }

    fn prepare_image(
        bytes: Vec<u8>,
        mime: ImageMime,
        auto_resize: bool,
    ) -> Result<InlineImage, ImageOmitted> {
        prepare_image_within(bytes, mime, auto_resize, Bounds::DEFAULT)
    }

    #[test]
    fn detects_supported_formats_by_magic() {
        assert_eq!(
            detect_image_mime(&encoded(4, 4, ImageFormat::Png)),
            Some(ImageMime::Png)
        );
        assert_eq!(
            detect_image_mime(&encoded(4, 4, ImageFormat::Jpeg)),
            Some(ImageMime::Jpeg)
        );
        assert_eq!(
            detect_image_mime(&encoded(4, 4, ImageFormat::Gif)),
            Some(ImageMime::Gif)
        );
        assert_eq!(
            detect_image_mime(&encoded(4, 4, ImageFormat::Bmp)),
            Some(ImageMime::Bmp)
        );
        assert_eq!(
            detect_image_mime(b"RIFF\0\0\0\0WEBPVP8 "),
            Some(ImageMime::Webp)
        );
        assert_eq!(detect_image_mime(b"hello world"), None);
        assert_eq!(detect_image_mime(b""), None);
    }

    #[test]
    fn rejects_jpeg_ls() {
        assert_eq!(detect_image_mime(&[0xFF, 0xD8, 0xFF, 0xF7, 0, 0]), None);
        assert_eq!(
            detect_image_mime(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0]),
            Some(ImageMime::Jpeg)
        );
    }

    fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&[0, 0, 0, 0]);
        out
    }

    #[test]
    fn png_needs_ihdr_and_no_animation_before_idat() {
        let signature = b"\x89PNG\r\n\x1a\n".to_vec();
        let ihdr = png_chunk(b"IHDR", &[0; 13]);
        let still = [signature.clone(), ihdr.clone(), png_chunk(b"IDAT", &[1, 2])].concat();
        assert_eq!(detect_image_mime(&still), Some(ImageMime::Png));
        let animated = [
            signature.clone(),
            ihdr.clone(),
            png_chunk(b"acTL", &[0; 8]),
            png_chunk(b"IDAT", &[1]),
        ]
        .concat();
        assert_eq!(detect_image_mime(&animated), None);
        let after_idat = [
            signature.clone(),
            ihdr.clone(),
            png_chunk(b"IDAT", &[1]),
            png_chunk(b"acTL", &[0; 8]),
        ]
        .concat();
        assert_eq!(detect_image_mime(&after_idat), Some(ImageMime::Png));
        let bad_ihdr = [signature.clone(), png_chunk(b"IHDR", &[0; 12])].concat();
        assert_eq!(detect_image_mime(&bad_ihdr), None);
        assert_eq!(detect_image_mime(&signature), None);
    }

    #[test]
    fn bmp_needs_a_valid_dib_header() {
        let mut bmp = encoded(3, 3, ImageFormat::Bmp);
        assert_eq!(detect_image_mime(&bmp), Some(ImageMime::Bmp));
        bmp[26] = 2; // planes
        assert_eq!(detect_image_mime(&bmp), None);
        let mut bmp = encoded(3, 3, ImageFormat::Bmp);
        bmp[28] = 7; // bits per pixel
        assert_eq!(detect_image_mime(&bmp), None);
        let mut bmp = encoded(3, 3, ImageFormat::Bmp);
        bmp[14] = 200; // DIB size
        assert_eq!(detect_image_mime(&bmp), None);
        assert_eq!(detect_image_mime(b"BM short"), None);
        // OS/2 core header: size 12, planes at 22, bpp at 24
        let mut core = vec![0u8; 26];
        core[..2].copy_from_slice(b"BM");
        core[14] = 12;
        core[22] = 1;
        core[24] = 24;
        assert_eq!(detect_image_mime(&core), Some(ImageMime::Bmp));
    }

    #[test]
    fn image_within_limits_is_untouched() {
        let png = encoded(40, 30, ImageFormat::Png);
        let image = prepare_image(png.clone(), ImageMime::Png, true).unwrap();
        assert_eq!(image.data_base64, BASE64.encode(&png));
        assert_eq!(image.mime, ImageMime::Png);
        assert!(image.hints.is_empty());
    }

    #[test]
    fn bmp_is_converted_to_png() {
        let bmp = encoded(5, 4, ImageFormat::Bmp);
        for auto_resize in [true, false] {
            let image = prepare_image(bmp.clone(), ImageMime::Bmp, auto_resize).unwrap();
            assert_eq!(image.mime, ImageMime::Png);
            assert_eq!(
                image.hints,
                ["[Image converted from image/bmp to image/png.]"]
            );
            let bytes = BASE64.decode(&image.data_base64).unwrap();
            assert_eq!(bytes[0], 0x89);
            let decoded = image::load_from_memory(&bytes).unwrap();
            assert_eq!((decoded.width(), decoded.height()), (5, 4));
        }
    }

    #[test]
    fn oversized_dimensions_are_scaled_down() {
        let png = encoded(2400, 24, ImageFormat::Png);
        let image = prepare_image(png, ImageMime::Png, true).unwrap();
        assert_eq!(image.mime, ImageMime::Png);
        assert_eq!(
            image.hints,
            [
                "[Image: original 2400x24, displayed at 2000x20. Multiply coordinates by 1.20 to \
              map to original image.]"
            ]
        );
        let decoded = image::load_from_memory(&BASE64.decode(&image.data_base64).unwrap()).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (2000, 20));
    }

    const SMALL: Bounds = Bounds {
        max_dimension: 100,
        max_base64_bytes: 8000,
        ..Bounds::DEFAULT
    };

    #[test]
    fn tall_images_fit_the_height() {
        let png = encoded(30, 240, ImageFormat::Png);
        let image = prepare_image_within(png, ImageMime::Png, true, SMALL).unwrap();
        let decoded = image::load_from_memory(&BASE64.decode(&image.data_base64).unwrap()).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (13, 100));
        assert!(image.hints[0].contains("original 30x240, displayed at 13x100"));
    }

    #[test]
    fn shrinks_by_quarters_until_the_payload_fits() {
        // Noise compresses badly: 100x100 is ~40 KB of base64 as PNG and over 8 KB as JPEG.
        let png = noise_png(100, 100);
        let image = prepare_image_within(png, ImageMime::Png, true, SMALL).unwrap();
        assert_eq!(image.mime, ImageMime::Jpeg);
        assert!(image.data_base64.len() < SMALL.max_base64_bytes);
        let bytes = BASE64.decode(&image.data_base64).unwrap();
        let decoded = image::load_from_memory(&bytes).unwrap();
        let side = decoded.width();
        assert_eq!(decoded.height(), side);
        assert!([75, 56, 42, 31].contains(&side), "side {side}");
        assert!(image.hints[0].starts_with("[Image: original 100x100, displayed at "));
    }

    #[test]
    fn nothing_fits_means_too_large() {
        let bounds = Bounds {
            max_dimension: 100,
            max_base64_bytes: 8,
            ..Bounds::DEFAULT
        };
        let png = encoded(20, 20, ImageFormat::Png);
        assert_eq!(
            prepare_image_within(png, ImageMime::Png, true, bounds),
            Err(ImageOmitted::TooLarge)
        );
    }

    #[test]
    fn auto_resize_off_keeps_oversized_images() {
        let png = encoded(2100, 10, ImageFormat::Png);
        let image = prepare_image(png.clone(), ImageMime::Png, false).unwrap();
        assert_eq!(image.data_base64, BASE64.encode(&png));
        assert!(image.hints.is_empty());
    }

    #[test]
    fn too_many_bytes_falls_back_to_jpeg() {
        // Noise within the dimensions whose PNG is over the byte limit but whose JPEG is not.
        let png = noise_png(60, 60);
        let bounds = Bounds {
            max_dimension: 100,
            max_base64_bytes: 12_000,
            ..Bounds::DEFAULT
        };
        assert!(!bounds.fits(&png));
        let image = prepare_image_within(png, ImageMime::Png, true, bounds).unwrap();
        assert_eq!(image.mime, ImageMime::Jpeg);
        assert!(image.data_base64.len() < bounds.max_base64_bytes);
        assert_eq!(
            image.hints,
            [
                "[Image: original 60x60, displayed at 60x60. Multiply coordinates by 1.00 to map to \
              original image.]"
            ]
        );
    }

    #[test]
    fn undecodable_images_are_omitted() {
        let mut broken = b"\x89PNG\r\n\x1a\n".to_vec();
        broken.extend_from_slice(&png_chunk(b"IHDR", &[0; 13]));
        assert_eq!(
            prepare_image(broken, ImageMime::Png, true),
            Err(ImageOmitted::Unconvertible)
        );
        assert_eq!(
            prepare_image(b"BMgarbage".to_vec(), ImageMime::Bmp, false),
            Err(ImageOmitted::Unconvertible)
        );
        assert!(ImageOmitted::TooLarge.note().contains("size limit"));
    }

    #[test]
    fn geometry_helpers() {
        assert_eq!(fit_within(2400, 4800, 2000), (1000, 2000));
        assert_eq!(fit_within(4000, 100, 2000), (2000, 50));
        assert_eq!(fit_within(10, 10, 2000), (10, 10));
        assert_eq!(fit_within(100_000, 1, 2000), (2000, 1));
        assert_eq!(shrink(2000), 1500);
        assert_eq!(shrink(5), 3);
        assert_eq!(shrink(1), 1);
        assert_eq!(shrink(2), 1);
        assert_eq!(base64_len(0), 0);
        assert_eq!(base64_len(1), 4);
        assert_eq!(base64_len(3), 4);
        assert_eq!(base64_len(4), 8);
    }

    fn plan_note(plan: ImagePlan) -> String {
        match plan {
            ImagePlan::Ready(Err(omitted)) => omitted.note(),
            ImagePlan::Ready(Ok(image)) => panic!("expected an omitted image, got {image:?}"),
            ImagePlan::Decode(job) => panic!("expected no decode, got {job:?}"),
        }
    }

    #[test]
    fn png_bomb_is_refused_from_its_header() {
        // 3.2 MB on disk, 529 MB decoded.
        let bomb = crate::testing::png_zero_bomb(11_500, 11_500);
        assert!(bomb.len() < 4 << 20);
        assert_eq!(
            plan_note(plan_image(bomb, ImageMime::Png, true)),
            "[Image omitted: it is 11500x11500, 132250000 pixels; read decodes at most 67108864 \
             pixels per image. Make a smaller copy with an image tool first (for example \
             ImageMagick: convert FILE -resize 4000x4000 small.png) and read that.]"
        );
    }

    #[test]
    fn the_pixel_bound_is_inclusive() {
        let at_bound = crate::testing::png_zero_bomb(8192, 8192);
        let ImagePlan::Decode(job) = plan_image(at_bound, ImageMime::Png, true) else {
            panic!("8192x8192 is within the bound");
        };
        // Decoded 256 MiB, as much again and the slack for the decoder; a box-filtered
        // 2000x2000 result is smaller than that.
        assert_eq!(job.cost_bytes(), (256 << 20) + (256 << 20) + (16 << 20));
        let over = crate::testing::png_zero_bomb(8193, 8192);
        assert!(plan_note(plan_image(over, ImageMime::Png, true)).contains("8193x8192"));
    }

    /// `encoded(…)` with the dimensions in its header replaced by `width`×`height`.
    fn with_header_dimensions(format: ImageFormat, width: u32, height: u32) -> Vec<u8> {
        let mut bytes = encoded(16, 16, format);
        let (w16, h16) = (width as u16, height as u16);
        match format {
            ImageFormat::Jpeg => {
                let sof = bytes
                    .windows(2)
                    .position(|marker| marker == [0xFF, 0xC0])
                    .expect("baseline JPEG has SOF0");
                // FF C0, length (2), precision (1), height (2), width (2)
                bytes[sof + 5..sof + 7].copy_from_slice(&h16.to_be_bytes());
                bytes[sof + 7..sof + 9].copy_from_slice(&w16.to_be_bytes());
            }
            ImageFormat::Gif => {
                // Logical screen descriptor after "GIF89a".
                bytes[6..8].copy_from_slice(&w16.to_le_bytes());
                bytes[8..10].copy_from_slice(&h16.to_le_bytes());
            }
            ImageFormat::WebP => {
                assert_eq!(&bytes[12..16], b"VP8L", "lossless WebP");
                // Signature 0x2F, then 14 bits width - 1, 14 bits height - 1.
                let at = 21;
                let bits = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                let bits = (bits & !0x0FFF_FFFF) | (width - 1) | ((height - 1) << 14);
                bytes[at..at + 4].copy_from_slice(&bits.to_le_bytes());
            }
            ImageFormat::Bmp => {
                bytes[18..22].copy_from_slice(&width.to_le_bytes());
                bytes[22..26].copy_from_slice(&height.to_le_bytes());
            }
            other => panic!("no header patch for {other:?}"),
        }
        bytes
    }

    #[test]
    fn every_format_is_refused_from_its_header() {
        for (format, mime) in [
            (ImageFormat::Jpeg, ImageMime::Jpeg),
            (ImageFormat::Gif, ImageMime::Gif),
            (ImageFormat::WebP, ImageMime::Webp),
            (ImageFormat::Bmp, ImageMime::Bmp),
        ] {
            let bytes = with_header_dimensions(format, 11_500, 11_500);
            let note = plan_note(plan_image(bytes, mime, true));
            assert!(
                note.starts_with("[Image omitted: it is 11500x11500, 132250000 pixels;"),
                "{format:?}: {note}"
            );
        }
    }

    #[test]
    fn side_and_byte_bounds_are_refused_from_the_header() {
        let bounds = Bounds {
            max_dimension: 10,
            max_decode_side: 50,
            max_decoded_bytes: 1000,
            ..Bounds::DEFAULT
        };
        let wide = encoded(60, 4, ImageFormat::Png);
        assert_eq!(
            plan_note(plan_image_within(wide, ImageMime::Png, true, bounds)),
            "[Image omitted: it is 60x4; read decodes at most 50 pixels per side. Make a smaller \
             copy with an image tool first (for example ImageMagick: convert FILE -resize \
             4000x4000 small.png) and read that.]"
        );
        // 20x20 RGB is 1200 bytes decoded.
        let heavy = encoded(20, 20, ImageFormat::Png);
        assert!(
            plan_note(plan_image_within(heavy, ImageMime::Png, true, bounds)).starts_with(
                "[Image omitted: it is 20x20 and decodes to 1200 bytes; read decodes at most \
                 1000 bytes per image."
            )
        );
        // A BMP is decoded even without resizing, so the bounds apply to it too.
        let bmp = encoded(60, 4, ImageFormat::Bmp);
        assert!(plan_note(plan_image_within(bmp, ImageMime::Bmp, false, bounds)).contains("60x4"));
    }

    #[test]
    fn a_lying_gif_header_stops_at_the_allocation_limit() {
        // The screen says 64x64 (16 KiB decoded); the one frame is 300x300 (360 KB).
        let mut gif = encoded(300, 300, ImageFormat::Gif);
        gif[6..8].copy_from_slice(&64u16.to_le_bytes());
        gif[8..10].copy_from_slice(&64u16.to_le_bytes());
        let bounds = Bounds {
            max_dimension: 32,
            decoder_slack_bytes: 64 << 10,
            ..Bounds::DEFAULT
        };
        let ImagePlan::Decode(job) = plan_image_within(gif, ImageMime::Gif, true, bounds) else {
            panic!("64x64 is within the decode bounds and over max_dimension");
        };
        assert_eq!(
            job.run(),
            Err(ImageOmitted::DecodeMemory {
                width: 64,
                height: 64,
                max_alloc: 2 * 64 * 64 * 4 + (64 << 10),
            })
        );
    }

    #[test]
    fn jpeg_gif_and_webp_are_still_resized() {
        for (format, mime) in [
            (ImageFormat::Jpeg, ImageMime::Jpeg),
            (ImageFormat::Gif, ImageMime::Gif),
            (ImageFormat::WebP, ImageMime::Webp),
        ] {
            let bytes = encoded(240, 120, format);
            let image = prepare_image_within(bytes, mime, true, SMALL).unwrap();
            assert_eq!(
                image.hints,
                [
                    "[Image: original 240x120, displayed at 100x50. Multiply coordinates by 2.40 \
                  to map to original image.]"
                ],
                "{format:?}"
            );
            let decoded =
                image::load_from_memory(&BASE64.decode(&image.data_base64).unwrap()).unwrap();
            assert_eq!((decoded.width(), decoded.height()), (100, 50), "{format:?}");
        }
    }

    #[test]
    fn large_downscales_average_boxes_of_source_pixels() {
        // Columns alternate black and white: averaging pairs gives an even grey everywhere,
        // where Lanczos rings at the edges.
        let stripes = image::GrayImage::from_fn(40, 4, |x, _| {
            image::Luma([if x % 2 == 0 { 0 } else { 254 }])
        });
        let stripes = DynamicImage::ImageLuma8(stripes);
        let scaled = scale_down(&stripes, 20, 2);
        let gray = scaled.to_luma8();
        assert!(gray.pixels().all(|pixel| pixel.0[0] == 127), "{gray:?}");
        assert!(uses_box_filter((4000, 10), (2000, 5)));
        assert!(!uses_box_filter((3999, 3999), (2000, 2000)));
        assert!(matches!(
            scale_down(&DynamicImage::new_rgb8(3, 3), 3, 3),
            Cow::Borrowed(_)
        ));
    }
}
