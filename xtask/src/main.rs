//! Project tasks: `cargo xtask <setup|build|test|ci|bench|demo|screenshot|...>`.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod bench;
mod deploy;
mod lanes;
mod package;
mod screenshot;
mod vm;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain into .tools (idempotent).
    Setup,
    /// Build everything (release).
    Build,
    /// Run every test: unit tests and, as root, the kernel tests. This is the README's test command.
    Test {
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// What CI runs: setup, fmt check, clippy (with and without the emulator), then `test` in a
    /// fresh mount namespace (.ci/fresh).
    Ci,
    /// Benchmarks: tracer overhead against no tracer, bpftrace and strace; ring-buffer throughput;
    /// `top`'s CPU and memory with 10,000 queues (`--top-only`: just that).
    Bench(bench::BenchArgs),
    /// The main job: build, then `top` on the emulated GPU with an online and an offline workload.
    Demo,
    /// README's picture of `top`: the demo in a tmux pane for a while, captured with its
    /// colours and drawn as SVG (docs/img/top.svg).
    Screenshot {
        /// How long the demo runs before the capture (s).
        #[arg(long, default_value_t = 20)]
        secs: u64,
    },
    /// Prepare the VM tier (QEMU, virtme-ng, distribution kernels with amdgpu; idempotent).
    VmSetup,
    /// Prepare the packaging test (kubernetes-validate from PyPI, a Debian image base made by
    /// mmdebstrap), the real-ROCm test's Debian 13 root and the unit test's systemd root, all in
    /// .tools; idempotent; `test` runs it.
    DeploySetup,
    /// Build the Debian package (target/debian/gpreempt-ebpf_VERSION_amd64.deb): the binary, the
    /// systemd unit, README, docs/ and example policies, man pages, shell completions.
    Package {
        /// Package the debug build instead of the release build.
        #[arg(long)]
        debug: bool,
    },
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// The feature that builds `gpreempt-ebpf sim` (the emulator) in: every build here but the
/// package's (the tests crate enables it too, so workspace builds agree).
pub const SIM: [&str; 2] = ["--features", "gpreempt-user/sim"];

fn setup() -> Result<()> {
    run(Command::new("bash").arg(root().join("xtask/setup-toolchain.sh")))
}

/// Debian packages the tests use, installed when missing: gcc + linux-libc-dev (the KFD header
/// conformance test), util-linux (setpriv, the non-root test), tmux and procps (the `top`
/// end-to-end test drives it in a tmux pane and signals it with pkill), strace (a tracer that
/// holds a process the controller must refuse, then leaves), python3 (the MI kit's report
/// generator), and for the service
/// test: dpkg-deb, binutils (strip, objdump), systemd (systemd-analyze), Prometheus and promtool;
/// for the unit test: systemd-container (systemd-nspawn boots systemd on a Debian root);
/// for the packaging test: buildah (builds the image, no daemon), mmdebstrap (its Debian base)
/// and python3-pip (installs the manifest validator); rocminfo and hipcc (Debian's ROCm 5.2.3:
/// rocminfo, libhsakmt, ROCr, HIP and its clang-15 compiler; the real-runtime test,
/// tests/rocm.rs, builds a HIP program for gfx90a).
fn test_packages() -> Result<()> {
    ensure_packages(&[
        ("gcc", "/usr/bin/gcc"),
        ("linux-libc-dev", "/usr/include/linux/kfd_ioctl.h"),
        ("util-linux", "/usr/bin/setpriv"),
        ("tmux", "/usr/bin/tmux"),
        ("procps", "/usr/bin/pkill"),
        ("strace", "/usr/bin/strace"),
        ("python3", "/usr/bin/python3"),
        ("dpkg", "/usr/bin/dpkg-deb"),
        ("binutils", "/usr/bin/objdump"),
        ("systemd", "/usr/bin/systemd-analyze"),
        ("logrotate", "/usr/sbin/logrotate"),
        ("systemd-container", "/usr/bin/systemd-nspawn"),
        ("prometheus", "/usr/bin/prometheus"),
        ("buildah", "/usr/bin/buildah"),
        ("mmdebstrap", "/usr/bin/mmdebstrap"),
        ("python3-pip", "/usr/bin/pip3"),
        ("rocminfo", "/usr/bin/rocminfo"),
        ("hipcc", "/usr/bin/hipcc"),
    ])
}

/// Installs the Debian packages (name, a file it provides) whose file is missing.
pub fn ensure_packages(pkgs: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .filter(|(_, f)| !Path::new(f).exists())
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup(),
        Task::Build => {
            setup()?;
            run(cargo().args(["build", "--release", "--bins"]).args(SIM))
        }
        Task::Test { args } => {
            setup()?;
            if !is_root() {
                bail!("the kernel tests load eBPF programs and must run as root: sudo -E cargo xtask test");
            }
            test_packages()?;
            // The VM tests boot distribution kernels with the real amdgpu module.
            vm::setup()?;
            // The packaging test: the manifest validator and the image's Debian base.
            deploy::prepare()?;
            // The service test installs the package of the debug build, without the emulator as
            // a host gets it. First: its build leaves target/debug/gpreempt-ebpf without `sim`,
            // the build below puts the emulator back.
            package::package("debug")?;
            // The kernel tests run the built binaries (gpreempt-ebpf with `sim`, kfd-poke).
            run(cargo().args(["build", "--bins"]).args(SIM))?;
            // Every test binary, in two lanes side by side (lanes.rs says which and why).
            lanes::test(&args)
        }
        Task::Ci => {
            setup()?;
            // Downloads (PyPI, Debian's mirror) while fmt and clippy use the CPU; `test` finds
            // them made. The packages it needs are .ci/run's.
            let prepared = std::thread::spawn(|| deploy::prepare().and_then(|()| vm::setup()));
            run(cargo().args(["fmt", "--all", "--check"]))?;
            // The workspace has the emulator (the tests crate enables `sim`); the binary the
            // package ships is gpreempt-user without it, linted on its own (~10 s more).
            run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
            run(cargo().args([
                "clippy",
                "-p",
                "gpreempt-user",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))?;
            if !is_root() {
                bail!(
                    "CI runs the tests as root in a fresh mount namespace: sudo -E cargo xtask ci"
                );
            }
            prepared.join().map_err(|_| {
                anyhow::anyhow!("preparing the packaging and VM tests' tools panicked")
            })??;
            // As on a freshly booted machine: no tracefs or debugfs mounted, empty /run and
            // /tmp, whatever earlier runs left here.
            run(Command::new(root().join(".ci/fresh")).args(["cargo", "xtask", "test"]))
        }
        Task::Bench(args) => {
            setup()?;
            bench::run(&args)
        }
        Task::VmSetup => {
            if !is_root() {
                bail!("the VM tier installs packages and links /lib/modules: sudo -E cargo xtask vm-setup");
            }
            vm::setup()
        }
        Task::DeploySetup => {
            if !is_root() {
                bail!("mmdebstrap makes the image base as root: sudo -E cargo xtask deploy-setup");
            }
            deploy::prepare()
        }
        Task::Package { debug } => {
            setup()?;
            package::package(if debug { "debug" } else { "release" }).map(|_| ())
        }
        Task::Demo => {
            setup()?;
            run(cargo().args(["build", "--release", "--bins"]).args(SIM))?;
            demo()
        }
        Task::Screenshot { secs } => {
            setup()?;
            run(cargo().args(["build", "--release", "--bins"]).args(SIM))?;
            screenshot::screenshot(
                &root().join("target/release/gpreempt-ebpf"),
                secs,
                &root().join("docs/img/top.svg"),
            )
        }
    }
}

/// The main job on a machine without an AMD GPU: the emulated GPU with the seeds' online and
/// offline workloads, watched live (Ctrl-C ends it and cleans everything up).
fn demo() -> Result<()> {
    let bin = root().join("target/release/gpreempt-ebpf");
    let status = Command::new(&bin)
        .arg("sim")
        .status()
        .with_context(|| format!("running {} sim", bin.display()))?;
    // 130: ended with Ctrl-C, the normal way out.
    if !status.success() && status.code() != Some(130) {
        bail!("demo failed: {status}");
    }
    Ok(())
}
