use super::*;

fn disk(dir: &Path) -> StageDisk {
    StageDisk::new(Place { rank: 3, host: "n3".into(), session: Some(dir.join("session")) })
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dvm-stage-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Read every segment of `src` at the origin and hand it to the sink, as the node would.
fn copy(
    origin: &mut StageDisk,
    sink: &mut StageDisk,
    id: u64,
    src: &Path,
    dest: &str,
    seg: u64,
    compress: bool,
) -> Result<bool, String> {
    let sf = check_source(src.to_str().unwrap(), dest)?;
    let files = vec![StageDest { path: dest.into(), size: sf.size, mode: sf.mode }];
    if let Some(StageDone::Sink { result: Err(e), .. }) = sink.apply(StageIo::Open { id, files, uid: 0 }) {
        return Err(e);
    }
    let mut done = false;
    for (offset, len, last) in dvm_core::stage::segments(sf.size, seg) {
        let io = StageIo::Read { id, file: 0, path: sf.src.clone(), offset, len, last, compress };
        let Some(StageDone::Read { result, .. }) = origin.apply(io) else { panic!("no read answer") };
        let Some(StageDone::Sink { result, .. }) = sink.apply(StageIo::Write { id, seg: result? }) else { panic!() };
        done = result?;
    }
    Ok(done)
}

#[test]
fn a_file_is_unnamed_until_commit_then_whole_with_its_mode_and_discard_removes_it() {
    let d = scratch("roundtrip");
    let src = d.join("src.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o751)).unwrap();
    let (mut o, mut s) = (disk(&d), disk(&d));
    for compress in [false, true] {
        let dest = format!("{}/out/%h-%n/file", d.display());
        assert_eq!(copy(&mut o, &mut s, 1, &src, &dest, 65536, compress), Ok(true));
        let named = d.join("out/n3-3/file");
        assert!(!named.exists(), "nothing is named before the commit");
        assert_eq!(s.apply(StageIo::Commit { id: 1 }), Some(StageDone::Sink { id: 1, result: Ok(true) }));
        assert_eq!(std::fs::read(&named).unwrap(), data);
        assert_eq!(std::fs::metadata(&named).unwrap().mode() & 0o7777, 0o751);
        assert!(s.apply(StageIo::Discard { id: 1 }).is_none());
        assert!(!named.exists(), "discard removes what was named");
        let left: Vec<_> = std::fs::read_dir(d.join("out/n3-3")).unwrap().collect();
        assert!(left.is_empty(), "no temporary is left: {left:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_corrupt_segment_is_refused_and_the_error_names_the_node_and_path() {
    let d = scratch("corrupt");
    let src = d.join("src");
    std::fs::write(&src, vec![1u8; 1000]).unwrap();
    let (mut o, mut s) = (disk(&d), disk(&d));
    let dest = format!("{}/dst", d.display());
    let files = vec![StageDest { path: dest.clone(), size: 1000, mode: 0o644 }];
    s.apply(StageIo::Open { id: 2, files, uid: 0 });
    let io = StageIo::Read {
        id: 2,
        file: 0,
        path: src.to_str().unwrap().into(),
        offset: 0,
        len: 1000,
        last: true,
        compress: false,
    };
    let Some(StageDone::Read { result: Ok(mut seg), .. }) = o.apply(io) else { panic!() };
    let mut bad = seg.data.to_vec();
    bad[10] ^= 1;
    seg.data = Bytes::from(bad);
    let Some(StageDone::Sink { result: Err(e), .. }) = s.apply(StageIo::Write { id: 2, seg }) else { panic!() };
    assert!(e.contains(&dest) && e.contains("corrupt"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_sources_and_destinations_get_one_sentence_each() {
    let d = scratch("bad");
    let e = check_source("/nonexistent/x", "/tmp/x").unwrap_err();
    assert!(e.contains("/nonexistent/x") && e.contains("no such file"), "{e}");
    let e = check_source(d.to_str().unwrap(), "/tmp/x").unwrap_err();
    assert!(e.contains("is a directory"), "{e}");
    assert!(check_source("rel/x", "/tmp/x").unwrap_err().contains("absolute"));
    let mut s = disk(&d);
    let open = |s: &mut StageDisk, path: String| match s.apply(StageIo::Open {
        id: 9,
        files: vec![StageDest { path, size: 1, mode: 0o644 }],
        uid: 0,
    }) {
        Some(StageDone::Sink { result, .. }) => result,
        other => panic!("{other:?}"),
    };
    assert!(open(&mut s, "relative/x".into()).unwrap_err().contains("absolute"));
    assert!(open(&mut s, format!("{}/%q", d.display())).unwrap_err().contains("unknown '%q'"));
    assert!(open(&mut s, d.display().to_string()).unwrap_err().contains("is a directory"));
    let e = open(&mut s, "/proc/dvm-no/x".into()).unwrap_err();
    assert!(e.contains("cannot create /proc/dvm-no"), "{e}");
    // Another user may not write into a directory only the daemon's user may.
    std::fs::create_dir_all(d.join("private")).unwrap();
    std::fs::set_permissions(d.join("private"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let files = vec![StageDest { path: format!("{}/private/x", d.display()), size: 1, mode: 0o644 }];
    let other = nix::unistd::geteuid().as_raw() + 4242;
    let Some(StageDone::Sink { result: Err(e), .. }) = s.apply(StageIo::Open { id: 10, files, uid: other }) else {
        panic!()
    };
    assert!(e.contains(&format!("user {other} may not write")), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
