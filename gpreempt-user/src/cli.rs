//! Command line: `gpreempt-ebpf <command>`: the global options, the command list, logging, and
//! the hand-off to the command's own module in [`crate::cmd`] (each owns its arguments).

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

use crate::cmd::{self, Global};

#[derive(Parser, Debug)]
#[command(
    name = "gpreempt-ebpf",
    version,
    about = "Watch and preempt GPU compute queues with eBPF: AMD (amdkfd) and NVIDIA (RM)",
    long_about = "Watch and preempt GPU compute queues with eBPF: AMD (amdkfd) and NVIDIA (RM).\n\n\
        eBPF programs see every GPU process's driver calls (KFD ioctls on AMD, resource-manager \
        escapes on NVIDIA); `top`, `queues` and `trace` show the host's queues, and `run` makes \
        offline (best-effort) work yield while online work runs, by policy: on AMD it suspends \
        their KFD queues through the debug-trap ioctls, on NVIDIA it shortens their hardware \
        timeslice or pauses their channels. `sim` (in builds with the emulator: the demo's, not the package's) is an emulated \
        AMD GPU to try it all on.",
    after_long_help = DOCS
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the documentation is, for `--help` and the man pages.
const DOCS: &str = "Documentation: README.md and docs/ (policy.md, controller.md, \
    observability.md, nvidia.md, ...) in the source tree; the Debian package installs them in \
    /usr/share/doc/gpreempt-ebpf, with example policies in its examples/. `gpreempt-ebpf \
    doctor` says whether this host is ready.";

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Live view of every GPU compute queue (AMD KFD queues, NVIDIA TSGs and channels):
    /// processes, classes, queues, HQD slots, state, activity.
    Top(cmd::top::Args),
    /// The PID -> queue -> HQD map once, as a table or JSON (AMD: read from sysfs, debugfs and
    /// process memory; loads no eBPF).
    Queues(cmd::queues::Args),
    /// Print GPU driver events live: KFD ioctls (queue create/destroy/update, debug-trap calls),
    /// NVIDIA RM escapes (allocs, frees, controls) and GPU processes' exits.
    Trace(cmd::trace::Args),
    /// Run an emulated AMD GPU (KFD) and commands against it (default: the demo).
    #[cfg_attr(
        not(feature = "sim"),
        command(
            about = "The emulated AMD GPU: not in this build (the packaged binary leaves it \
            out; `cargo xtask demo` in the source tree builds one with it)"
        )
    )]
    Sim(cmd::sim::Args),
    /// The controller: classify processes by a policy and make offline GPU work yield while
    /// online work runs (AMD: KFD queue suspend; NVIDIA: hardware timeslice or channel pause).
    Run(cmd::run::Args),
    /// Suspend a process's queues (held until Ctrl-C, `resume`, --for or --max-suspend; NVIDIA
    /// processes through a running `run`).
    Suspend(cmd::manual::SuspendArgs),
    /// Resume a process's queues.
    Resume(cmd::manual::ResumeArgs),
    /// Is this host ready, and what to change if not.
    Doctor(cmd::doctor::Args),
    /// Policy files: `policy check FILE...` validates them as `run` would (no root, no GPU).
    Policy(cmd::policy::Args),
    /// Resumes NVIDIA channels a dead controller paused (started by the controller).
    #[command(hide = true)]
    NvGuardian(cmd::nv_guardian::Args),
    /// NVIDIA pause/resume cycles of a process started after it (GPU experiment kit).
    #[command(hide = true)]
    NvPauseTest(cmd::nv_pause_test::Args),
    /// KFD suspend/resume cycles of one process, timed (ioctls, quiesce, progress; MI host kit).
    #[command(hide = true)]
    KfdCycles(cmd::kfd_cycles::Args),
    /// A CUDA process of our own that the controller pauses and resumes at start (self-test).
    #[command(hide = true)]
    NvSelftestTarget(cmd::nv_selftest_target::Args),
    /// Man pages or shell completions, from these very definitions (used by `cargo xtask package`).
    #[command(hide = true, subcommand)]
    Generate(Generate),
}

