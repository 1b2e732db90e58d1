//! Unit tests of the policy file's reader and line numbering (the parser's messages are tested
//! through `Policy::parse` in policy/tests.rs).

use super::*;

#[test]
fn line_numbers_by_search_match_counting() {
    let text = "a\n\nbc\nd\n\n\nef";
    let p = Parser::new(text);
    for off in 0..=text.len() + 3 {
        let end = off.min(text.len());
        let want = text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        assert_eq!(p.line(off), want, "offset {off}");
    }
}

#[test]
fn only_regular_files_of_bounded_size_are_read() {
    let dir = std::env::temp_dir().join(format!("gpreempt-policy-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A FIFO with no writer: opening it blocking would hang.
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let e = read_policy_file(&fifo).unwrap_err().to_string();
    assert!(e.ends_with("is a FIFO: give a regular file"), "{e}");
    let e = read_policy_file(Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is a device"), "{e}");
    let e = read_policy_file(&dir).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    let big = dir.join("big.toml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(MAX_POLICY_BYTES + 1).unwrap();
    let e = read_policy_file(&big).unwrap_err().to_string();
    assert!(e.contains("larger than the 1 MiB"), "{e}");
    let ok = dir.join("ok.toml");
    std::fs::write(&ok, "[policy]\n").unwrap();
    assert_eq!(read_policy_file(&ok).unwrap(), "[policy]\n");
    std::fs::remove_dir_all(&dir).unwrap();
}
