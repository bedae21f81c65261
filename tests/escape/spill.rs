//! The read tool reaches the bash spill file (the full output of a truncated command) on the
//! same backend — the one file outside the workspace it may open.

use serde_json::json;

use crate::support::Harness;

#[tokio::test]
async fn read_tool_opens_the_spill_file() {
    let h = Harness::new().await;
    let result = h.bash("seq 1 100000").await;
    assert!(!result.is_error, "{}", result.text());
    let path = result
        .details
        .as_ref()
        .and_then(|details| details.get("fullOutputPath"))
        .and_then(|path| path.as_str())
        .expect("a truncated command reports its spill file")
        .to_owned();
    assert!(!std::path::Path::new(&path).starts_with(&h.ws));
    let read = h
        .call("read", json!({"path": path, "offset": 1, "limit": 3}))
        .await;
    assert!(!read.is_error, "{}", read.text());
    assert!(read.text().starts_with("1\n2\n3"), "{}", read.text());
    // Commands can read it too (same layout for both layers), but not change it.
    let tail = h.bash(&format!("tail -n 1 {path}")).await;
    assert_eq!(tail.text().trim(), "100000");
    h.bash_fails("overwrite the spill file", &format!("echo x > {path}"))
        .await;
    h.tool_fails(
        "write the spill file",
        "write",
        json!({"path": path, "content": "x"}),
    )
    .await;
    let again = h
        .call("read", json!({"path": path, "offset": 100000, "limit": 1}))
        .await;
    assert!(again.text().starts_with("100000"), "{}", again.text());
}
