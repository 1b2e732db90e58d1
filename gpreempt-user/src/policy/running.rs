//! The running controller's policy, for explaining its classes (`policy explain`, `queues`,
//! `top`): the file its status names, read and parsed again here.

use std::{collections::BTreeMap, path::Path};

use super::{read_policy_file, Policy};

/// A running controller's policy, and the classes it published.
#[derive(Debug)]
pub struct Running {
    pub policy: Policy,
    pub controller_pid: u32,
    /// The class it gave each pid (its status file).
    pub classes: BTreeMap<u32, String>,
}

/// The policy of the controller whose status is in `run_dir`, under the name it gave the file
/// (its messages and audit records name rules so); the error says why not and what to do.
pub fn running(run_dir: &Path) -> Result<Running, String> {
    let hint = "name a policy file with --policy FILE";
    let Some(st) = crate::observe::status::read_status(run_dir) else {
        return Err(format!(
            "no controller is running (no status in {}); {hint}",
            run_dir.display()
        ));
    };
    let Some(source) = st.policy else {
        return Err(format!(
            "the running controller (pid {}, `{}`) has no policy file; {hint}",
            st.controller_pid, st.mode
        ));
    };
    let mut path = Path::new(&source).to_path_buf();
    if path.is_relative() {
        // Named relative to the controller's working directory.
        let cwd = format!("/proc/{}/cwd", st.controller_pid);
        match std::fs::read_link(&cwd) {
            Ok(dir) => path = dir.join(path),
            Err(e) => {
                return Err(format!(
                    "the running controller's policy {source:?} is relative to its working \
                     directory, which cannot be read here ({cwd}: {e}); run as root, or {hint}"
                ))
            }
        }
    }
    let text = read_policy_file(&path)
        .map_err(|e| format!("the running controller's policy: {e:#}; {hint}"))?;
    let mut policy = Policy::parse(&text, &source).map_err(|e| {
        format!(
            "the running controller's policy {} no longer parses (it runs the version it \
             loaded): {e}; {hint}",
            path.display()
        )
    })?;
    policy.bind_pids(Path::new("/proc"));
    Ok(Running {
        policy,
        controller_pid: st.controller_pid,
        classes: st.classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::daemon::{write_status, Lock, Status};

    /// The policy of the controller that holds the lock, named as it names it (a relative name
    /// from its working directory); no controller, or one without a policy file: why, and what
    /// to do.
    #[test]
    fn the_running_controllers_policy_is_found_by_its_status() {
        let d = std::env::temp_dir().join(format!("gp-running-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let e = running(&d).unwrap_err();
        assert!(
            e.starts_with("no controller is running") && e.ends_with("--policy FILE"),
            "{e}"
        );
        let lock = Lock::acquire(&d).unwrap();
        let status = |policy: Option<String>| Status {
            controller_pid: std::process::id(),
            mode: "top".into(),
            policy,
            classes: [(7, "offline".to_string())].into(),
            ..Default::default()
        };
        write_status(&d, &status(None)).unwrap();
        let e = running(&d).unwrap_err();
        assert!(e.contains("`top`) has no policy file"), "{e}");
        // Relative to the controller's (here: this process's) working directory.
        let file = d.join("p.toml");
        std::fs::write(&file, "[[rule]]\nclass = \"offline\"\nuid = 7\n").unwrap();
        let cwd = std::env::current_dir().unwrap();
        let rel: std::path::PathBuf = cwd
            .components()
            .map(|_| "..")
            .collect::<std::path::PathBuf>()
            .join(file.strip_prefix("/").unwrap());
        write_status(&d, &status(Some(rel.display().to_string()))).unwrap();
        let r = running(&d).unwrap();
        assert_eq!(r.policy.source, rel.display().to_string());
        assert_eq!(r.policy.rule_line(0), Some(format!("{}:1", rel.display())));
        assert_eq!(r.classes[&7], "offline");
        // A file that no longer parses: said, with what to do.
        std::fs::write(&file, "[[rule]]\nclass = \"sometimes\"\nuid = 7\n").unwrap();
        let e = running(&d).unwrap_err();
        assert!(e.contains("no longer parses"), "{e}");
        drop(lock);
        let _ = std::fs::remove_dir_all(&d);
    }
}
