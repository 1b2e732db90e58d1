//! Kubernetes attribution on the node: the pod and container a process runs in, from what the
//! node itself keeps, without the API server or the container runtime's socket.
//!
//! - The pod uid comes from the process's cgroup path. kubelet puts every pod under the
//!   `kubepods` hierarchy: `/kubepods/<qos>/pod<uid>/<container>` with the cgroupfs driver,
//!   `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/...` with the
//!   systemd driver. Only paths that start there count: a user with a delegated cgroup can name
//!   a cgroup `pod<uid>` anywhere, but not create one under the root's kubepods hierarchy.
//! - Namespace, pod and container names come from kubelet's log symlinks,
//!   `/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`, made for every
//!   container whatever the runtime, matched by the container id in the cgroup path; a pod
//!   whose containers have no link yet is named from `/var/log/pods/<namespace>_<pod>_<uid>`.
//!   Pod, namespace and container names are DNS labels / subdomains: no `_`, so the split is
//!   unambiguous. Both directories are root's (kubelet's).
//!
//! Why not the CRI: its socket differs per runtime (containerd, CRI-O) and speaks gRPC; the log
//! names are kubelet's own and readable wherever the controller runs (a DaemonSet mounts
//! /var/log). Pod labels live only in the API server: rules match namespace and pod name.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Serialize;

/// Where a process runs in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pod {
    pub uid: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub container: Option<String>,
}

/// The pod uid in a cgroup path (the `0::` path), when it is under the root's `kubepods`
/// hierarchy.
pub fn pod_uid(cgroup_path: &str) -> Option<String> {
    let mut comps = cgroup_path.trim_start_matches('/').split('/');
    if !matches!(comps.next(), Some("kubepods" | "kubepods.slice")) {
        return None;
    }
    let mut found = None;
    for comp in comps {
        let base = comp.strip_suffix(".slice").unwrap_or(comp);
        // `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>` (systemd).
        let Some(at) = base.rfind("pod") else {
            continue;
        };
        if at > 0 && !base[..at].ends_with('-') {
            continue;
        }
        let uid = base[at + 3..].replace('_', "-");
        if is_uid(&uid) {
            found = Some(uid.to_ascii_lowercase());
        }
    }
    found
}

/// A pod's Kubernetes QoS class, as the API spells it (`status.qosClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Qos {
    BestEffort,
    Burstable,
    Guaranteed,
}

impl Qos {
    pub const ALL: [Self; 3] = [Self::BestEffort, Self::Burstable, Self::Guaranteed];

    /// As Kubernetes spells it.
    pub fn label(self) -> &'static str {
        match self {
            Self::BestEffort => "BestEffort",
            Self::Burstable => "Burstable",
            Self::Guaranteed => "Guaranteed",
        }
    }

    /// Exactly as Kubernetes spells it (a policy names it so).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.label() == s)
    }
}

impl std::fmt::Display for Qos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// The QoS class of a pod's process, from its cgroup path. kubelet makes one parent cgroup
/// per class below `kubepods` for Burstable and BestEffort pods (the class in lower case) and
/// puts Guaranteed pods directly under `kubepods` (qos_container_manager_linux.go); the systemd
/// driver spells each level as a slice named by its ancestors (`kubepods-besteffort.slice`,
/// cgroup_manager_linux.go's `ToSystemd`). None outside a pod: the same trust as [`pod_uid`]
/// (only the root's `kubepods` hierarchy counts).
pub fn qos_class(cgroup_path: &str) -> Option<Qos> {
    pod_uid(cgroup_path)?;
    let mut comps = cgroup_path.trim_start_matches('/').split('/');
    let systemd = comps.next()? == "kubepods.slice";
    let level = comps.next()?;
    let class = if systemd {
        level
            .strip_prefix("kubepods-")
            .and_then(|l| l.strip_suffix(".slice"))?
    } else {
        level
    };
    Some(match class {
        "besteffort" => Qos::BestEffort,
        "burstable" => Qos::Burstable,
        // The pod's own cgroup right below kubepods.
        c if c.starts_with("pod") => Qos::Guaranteed,
        _ => return None,
    })
}

/// A pod uid: 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// kubelet's log names on this node.
#[derive(Clone, Debug, Default)]
pub struct PodIndex {
    /// Container id (first 12 hex chars) -> (namespace, pod, container).
    containers: HashMap<String, (String, String, String)>,
    /// Pod uid -> (namespace, pod).
    pods: HashMap<String, (String, String)>,
}

