//! The file helper with real shells: confinement, canonical paths, reads, interactive atomic
//! writes (mode kept, short input never replaces the file), listings, mkdir, spill files.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cordon_ops::{DirEntry, FileKind};
use cordon_remote::files::{
    FileOp, FsRecord, files_argv, files_record_parser, go_line, parse_fs_record,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{run, shells, spawn};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    spill: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::canonicalize(dir.path()).expect("canon");
    let root = base.join("ws");
    let spill = base.join("spill");
    std::fs::create_dir_all(root.join("dir/sub")).expect("mkdir");
    std::fs::create_dir_all(&spill).expect("mkdir");
    std::fs::write(root.join("a.txt"), "hello\n").expect("write");
    std::fs::write(base.join("outside.txt"), "secret").expect("write");
    std::os::unix::fs::symlink("../outside.txt", root.join("out-link")).expect("symlink");
    std::os::unix::fs::symlink(&base, root.join("out-dir")).expect("symlink");
    std::os::unix::fs::symlink("a.txt", root.join("in-link")).expect("symlink");
    std::os::unix::fs::symlink("dir", root.join("dir-link")).expect("symlink");
    std::os::unix::fs::symlink("missing", root.join("dangling")).expect("symlink");
    std::os::unix::fs::symlink("loop2", root.join("loop1")).expect("symlink");
    std::os::unix::fs::symlink("loop1", root.join("loop2")).expect("symlink");
    Fixture {
        _dir: dir,
        root,
        spill,
    }
}

async fn records(shell: &[String], fx: &Fixture, op: FileOp) -> (Vec<FsRecord>, Vec<u8>) {
    let argv = files_argv(&[fx.root.clone(), fx.spill.clone()], &op).expect("argv");
    let (stdout, stderr) = run(shell, &argv, b"").await;
    let mut parser = files_record_parser();
    let parsed = parser
        .feed(&stderr)
        .expect("records")
        .iter()
        .map(|r| parse_fs_record(r).expect("known record"))
        .collect();
    assert!(
        !parser.is_mid_record(),
        "unterminated record: {:?}",
        String::from_utf8_lossy(&stderr)
    );
    (parsed, stdout)
}

fn err(code: &str, path: &Path, message: &str) -> FsRecord {
    FsRecord::Err {
        code: code.to_owned(),
        path: path.to_path_buf(),
        message: message.to_owned(),
    }
}

#[tokio::test]
async fn canonical_paths_and_confinement() {
    let fx = fixture();
    let r = &fx.root;
    for shell in shells() {
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(r.join("in-link")))
                .await
                .0,
            vec![FsRecord::Canon(r.join("a.txt")), FsRecord::Ok],
            "{shell:?}"
        );
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(r.join("dir-link/new/./x/../y")))
                .await
                .0,
            vec![FsRecord::Canon(r.join("dir/new/y")), FsRecord::Ok],
            "{shell:?}"
        );
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(r.join("dir/../a.txt")))
                .await
                .0,
            vec![FsRecord::Canon(r.join("a.txt")), FsRecord::Ok]
        );
        for escape in [
            r.join("out-link"),
            r.join("out-dir/outside.txt"),
            r.join("../outside.txt"),
            PathBuf::from("/etc/passwd"),
        ] {
            assert_eq!(
                records(&shell, &fx, FileOp::Canon(escape.clone())).await.0,
                vec![err("outside", &escape, "outside the allowed roots")],
                "{shell:?} {escape:?}"
            );
        }
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(r.join("loop1"))).await.0,
            vec![err(
                "loop",
                &r.join("loop1"),
                "too many levels of symbolic links"
            )]
        );
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(r.join("a.txt/x")))
                .await
                .0,
            vec![err("notdir", &r.join("a.txt/x"), "not a directory")]
        );
        assert_eq!(
            records(&shell, &fx, FileOp::Canon(fx.spill.join("f.log")))
                .await
                .0,
            vec![FsRecord::Canon(fx.spill.join("f.log")), FsRecord::Ok]
        );
    }
}

