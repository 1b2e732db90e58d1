use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use super::*;

/// A scratch directory (0755 whatever the umask) removed on drop.
pub(crate) struct Scratch(pub PathBuf);

impl Scratch {
    pub(crate) fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("gp-rundir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(p)
    }
    pub(crate) fn run(&self) -> PathBuf {
        self.0.join("run")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn the_directory_is_created_0755_whatever_the_umask() {
    let s = Scratch::new("umask");
    // SAFETY: umask has no preconditions; restored at once (other tests' scratch files only get
    // more open meanwhile).
    let old = unsafe { libc::umask(0) };
    let r = prepare(&s.run());
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    r.unwrap();
    assert_eq!(mode(&s.run()), 0o755);
    // SAFETY: as above.
    let old = unsafe { libc::umask(0o077) };
    let _ = std::fs::remove_dir(s.run());
    let r = prepare(&s.run());
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    r.unwrap();
    assert_eq!(mode(&s.run()), 0o755, "readable by top and queues");
}

#[test]
fn an_open_directory_is_refused_and_left_as_it_is() {
    let s = Scratch::new("open");
    std::fs::create_dir(s.run()).unwrap();
    std::fs::set_permissions(s.run(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = format!("{:#}", prepare(&s.run()).unwrap_err());
    assert!(e.contains("mode 0777 (group/other writable)"), "{e}");
    assert!(e.contains(&s.run().display().to_string()), "{e}");
    assert_eq!(mode(&s.run()), 0o777, "not silently changed");
    std::fs::set_permissions(s.run(), std::fs::Permissions::from_mode(0o775)).unwrap();
    assert!(prepare(&s.run()).is_err(), "group writable too");
    std::fs::set_permissions(s.run(), std::fs::Permissions::from_mode(0o700)).unwrap();
    prepare(&s.run()).unwrap();
}

#[test]
fn a_linked_directory_or_an_open_parent_is_refused() {
    let s = Scratch::new("link");
    let elsewhere = s.0.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, s.run()).unwrap();
    let e = format!("{:#}", prepare(&s.run()).unwrap_err());
    assert!(e.contains("symbolic link"), "{e}");

    let open = s.0.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = format!("{:#}", prepare(&open.join("run")).unwrap_err());
    assert!(e.contains("other than root can replace"), "{e}");
    // Sticky (like /tmp): others cannot rename what is ours.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    prepare(&open.join("run")).unwrap();
}

#[test]
fn a_directory_of_another_user_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (only root can give a directory away)"
    );
    let s = Scratch::new("owner");
    std::fs::create_dir(s.run()).unwrap();
    std::os::unix::fs::chown(s.run(), Some(65534), Some(65534)).unwrap();
    let e = format!("{:#}", prepare(&s.run()).unwrap_err());
    assert!(e.contains("owned by uid 65534"), "{e}");
}

#[test]
fn a_planted_tmp_link_is_not_followed() {
    let s = Scratch::new("tmplink");
    prepare(&s.run()).unwrap();
    let victim = s.0.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, s.run().join("status.tmp")).unwrap();
    write_atomic(&s.run().join("status.json"), b"{}", PUBLIC_MODE).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(
        std::fs::read_to_string(s.run().join("status.json")).unwrap(),
        "{}"
    );
    assert_eq!(mode(&s.run().join("status.json")), 0o644);
    assert!(!s.run().join("status.tmp").exists());
}

#[test]
fn files_get_fixed_modes_and_links_are_refused() {
    let s = Scratch::new("modes");
    prepare(&s.run()).unwrap();
    // SAFETY: umask has no preconditions; restored at once.
    let old = unsafe { libc::umask(0) };
    let r = write_targets(&s.run(), &[]);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    r.unwrap();
    assert_eq!(mode(&s.run().join("targets.json")), 0o600);

    let victim = s.0.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = s.run().join("some.lock");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let e = format!("{:#}", open_private(&link, PRIVATE_MODE).unwrap_err());
    assert!(e.contains("symbolic link"), "{e}");
    assert!(open_read(&link).is_err());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

/// Not only the parent: a writable directory further up could rename the parent away.
#[test]
fn every_directory_above_is_checked() {
    let s = Scratch::new("ancestors");
    let open = s.0.join("open");
    std::fs::create_dir_all(open.join("deep")).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(open.join("deep"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = format!("{:#}", prepare(&open.join("deep/run")).unwrap_err());
    assert!(
        e.contains(&format!(
            "refusing {}: a user other than root",
            open.display()
        )),
        "{e}"
    );
    assert!(!open.join("deep/run").exists(), "nothing created under it");
    let e = format!("{:#}", prepare(&open.join("new/run")).unwrap_err());
    assert!(e.contains(&format!("refusing {}:", open.display())), "{e}");
    assert!(
        !open.join("new").exists(),
        "no missing parent created under it"
    );

    // Through a link: the directories it leads to are checked too.
    let link = s.0.join("link");
    std::os::unix::fs::symlink(open.join("deep"), &link).unwrap();
    let e = format!("{:#}", prepare(&link.join("run")).unwrap_err());
    assert!(e.contains(&format!("refusing {}:", open.display())), "{e}");

    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    prepare(&open.join("deep/run")).unwrap();
}

/// Missing directories above the run directory are created 0755 whatever the umask (they were
/// created with the umask's mode, and then refused as group/other writable under umask 0).
#[test]
fn missing_parents_get_fixed_modes() {
    let s = Scratch::new("parents");
    for umask in [0, 0o077] {
        let _ = std::fs::remove_dir_all(s.0.join("a"));
        // SAFETY: umask has no preconditions; restored at once.
        let old = unsafe { libc::umask(umask) };
        let r = prepare(&s.0.join("a/b/run"));
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r.unwrap();
        for d in ["a", "a/b", "a/b/run"] {
            assert_eq!(mode(&s.0.join(d)), 0o755, "{d}, umask {umask:o}");
        }
    }
}