impl PodIndex {
    /// Reads `<log_root>/containers` and `<log_root>/pods` (missing directories: empty).
    pub fn read(log_root: &Path) -> Self {
        let mut ix = Self::default();
        for name in dir_names(&log_root.join("containers")) {
            // <pod>_<namespace>_<container>-<id>.log
            let Some(stem) = name.strip_suffix(".log") else {
                continue;
            };
            let mut it = stem.splitn(3, '_');
            let (Some(pod), Some(ns), Some(rest)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Some((container, id)) = rest.rsplit_once('-') else {
                continue;
            };
            if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                ix.containers.insert(
                    id[..12].to_ascii_lowercase(),
                    (ns.to_string(), pod.to_string(), container.to_string()),
                );
            }
        }
        for name in dir_names(&log_root.join("pods")) {
            // <namespace>_<pod>_<uid>
            let mut it = name.splitn(3, '_');
            if let (Some(ns), Some(pod), Some(uid)) = (it.next(), it.next(), it.next()) {
                if is_uid(uid) {
                    ix.pods
                        .insert(uid.to_ascii_lowercase(), (ns.to_string(), pod.to_string()));
                }
            }
        }
        ix
    }

    /// The pod of a process in `cgroup_path` with container id `container` (12 hex chars).
    /// None outside Kubernetes; names stay None when kubelet's logs do not name them (yet).
    pub fn attribute(&self, cgroup_path: &str, container: Option<&str>) -> Option<Pod> {
        let uid = pod_uid(cgroup_path)?;
        let mut pod = Pod {
            uid,
            ..Pod::default()
        };
        if let Some((ns, name, c)) = container.and_then(|c| self.containers.get(c)) {
            (pod.namespace, pod.name, pod.container) =
                (Some(ns.clone()), Some(name.clone()), Some(c.clone()));
        } else if let Some((ns, name)) = self.pods.get(&pod.uid) {
            (pod.namespace, pod.name) = (Some(ns.clone()), Some(name.clone()));
        }
        Some(pod)
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// kubelet's log root: /var/log, or `GPREEMPT_K8S_LOG_ROOT` (a DaemonSet mounting the node's
/// /var/log elsewhere; tests).
pub fn log_root() -> PathBuf {
    std::env::var_os("GPREEMPT_K8S_LOG_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/log"))
}

/// The index, read again when asked about a pod it does not know (a new pod), at most every
/// [`Cache::REFRESH`].
#[derive(Debug)]
pub struct Cache {
    root: PathBuf,
    index: PodIndex,
    read_at: Option<Instant>,
}

impl Cache {
    pub const REFRESH: Duration = Duration::from_secs(2);

    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            index: PodIndex::default(),
            read_at: None,
        }
    }

    pub fn attribute(&mut self, cgroup_path: &str, container: Option<&str>) -> Option<Pod> {
        let pod = self.index.attribute(cgroup_path, container)?;
        let named = if container.is_some() {
            pod.container.is_some()
        } else {
            pod.name.is_some()
        };
        if named || self.read_at.is_some_and(|t| t.elapsed() < Self::REFRESH) {
            return Some(pod);
        }
        self.index = PodIndex::read(&self.root);
        self.read_at = Some(Instant::now());
        self.index.attribute(cgroup_path, container)
    }
}