#[tokio::test]
async fn reads_stats_and_lists() {
    let fx = fixture();
    let r = &fx.root;
    for shell in shells() {
        let (recs, data) = records(
            &shell,
            &fx,
            FileOp::Read {
                path: r.join("in-link"),
                max: None,
            },
        )
        .await;
        assert_eq!(
            (recs, data),
            (
                vec![FsRecord::Canon(r.join("a.txt")), FsRecord::Ok],
                b"hello\n".to_vec()
            )
        );
        let (_, data) = records(
            &shell,
            &fx,
            FileOp::Read {
                path: r.join("a.txt"),
                max: Some(2),
            },
        )
        .await;
        assert_eq!(data, b"he");
        let (recs, data) = records(
            &shell,
            &fx,
            FileOp::Read {
                path: r.join("out-link"),
                max: None,
            },
        )
        .await;
        assert_eq!(
            (recs, data),
            (
                vec![err(
                    "outside",
                    &r.join("out-link"),
                    "outside the allowed roots"
                )],
                vec![]
            )
        );
        let (recs, _) = records(
            &shell,
            &fx,
            FileOp::Read {
                path: r.join("dir"),
                max: None,
            },
        )
        .await;
        // The canonical path comes first, so the client judges its rules before anything else.
        assert_eq!(
            recs,
            vec![
                FsRecord::Canon(r.join("dir")),
                err("isdir", &r.join("dir"), "is a directory")
            ]
        );
        let (recs, _) = records(
            &shell,
            &fx,
            FileOp::Read {
                path: r.join("nope"),
                max: None,
            },
        )
        .await;
        assert_eq!(
            recs,
            vec![
                FsRecord::Canon(r.join("nope")),
                err("notfound", &r.join("nope"), "no such file or directory")
            ]
        );

        let (recs, _) = records(&shell, &fx, FileOp::Stat(r.join("a.txt"))).await;
        let FsRecord::Stat(stat) = &recs[1] else {
            panic!("{recs:?}")
        };
        assert_eq!(
            (stat.kind, stat.size, stat.mode & 0o600),
            (FileKind::File, 6, 0o600)
        );

        let (recs, _) = records(&shell, &fx, FileOp::List(r.clone())).await;
        let mut entries: Vec<DirEntry> = recs
            .into_iter()
            .filter_map(|r| match r {
                FsRecord::Ent(e) => Some(e),
                _ => None,
            })
            .collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let e = |name: &str, kind: Option<FileKind>, error: Option<&str>| DirEntry {
            name: name.to_owned(),
            kind,
            error: error.map(str::to_owned),
        };
        assert_eq!(
            entries,
            vec![
                e("a.txt", Some(FileKind::File), None),
                e(
                    "dangling",
                    None,
                    Some("No such file or directory (os error 2)")
                ),
                e("dir", Some(FileKind::Dir), None),
                e("dir-link", Some(FileKind::Dir), None),
                e("in-link", Some(FileKind::File), None),
                e(
                    "loop1",
                    None,
                    Some("Too many levels of symbolic links (os error 40)")
                ),
                e(
                    "loop2",
                    None,
                    Some("Too many levels of symbolic links (os error 40)")
                ),
                e(
                    "out-dir",
                    None,
                    Some(&format!(
                        "path is outside the allowed roots: {}",
                        r.parent().expect("base").display()
                    ))
                ),
                e(
                    "out-link",
                    None,
                    Some(&format!(
                        "path is outside the allowed roots: {}",
                        r.parent().expect("base").join("outside.txt").display()
                    ))
                ),
            ],
            "{shell:?}"
        );
    }
}

/// Run an interactive op: wait for `canon`, then send `answer` (and close stdin).
async fn interactive(shell: &[String], fx: &Fixture, op: FileOp, answer: &[u8]) -> Vec<FsRecord> {
    let argv = files_argv(std::slice::from_ref(&fx.root), &op).expect("argv");
    let mut child = spawn(shell, &argv, Path::new("/"));
    let mut stderr = child.stderr.take().expect("stderr");
    let mut stdin = Some(child.stdin.take().expect("stdin"));
    let mut parser = files_record_parser();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let mut answered = false;
    loop {
        let n = stderr.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        for record in parser.feed(&buf[..n]).expect("records") {
            let parsed = parse_fs_record(&record).expect("known");
            if matches!(parsed, FsRecord::Canon(_)) && !answered {
                answered = true;
                let mut input = stdin.take().expect("stdin");
                input.write_all(answer).await.expect("answer");
                // Dropping the pipe is what the helper sees as EOF.
                drop(input);
            }
            out.push(parsed);
        }
    }
    child.wait().await.expect("wait");
    out
}