#[derive(Subcommand, Debug)]
pub enum Generate {
    /// One man page per command into DIR (gpreempt-ebpf.1, gpreempt-ebpf-run.1, ...).
    Man { dir: std::path::PathBuf },
    /// The completion script for SHELL on stdout.
    Completions { shell: clap_complete::Shell },
}

/// One page for `cmd` (named `name`) and one per visible subcommand, nested ones included
/// (`gpreempt-ebpf-policy-check`), each named by its path.
fn man_pages(cmd: &clap::Command, name: &str, out: &mut Vec<(String, clap::Command)>) {
    out.push((name.to_string(), cmd.clone().name(name.to_string())));
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        man_pages(sub, &format!("{name}-{}", sub.get_name()), out);
    }
}

/// What every page ends with (roff), past clap's sections: EXIT STATUS and ENVIRONMENT on
/// all, EXAMPLES and FILES on the main page, SEE ALSO on the others.
fn man_sections(name: &str) -> String {
    let mut s = String::from(
        ".SH \"EXIT STATUS\"\n\
         .TP\n0\nsuccess (\\fBdoctor\\fR: no check failed; \\fBsim\\fR: the command it ran exited 0)\n\
         .TP\n1\nan error, said in one line on stderr (\\fBdoctor\\fR: a check failed; \\fBpolicy \
         check\\fR: the policy is invalid; \\fBsuspend\\fR/\\fBresume\\fR: a queue was not acted on)\n\
         .TP\n2\nthe command line is wrong (unknown option, missing argument)\n\
         .TP\n130\n\\fBsim\\fR: its command ended by Ctrl-C (\\fBsim\\fR exits as its command did)\n\
         .SH ENVIRONMENT\n\
         .TP\nRUST_LOG\nlog filter over \\fB-v\\fR, e.g. \\fBgpreempt_user::backend=debug\\fR\n\
         .TP\nNO_COLOR\nnot empty: no colour in log lines or \\fBtop\\fR\n\
         .TP\nGPREEMPT_RUN_DIR\nthe run directory (default /run/gpreempt-ebpf)\n",
    );
    if name == "gpreempt-ebpf" {
        s.push_str(
            ".SH EXAMPLES\n\
             .nf\n\
             sudo gpreempt-ebpf doctor\n\
             sudo gpreempt-ebpf top\n\
             gpreempt-ebpf policy check /etc/gpreempt-ebpf/policy.toml\n\
             sudo gpreempt-ebpf run --policy /etc/gpreempt-ebpf/policy.toml --metrics 127.0.0.1:9464\n\
             sudo gpreempt-ebpf queues --json\n\
             sudo gpreempt-ebpf trace --pid 4242\n\
             .fi\n\
             .SH FILES\n\
             .TP\n/etc/gpreempt-ebpf/policy.toml\nthe policy the unit runs (examples in \
             /usr/share/doc/gpreempt-ebpf/examples)\n\
             .TP\n/etc/default/gpreempt-ebpf\nthe unit's metrics address, audit bound and extra \
             options\n\
             .TP\n/run/gpreempt-ebpf\nthe running controller's lock, socket and status file\n\
             .TP\n/var/log/gpreempt-ebpf/audit.jsonl\nthe controller's audit log (the unit's)\n\
             .TP\n/usr/share/doc/gpreempt-ebpf\nREADME.md and docs/\n",
        );
    } else {
        s.push_str(".SH \"SEE ALSO\"\n\\fBgpreempt-ebpf\\fR(1)\n");
    }
    s
}