/// The pod of a process (its `cgroup` path and container id), through one cache per process
/// of the tool. Cheap outside Kubernetes: no cgroup under `kubepods`, no file read.
pub fn attribute(cgroup_path: &str, container: Option<&str>) -> Option<Pod> {
    pod_uid(cgroup_path)?;
    static CACHE: std::sync::OnceLock<std::sync::Mutex<Cache>> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(|| std::sync::Mutex::new(Cache::new(log_root())));
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    c.attribute(cgroup_path, container)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1a2b3c4d-5e6f-7a8b-9c0d-112233445566";
    const ID: &str = "4f1c8a2b9d3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a";

    #[test]
    fn the_pod_uid_comes_from_either_cgroup_driver() {
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&systemd).as_deref(), Some(UID));
        let guaranteed = format!(
            "/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&guaranteed).as_deref(), Some(UID));
        let cgroupfs = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(pod_uid(&cgroupfs).as_deref(), Some(UID));
    }

    #[test]
    fn the_qos_class_comes_from_either_cgroup_driver() {
        let u = UID.replace('-', "_");
        for (path, want) in [
            // systemd driver, containerd and CRI-O leaves.
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/\
                     cri-containerd-{ID}.scope"
                ),
                Some(Qos::BestEffort),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/\
                     crio-{ID}.scope"
                ),
                Some(Qos::Burstable),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope"),
                Some(Qos::Guaranteed),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{ID}.scope"),
                Some(Qos::Guaranteed),
            ),
            // cgroupfs driver.
            (
                format!("/kubepods/besteffort/pod{UID}/{ID}"),
                Some(Qos::BestEffort),
            ),
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                Some(Qos::Burstable),
            ),
            (format!("/kubepods/pod{UID}/{ID}"), Some(Qos::Guaranteed)),
            // No pod: the QoS parents themselves, other hierarchies, a look-alike.
            ("/kubepods.slice/kubepods-besteffort.slice".into(), None),
            ("/kubepods/burstable".into(), None),
            (
                format!("/user.slice/kubepods-besteffort-pod{u}.slice"),
                None,
            ),
            (format!("/system.slice/kubepods/besteffort/pod{UID}"), None),
            (format!("/kubepods/other/pod{UID}/{ID}"), None),
        ] {
            assert_eq!(qos_class(&path), want, "{path}");
        }
    }

    #[test]
    fn qos_names_are_kubernetes_spelling_only() {
        for q in Qos::ALL {
            assert_eq!(Qos::parse(q.label()), Some(q));
        }
        assert_eq!(Qos::parse("besteffort"), None);
        assert_eq!(Qos::parse("Best-Effort"), None);
    }

    #[test]
    fn a_pod_named_cgroup_outside_kubepods_is_no_pod() {
        // A delegated user cgroup can be named anything.
        let spoof = format!(
            "/user.slice/user-1000.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid(&spoof), None);
        assert_eq!(pod_uid(&format!("/system.slice/pod{UID}")), None);
        assert_eq!(pod_uid("/kubepods.slice/kubepods-besteffort.slice"), None);
        assert_eq!(pod_uid("/kubepods/podnot-a-uid"), None);
        assert_eq!(pod_uid(""), None);
    }

    fn tree() -> (PathBuf, PodIndex) {
        let root = std::env::temp_dir().join(format!("gpreempt-k8s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("containers")).unwrap();
        std::fs::create_dir_all(root.join(format!("pods/ml_trainer-0_{UID}/worker"))).unwrap();
        std::fs::create_dir_all(
            root.join("pods/other_web-7f9c_99999999-0000-0000-0000-000000000000"),
        )
        .unwrap();
        for name in [
            format!("trainer-0_ml_worker-{ID}.log"),
            "garbage.log".to_string(),
            "a_b_c-tooshort.log".to_string(),
        ] {
            std::fs::write(root.join("containers").join(name), b"").unwrap();
        }
        let ix = PodIndex::read(&root);
        (root, ix)
    }

    #[test]
    fn names_come_from_kubelets_log_links() {
        let (root, ix) = tree();
        let cg = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(
            ix.attribute(&cg, Some(&ID[..12])),
            Some(Pod {
                uid: UID.into(),
                namespace: Some("ml".into()),
                name: Some("trainer-0".into()),
                container: Some("worker".into()),
            })
        );
        // No link for this container (yet): the pod's directory names the pod.
        let other = ix.attribute(&cg, Some("0123456789ab")).unwrap();
        assert_eq!(
            (
                other.namespace.as_deref(),
                other.name.as_deref(),
                other.container
            ),
            (Some("ml"), Some("trainer-0"), None)
        );
        // A pod kubelet has no logs for: the uid only.
        let unknown = ix
            .attribute("/kubepods/pod00000000-1111-2222-3333-444444444444/x", None)
            .unwrap();
        assert_eq!((unknown.name, unknown.namespace), (None, None));
        // Not in Kubernetes.
        assert_eq!(
            ix.attribute("/system.slice/docker-x.scope", Some(&ID[..12])),
            None
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_cache_rereads_for_a_new_pod() {
        let (root, _) = tree();
        let mut c = Cache::new(root.clone());
        let cg = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(
            c.attribute(&cg, Some(&ID[..12]))
                .unwrap()
                .container
                .as_deref(),
            Some("worker")
        );
        // A pod that appears later is found once the refresh interval allows a new read.
        let late = "0badcafe-0000-4000-8000-000000000001";
        std::fs::create_dir_all(root.join(format!("pods/batch_late_{late}"))).unwrap();
        c.read_at = Some(Instant::now() - Cache::REFRESH);
        let p = c
            .attribute(&format!("/kubepods/pod{late}/c"), None)
            .unwrap();
        assert_eq!(p.name.as_deref(), Some("late"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_missing_log_root_is_no_error() {
        let ix = PodIndex::read(Path::new("/nonexistent/gpreempt"));
        assert_eq!(
            ix.attribute(&format!("/kubepods/pod{UID}/{ID}"), None)
                .map(|p| p.uid),
            Some(UID.to_string())
        );
    }
}
