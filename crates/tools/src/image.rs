//! Images for the `read` tool (docs/semantics.md#read): detection by magic bytes, BMP to PNG
//! conversion, and resizing to what a model accepts inline.
//!
//! The file extension is never consulted. An image already within the limits is returned
//! byte for byte; otherwise it is scaled to fit [`MAX_DIMENSION`] and re-encoded, trying PNG
//! and then JPEG at falling qualities, shrinking by a quarter until the base64 payload is under
//! [`MAX_BASE64_BYTES`]. Everything here is CPU-bound and synchronous; callers run it on a
//! blocking thread.

use std::io::Cursor;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat, ImageReader};

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
}

impl ImageOmitted {
    /// The note for the model.
    pub fn note(self) -> &'static str {
        match self {
            ImageOmitted::Unconvertible => {
                "[Image omitted: could not be converted to a supported inline image format.]"
            }
            ImageOmitted::TooLarge => {
                "[Image omitted: could not be resized below the inline image size limit.]"
            }
        }
    }
}

/// Turn an image file's bytes into an inline image: BMP is always converted to PNG; with
/// `auto_resize`, images over [`MAX_DIMENSION`] or [`MAX_BASE64_BYTES`] are scaled and
/// re-encoded, and images within the limits are returned untouched.
pub fn prepare_image(
    bytes: Vec<u8>,
    mime: ImageMime,
    auto_resize: bool,
) -> Result<InlineImage, ImageOmitted> {
    prepare_image_within(bytes, mime, auto_resize, Bounds::DEFAULT)
}

/// The limits an inline image must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Largest width and height.
    pub max_dimension: u32,
    /// Base64 payloads must be strictly smaller.
    pub max_base64_bytes: usize,
}

impl Bounds {
    const DEFAULT: Bounds = Bounds {
        max_dimension: MAX_DIMENSION,
        max_base64_bytes: MAX_BASE64_BYTES,
    };

    fn fits(self, encoded: &[u8]) -> bool {
        base64_len(encoded.len()) < self.max_base64_bytes
    }
}

/// [`prepare_image`] with explicit limits.
pub(crate) fn prepare_image_within(
    bytes: Vec<u8>,
    mime: ImageMime,
    auto_resize: bool,
    bounds: Bounds,
) -> Result<InlineImage, ImageOmitted> {
    let mut hints = Vec::new();
    let (bytes, mime, mut decoded) = match mime {
        ImageMime::Bmp => {
            let image = image::load_from_memory_with_format(&bytes, ImageFormat::Bmp)
                .map_err(|_| ImageOmitted::Unconvertible)?;
            let png = encode_png(&image).ok_or(ImageOmitted::Unconvertible)?;
            hints.push(format!(
                "[Image converted from {} to {}.]",
                ImageMime::Bmp.as_str(),
                ImageMime::Png.as_str()
            ));
            (png, ImageMime::Png, Some(image))
        }
        ImageMime::Png | ImageMime::Jpeg | ImageMime::Gif | ImageMime::Webp => (bytes, mime, None),
    };
    let untouched = |bytes: &[u8], mime, hints| InlineImage {
        data_base64: BASE64.encode(bytes),
        mime,
        hints,
    };
    if !auto_resize {
        return Ok(untouched(&bytes, mime, hints));
    }
    let (width, height) = match &decoded {
        Some(image) => (image.width(), image.height()),
        None => ImageReader::with_format(Cursor::new(&bytes), mime.format())
            .into_dimensions()
            .map_err(|_| ImageOmitted::Unconvertible)?,
    };
    if width <= bounds.max_dimension && height <= bounds.max_dimension && bounds.fits(&bytes) {
        return Ok(untouched(&bytes, mime, hints));
    }
    let image = match decoded.take() {
        Some(image) => image,
        None => image::load_from_memory_with_format(&bytes, mime.format())
            .map_err(|_| ImageOmitted::Unconvertible)?,
    };
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
        let scaled = if (width, height) == (image.width(), image.height()) {
            image.clone()
        } else {
            image.resize_exact(width, height, FilterType::Lanczos3)
        };
        if let Some(png) = encode_png(&scaled).filter(|png| bounds.fits(png)) {
            return Some((png, ImageMime::Png, width, height));
        }
        let rgb = DynamicImage::ImageRgb8(scaled.to_rgb8());
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
}
