//! `read`: text with offset/limit and continuation notices, head truncation, the over-long
//! line hint, errors, images by magic bytes, the binary note.

use std::sync::Arc;

use cordon_core::protocol::Content;
use cordon_tests::fixtures::{base64, decode_image, image_bytes, numbered_lines, numbered_range};
use cordon_tests::{Harness, Workspace};
use image::ImageFormat;
use serde_json::{Value, json};

pub async fn whole_file(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("notes.txt", "one\ntwo\nthree\n");
    let read = ws.call("read", json!({"path": "notes.txt"})).await;
    read.assert_ok("one\ntwo\nthree\n");
    assert_eq!(read.details(), Value::Null);
    assert_eq!(read.structured(), Value::Null);
    // The same file by its absolute backend path, with a leading `@`, and through `./`.
    let absolute = ws.backend_path("notes.txt");
    for path in [
        absolute.to_string_lossy().into_owned(),
        "@notes.txt".to_owned(),
        "./sub/../notes.txt".to_owned(),
    ] {
        ws.mkdir("sub");
        ws.call("read", json!({ "path": path }))
            .await
            .assert_ok("one\ntwo\nthree\n");
    }
    // An empty file reads as empty text.
    ws.put("empty.txt", "");
    ws.call("read", json!({"path": "empty.txt"}))
        .await
        .assert_ok("");
}

pub async fn offset_and_limit(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("lines.txt", numbered_lines("Line ", 100));
    ws.call(
        "read",
        json!({"path": "lines.txt", "offset": 41, "limit": 20}),
    )
    .await
    .assert_ok(&format!(
        "{}\n[40 more lines in file. Use offset=61 to continue.]",
        numbered_range("Line ", 41, 60)
    ));
    ws.call("read", json!({"path": "lines.txt", "limit": 10}))
        .await
        .assert_ok(&format!(
            "{}\n[90 more lines in file. Use offset=11 to continue.]",
            numbered_range("Line ", 1, 10)
        ));
    // From an offset to the end: no notice, the final newline kept.
    let rest = ws
        .call("read", json!({"path": "lines.txt", "offset": 51}))
        .await;
    rest.assert_ok(&numbered_range("Line ", 51, 100));
    assert_eq!(rest.details(), Value::Null);
    // A limit reaching exactly the end: no notice either.
    ws.call(
        "read",
        json!({"path": "lines.txt", "offset": 91, "limit": 10}),
    )
    .await
    .assert_ok(&numbered_range("Line ", 91, 100));
}

pub async fn truncated_by_lines(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("long.txt", numbered_lines("Line ", 2500));
    let read = ws.call("read", json!({"path": "long.txt"})).await;
    read.assert_ok(&format!(
        "{}\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]",
        numbered_range("Line ", 1, 2000)
    ));
    let truncation = &read.details()["truncation"];
    assert_eq!(truncation["truncated"], json!(true));
    assert_eq!(truncation["truncatedBy"], json!("lines"));
    assert_eq!(truncation["totalLines"], json!(2500));
    assert_eq!(truncation["outputLines"], json!(2000));
    // Continuing where the notice says reaches the end.
    ws.call("read", json!({"path": "long.txt", "offset": 2001}))
        .await
        .assert_ok(&numbered_range("Line ", 2001, 2500));
}

pub async fn truncated_by_bytes(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    // 500 lines of 210 bytes: 242 whole lines fit in 50 KiB (242 * 211 - 1 = 51061 bytes).
    let line = |i: usize| format!("{i:04}{}", "x".repeat(206));
    let text: String = (1..=500).map(|i| format!("{}\n", line(i))).collect();
    ws.put("wide.txt", &text);
    let shown: String = (1..=242).map(|i| format!("{}\n", line(i))).collect();
    let read = ws.call("read", json!({"path": "wide.txt"})).await;
    read.assert_ok(&format!(
        "{shown}\n[Showing lines 1-242 of 500 (50.0KB limit). Use offset=243 to continue.]"
    ));
    assert_eq!(read.details()["truncation"]["truncatedBy"], json!("bytes"));
}

pub async fn trailing_newline_is_not_a_line(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    let text = numbered_lines("Line ", 2000);
    ws.put("exact.txt", &text);
    let read = ws.call("read", json!({"path": "exact.txt"})).await;
    read.assert_ok(&text);
    assert_eq!(read.details(), Value::Null);
    ws.put("three.txt", "a\nb\nc\n");
    ws.call("read", json!({"path": "three.txt", "offset": 4}))
        .await
        .assert_error("Offset 4 is beyond end of file (3 lines total)");
}