/// Writes the man pages or the completions `g` asks for.
fn generate(g: &Generate) -> Result<ExitCode> {
    use clap::CommandFactory as _;
    let mut cmd = Cli::command();
    match g {
        Generate::Man { dir } => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            cmd.build();
            let mut pages = Vec::new();
            man_pages(&cmd, cmd.get_name(), &mut pages);
            for (name, page) in pages {
                let path = dir.join(format!("{name}.1"));
                let mut out = Vec::new();
                clap_mangen::Man::new(page).render(&mut out)?;
                out.extend_from_slice(man_sections(&name).as_bytes());
                std::fs::write(&path, out)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Generate::Completions { shell } => {
            clap_complete::generate(*shell, &mut cmd, "gpreempt-ebpf", &mut std::io::stdout());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Under systemd (stderr is the journal's stream) each line starts with its syslog priority, so
/// `journalctl -p` filters by level.
fn journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

pub fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let g = &cli.global;
    let level = match g.verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    let ebpf_log = matches!(&cli.command, Command::Trace(t) if t.ebpf_log);
    let mut logger = env_logger::Builder::new();
    logger
        .filter_level(if ebpf_log {
            log::LevelFilter::Debug
        } else {
            level
        })
        // -vv: timestamps, to line debug output up with other tools' clocks.
        .format_timestamp((g.verbose >= 2).then_some(env_logger::TimestampPrecision::Micros))
        .target(env_logger::Target::Stderr);
    // RUST_LOG, where set, says more precisely what -v says (e.g.
    // `gpreempt_user::backend=debug`); NO_COLOR keeps the level names plain.
    if let Some(spec) = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty()) {
        logger.parse_filters(&spec);
    }
    if crate::term::no_color() {
        logger.write_style(env_logger::WriteStyle::Never);
    }
    if journald() {
        logger.format(|f, r| {
            use std::io::Write as _;
            let prio = match r.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                _ => 7,
            };
            writeln!(f, "<{prio}>{}: {}", r.target(), r.args())
        });
    }
    logger.init();
    if matches!(
        cli.command,
        Command::Run(_)
            | Command::Suspend(_)
            | Command::Resume(_)
            | Command::Top(_)
            | Command::KfdCycles(_)
    ) {
        // The control thread takes its tracees' stops from a signalfd: SIGCHLD must be blocked
        // in every thread, so before the runtime starts any.
        crate::backend::kfd::control::block_sigchld()?;
    }
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")
    };
    match &cli.command {
        Command::Sim(args) => cmd::sim::main(g, args),
        Command::Queues(args) => cmd::queues::main(args),
        Command::Top(args) => rt()?.block_on(cmd::top::main(g, args)),
        Command::Trace(args) => rt()?.block_on(cmd::trace::main(g, args)),
        Command::Run(args) => rt()?.block_on(cmd::run::main(g, args)),
        Command::Suspend(args) => rt()?.block_on(cmd::manual::suspend(g, args)),
        Command::Resume(args) => rt()?.block_on(cmd::manual::resume(g, args)),
        Command::Doctor(args) => cmd::doctor::main(g, args),
        Command::Policy(args) => cmd::policy::main(args),
        Command::NvGuardian(args) => cmd::nv_guardian::main(args),
        Command::NvPauseTest(args) => rt()?.block_on(cmd::nv_pause_test::main(args)),
        Command::KfdCycles(args) => rt()?.block_on(cmd::kfd_cycles::main(g, args)),
        Command::NvSelftestTarget(args) => cmd::nv_selftest_target::main(args),
        Command::Generate(g) => generate(g),
    }
}

#[cfg(test)]
mod man_tests {
    /// Every page says how it exits and what steers it; the main one shows how it is used and
    /// which files it keeps (the sections clap does not write).
    #[test]
    fn the_pages_have_exit_status_environment_examples_and_files() {
        let main = super::man_sections("gpreempt-ebpf");
        for s in [
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH EXAMPLES",
            ".SH FILES",
        ] {
            assert!(main.contains(s), "{s}: {main}");
        }
        assert!(main.contains("NO_COLOR") && main.contains("RUST_LOG"));
        let run = super::man_sections("gpreempt-ebpf-run");
        assert!(run.contains(".SH \"EXIT STATUS\"") && run.contains(".SH \"SEE ALSO\""));
        assert!(!run.contains(".SH FILES"));
        // One roff request per line: no continuation swallowed a newline.
        assert!(
            main.lines().all(|l| !l.contains(".TP") || l == ".TP"),
            "{main}"
        );
    }
}