#[tokio::test]
async fn interactive_writes_are_atomic_and_keep_the_mode() {
    for shell in shells() {
        let fx = fixture();
        let r = &fx.root;
        std::fs::set_permissions(r.join("a.txt"), std::fs::Permissions::from_mode(0o751))
            .expect("chmod");
        let mut answer = go_line(7);
        answer.extend_from_slice(b"new\0abc");
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("in-link")), &answer).await;
        assert_eq!(
            recs,
            vec![FsRecord::Canon(r.join("a.txt")), FsRecord::Ok],
            "{shell:?}"
        );
        assert_eq!(std::fs::read(r.join("a.txt")).expect("read"), b"new\0abc");
        assert_eq!(
            std::fs::metadata(r.join("a.txt"))
                .expect("stat")
                .permissions()
                .mode()
                & 0o7777,
            0o751
        );

        // Input shorter than announced (a dropped connection): nothing changes.
        let mut short = go_line(100);
        short.extend_from_slice(b"partial");
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("a.txt")), &short).await;
        assert_eq!(
            recs,
            vec![
                FsRecord::Canon(r.join("a.txt")),
                err(
                    "io",
                    &r.join("a.txt"),
                    "input ended after 7 of 100 bytes; the file was not changed"
                ),
            ]
        );
        assert_eq!(std::fs::read(r.join("a.txt")).expect("read"), b"new\0abc");
        // A refused write touches nothing.
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("fresh")), b"stop\n").await;
        assert_eq!(recs, vec![FsRecord::Canon(r.join("fresh"))]);
        assert!(!r.join("fresh").exists());
        let leftovers: Vec<_> = std::fs::read_dir(r)
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name();
                cordon_ops::leftovers::is_write_temp_name(name.as_encoded_bytes())
                    || name.to_string_lossy().contains("cordon-tmp")
            })
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        let mut answer = go_line(2);
        answer.extend_from_slice(b"hi");
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("dir/new.txt")), &answer).await;
        assert_eq!(
            recs,
            vec![FsRecord::Canon(r.join("dir/new.txt")), FsRecord::Ok]
        );
        assert_eq!(std::fs::read(r.join("dir/new.txt")).expect("read"), b"hi");
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("nodir/x")), &go_line(0)).await;
        assert_eq!(
            recs,
            vec![
                FsRecord::Canon(r.join("nodir/x")),
                err("notfound", &r.join("nodir/x"), "no such file or directory")
            ]
        );
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("dir")), &go_line(0)).await;
        assert_eq!(
            recs,
            vec![
                FsRecord::Canon(r.join("dir")),
                err("isdir", &r.join("dir"), "is a directory")
            ]
        );
        let recs = interactive(&shell, &fx, FileOp::Write(r.join("out-link")), b"").await;
        assert_eq!(
            recs,
            vec![err(
                "outside",
                &r.join("out-link"),
                "outside the allowed roots"
            )]
        );

        let recs = interactive(&shell, &fx, FileOp::Mkdir(r.join("dir-link/m/n")), b"go\n").await;
        assert_eq!(recs, vec![FsRecord::Canon(r.join("dir/m/n")), FsRecord::Ok]);
        assert!(r.join("dir/m/n").is_dir());
    }
}

#[tokio::test]
async fn spill_files_are_created_exclusively_and_appended() {
    for shell in shells() {
        let fx = fixture();
        let argv = files_argv(
            &[],
            &FileOp::Spill {
                dir: fx.spill.clone(),
                name: "cordon-bash-1.log".to_owned(),
            },
        )
        .expect("argv");
        let (_, stderr) = run(&shell, &argv, b"all the output\n").await;
        assert_eq!(
            stderr,
            format!(
                "canon\0{}\0ok\0",
                fx.spill.join("cordon-bash-1.log").display()
            )
            .into_bytes()
        );
        assert_eq!(
            std::fs::read(fx.spill.join("cordon-bash-1.log")).expect("read"),
            b"all the output\n"
        );
        assert_eq!(
            std::fs::metadata(fx.spill.join("cordon-bash-1.log"))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        // The same name again is refused (exclusive creation).
        let (_, stderr) = run(&shell, &argv, b"x").await;
        assert!(
            stderr.starts_with(b"err\0"),
            "{shell:?}: {}",
            String::from_utf8_lossy(&stderr)
        );
        assert_eq!(
            std::fs::read(fx.spill.join("cordon-bash-1.log")).expect("read"),
            b"all the output\n"
        );
    }
}

#[tokio::test]
async fn run_stops_its_command_when_the_client_stops_reading() {
    use tokio::io::AsyncReadExt;
    for shell in shells() {
        let fx = fixture();
        let marker = format!("cordon-run-{:016x}", fastrand_u64());
        let op = FileOp::Run {
            path: fx.root.clone(),
            argv: vec!["sh".into(), "-c".into(), format!("exec yes {marker}")],
        };
        let argv = files_argv(std::slice::from_ref(&fx.root), &op).expect("argv");
        let mut child = spawn(&shell, &argv, Path::new("/"));
        let mut stdout = child.stdout.take().expect("stdout");
        let mut buf = vec![0u8; 4096];
        stdout.read_exact(&mut buf).await.expect("output flows");
        assert!(String::from_utf8_lossy(&buf).contains(&marker));
        drop(child.stdin.take());
        drop(stdout);
        let status = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait())
            .await
            .expect("helper ends")
            .expect("wait");
        assert!(status.success(), "{shell:?}");
        let alive = std::process::Command::new("pgrep")
            .args(["-f", &marker])
            .output()
            .expect("pgrep");
        assert_eq!(
            String::from_utf8_lossy(&alive.stdout),
            "",
            "{shell:?}: the command survived"
        );
    }
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}