pub async fn overlong_first_line_hint(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put(
        "long line.txt",
        format!("short\n{}\nafter\n", "x".repeat(60_000)),
    );
    let read = ws
        .call("read", json!({"path": "long line.txt", "offset": 2}))
        .await;
    // The hint names the resolved path, shell-quoted, ready to paste.
    read.assert_ok(
        "[Line 2 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '2p' '$ROOT/long line.txt' | \
         head -c 51200]",
    );
    assert_eq!(
        read.details()["truncation"]["firstLineExceedsLimit"],
        json!(true)
    );
    ws.call("read", json!({"path": "long line.txt", "offset": 3}))
        .await
        .assert_ok("after\n");
}

pub async fn offset_beyond_end(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("three.txt", "a\nb\nc\n");
    ws.call("read", json!({"path": "three.txt", "offset": 100}))
        .await
        .assert_error("Offset 100 is beyond end of file (3 lines total)");
    ws.call("read", json!({"path": "three.txt", "offset": -1}))
        .await
        .assert_error("offset must not be negative, got -1.");
}

pub async fn missing_file(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.call("read", json!({"path": "nope.txt"}))
        .await
        .assert_error(
            "ENOENT: file not found: nope.txt. Check the path, or use ls or find to locate the \
             file.",
        );
    ws.call("read", json!({"path": "missing/dir/nope.txt"}))
        .await
        .assert_error(
            "ENOENT: file not found: missing/dir/nope.txt. Check the path, or use ls or find to \
             locate the file.",
        );
}

pub async fn directory(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.mkdir("sub");
    ws.call("read", json!({"path": "sub"}))
        .await
        .assert_error("EISDIR: sub is a directory, not a file. Use ls to list its contents.");
}

pub async fn image_by_magic_bytes(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    for (name, format, mime) in [
        ("picture.txt", ImageFormat::Png, "image/png"),
        ("photo.dat", ImageFormat::Jpeg, "image/jpeg"),
        ("anim", ImageFormat::Gif, "image/gif"),
    ] {
        let bytes = image_bytes(3, 2, format);
        ws.put(name, &bytes);
        let read = ws.call("read", json!({"path": name})).await;
        assert!(!read.is_error(), "{read:#?}");
        assert_eq!(
            read.result.content,
            vec![
                Content::text(format!("Read image file [{mime}]")),
                Content::Image {
                    data: base64(&bytes),
                    mime_type: mime.to_owned(),
                },
            ],
            "{name}: an image within the limits is sent untouched"
        );
    }
}

pub async fn bmp_is_converted_to_png(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("shot.bmp", image_bytes(5, 4, ImageFormat::Bmp));
    let read = ws.call("read", json!({"path": "shot.bmp"})).await;
    assert!(!read.is_error(), "{read:#?}");
    let [Content::Text { text }, Content::Image { data, mime_type }] =
        read.result.content.as_slice()
    else {
        panic!("expected a text and an image block: {read:#?}");
    };
    assert_eq!(
        text,
        "Read image file [image/png]\n[Image converted from image/bmp to image/png.]"
    );
    assert_eq!(mime_type, "image/png");
    assert_eq!(decode_image(data), (ImageFormat::Png, 5, 4));
}

pub async fn image_extension_with_text_is_text(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("fake.png", "not an image\n");
    let read = ws.call("read", json!({"path": "fake.png"})).await;
    read.assert_ok("not an image\n");
    assert_eq!(read.result.content.len(), 1);
}

pub async fn binary_file_note(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("blob.bin", b"\x7fELF\x00\x01\x02\x03");
    let read = ws.call("read", json!({"path": "blob.bin"})).await;
    read.assert_ok(
        "[Binary file not shown: blob.bin (8B, 8 bytes) is not text: it contains NUL bytes. Use \
         bash (e.g. file, xxd or od) to inspect it.]",
    );
    assert_eq!(read.details(), json!({"binary": true, "size": 8}));
    ws.put("latin1.txt", b"caf\xe9 cr\xe8me\n");
    ws.call("read", json!({"path": "latin1.txt"}))
        .await
        .assert_ok(
            "[Binary file not shown: latin1.txt (11B, 11 bytes) is not text: it is not valid \
             UTF-8 text. Use bash (e.g. file, xxd or od) to inspect it.]",
        );
}

pub async fn lenient_argument_coercion(h: Arc<dyn Harness>) {
    let ws = Workspace::open(&h).await;
    ws.put("abc.txt", "a\nb\nc\n");
    // Models send numbers as strings; the pipeline coerces them before the tool runs.
    ws.call(
        "read",
        json!({"path": "abc.txt", "offset": "2", "limit": "1"}),
    )
    .await
    .assert_ok("b\n\n[1 more lines in file. Use offset=3 to continue.]");
}
