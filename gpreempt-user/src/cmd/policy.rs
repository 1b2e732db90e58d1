//! `gpreempt-ebpf policy explain --pid N`: which rule classes a process, and why each earlier
//! rule did not (policy/explain.rs), against a named file or the running controller's.
//!
//! `gpreempt-ebpf policy check FILE...`: validates policy files with the parser `run` uses, with
//! no root, no GPU and no running controller. Errors are what `run` would refuse (exit 1);
//! warnings are what it would run but probably should not: rules a process can claim by renaming
//! itself, rules on a pid, and what only the host the controller runs on can answer (a
//! `[control] group` missing here may exist there).

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::{Args as ClapArgs, Subcommand};

use crate::policy::{read_policy_file, Policy};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Validate policy files as `run` parses them (no root, no GPU, no controller).
    ///
    /// Each error is printed as `FILE:LINE: message` on stderr and makes the exit status 1.
    /// Warnings (`FILE:LINE: warning: message`, exit status unchanged) name rules a process can
    /// claim or dodge by renaming itself (on comm/cmdline without uid, gid, cgroup, container or
    /// pod), rules on a pid, a policy that can never suspend anything, and what only the host
    /// the controller runs on can answer: a `[control] group` missing here is a warning, though
    /// `run` refuses to start where it is missing. Each valid file gets one line on stdout with
    /// what `run` would do with it.
    Check(CheckArgs),
    /// Why a process gets its class: the rule that matches it (FILE:LINE) and, for every earlier
    /// rule, which matcher fails with the process's value; or the default.
    ///
    /// Reads the process's /proc facts as the controller does: as non-root, your own processes
    /// (and others' where /proc lets you read them). Without --policy, the running
    /// controller's policy file (its status in the run directory names it).
    Explain(ExplainArgs),
}

#[derive(ClapArgs, Debug)]
pub struct ExplainArgs {
    /// The process.
    #[arg(long, value_name = "N")]
    pub pid: u32,
    /// The policy file; default: the running controller's.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// One JSON document (docs/policy.md, "Why a process has its class").
    #[arg(long)]
    pub json: bool,
}

#[derive(ClapArgs, Debug)]
pub struct CheckArgs {
    /// The policy files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// What checking one policy's text found.
#[derive(Debug)]
pub struct Report {
    /// The parsed policy, when it has no errors.
    pub policy: Option<Policy>,
    /// `source:LINE: message`, in line order.
    pub errors: Vec<String>,
    /// `source:LINE: warning: message`.
    pub warnings: Vec<String>,
}

/// How a group name resolves on this host: its gid, `None` if no such group, or why the
/// lookup failed.
pub type GroupLookup<'a> = &'a dyn Fn(&str) -> Result<Option<u32>, String>;

/// The host's group database (NSS: /etc/group, LDAP, ...), as `run` consults it.
pub fn host_group(name: &str) -> Result<Option<u32>, String> {
    nix::unistd::Group::from_name(name)
        .map(|g| g.map(|g| g.gid.as_raw()))
        .map_err(|e| e.to_string())
}

/// Checks a policy's text; `source` names it in every message.
pub fn check_text(text: &str, source: &str, group: GroupLookup) -> Report {
    let policy = match Policy::parse(text, source) {
        Ok(p) => p,
        Err(e) => {
            return Report {
                policy: None,
                errors: e.to_string().lines().map(str::to_owned).collect(),
                warnings: Vec::new(),
            }
        }
    };
    let mut warnings: Vec<(usize, String)> = policy
        .lints()
        .iter()
        .map(|l| (l.line, l.located(source)))
        .collect();
    if let (Some(name), Some(line)) = (&policy.control_group, policy.control_group_line) {
        // `run` refuses to start when the group is missing (a typo would lock its members out);
        // whether it exists is the controller's host's answer, not this one's.
        let why = match group(name) {
            Ok(Some(_)) => None,
            Ok(None) => Some(format!(
                "[control] group {name:?} does not exist on this host; `run` refuses to start \
                 where it does not exist (create it with groupadd, or check on the host the \
                 controller runs on)"
            )),
            Err(e) => Some(format!(
                "[control] group {name:?} could not be looked up on this host ({e}); `run` \
                 refuses to start where it does not exist"
            )),
        };
        if let Some(why) = why {
            warnings.push((line, format!("{source}:{line}: warning: {why}")));
        }
    }
    warnings.sort_by_key(|(line, _)| *line);
    Report {
        policy: Some(policy),
        errors: Vec::new(),
        warnings: warnings.into_iter().map(|(_, w)| w).collect(),
    }
}

pub fn main(args: &Args) -> Result<ExitCode> {
    match &args.command {
        Sub::Check(a) => check(a),
        Sub::Explain(a) => explain(a),
    }
}

fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    let (policy, controller) = match &args.policy {
        Some(path) => (Policy::load(path)?, None),
        None => {
            let r = crate::policy::running(&crate::rundir::run_dir())
                .map_err(|e| anyhow::anyhow!(e))?;
            let class = r.classes.get(&args.pid).cloned();
            (r.policy, Some((r.controller_pid, class)))
        }
    };
    let pid = args.pid;
    let info =
        crate::observe::procinfo::read(std::path::Path::new("/proc"), pid).map_err(|e| match e
            .kind()
        {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "no process has pid {pid} (or /proc hides it from you: hidepid; run as root)"
            ),
            _ => anyhow::anyhow!(
                "cannot read /proc/{pid}/stat: {e}; run as root to explain another user's process"
            ),
        })?;
    let e = policy.explain(&info, pid);
    // What the running controller published, when it differs: it classes by the version of
    // the file it loaded.
    let differs = controller
        .as_ref()
        .and_then(|(ctl, class)| Some((ctl, class.as_ref()?)))
        .filter(|(_, c)| c.as_str() != e.class.label());
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut v = serde_json::to_value(&e)?;
        if let Some((ctl, class)) = &controller {
            v["controller_pid"] = (*ctl).into();
            v["controller_class"] = class.clone().into();
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for line in e.text().lines() {
            writeln!(out, "{}", crate::term::clean(line))?;
        }
        if let Some((ctl, c)) = differs {
            writeln!(
                out,
                "note: the running controller (pid {ctl}) has it {}: it classes by the file                  as it was loaded (SIGHUP reloads it)",
                crate::term::clean(c)
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check(args: &CheckArgs) -> Result<ExitCode> {
    let mut failed = false;
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    for path in &args.files {
        let source = path.display().to_string();
        let report = match read_policy_file(path) {
            Ok(text) => check_text(&text, &source, &host_group),
            Err(e) => Report {
                policy: None,
                errors: vec![format!("{e:#}")],
                warnings: Vec::new(),
            },
        };
        for line in report.errors.iter().chain(&report.warnings) {
            writeln!(err, "{line}")?;
        }
        match &report.policy {
            Some(p) => {
                let summary = p.summary();
                let what = summary
                    .strip_prefix(&format!("{source}: "))
                    .unwrap_or(&summary);
                writeln!(
                    out,
                    "{source}: ok, {} warning(s): {what}",
                    report.warnings.len()
                )?;
            }
            None => failed = true,
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_groups(_: &str) -> Result<Option<u32>, String> {
        Ok(None)
    }

    fn admins(name: &str) -> Result<Option<u32>, String> {
        Ok((name == "gpu-admins").then_some(990))
    }

    const GOOD: &str = "[policy]\nstrategy = \"priority\"\n\n\
                        [[rule]]\nclass = \"online\"\nuid = 1000\ncomm = \"svc\"\n\n\
                        [[rule]]\nclass = \"offline\"\ncgroup = \"/batch.slice/*\"\n";

    #[test]
    fn a_sound_policy_has_no_findings() {
        let r = check_text(GOOD, "good.toml", &no_groups);
        assert!(r.errors.is_empty() && r.warnings.is_empty(), "{r:#?}");
        assert_eq!(r.policy.unwrap().rules.len(), 2);
    }

    #[test]
    fn errors_name_file_and_line_as_run_does() {
        let text = "[policy]\nstrategy = \"priority\"\nwindow = \"20xs\"\n\n\
                    [timeslice]\nperiod = \"100ms\"\n";
        let r = check_text(text, "bad.toml", &no_groups);
        assert!(r.policy.is_none());
        assert_eq!(
            r.errors,
            [
                "bad.toml:3: window: invalid duration \"20xs\" (use e.g. 500us, 20ms, 1.5s)",
                "bad.toml:5: [timeslice] is used only with strategy = \"timeslice\" (set it in \
                 [policy], or remove this table)",
            ]
        );
        // The same text `run` refuses, with the same lines.
        let run = Policy::parse(text, "bad.toml").unwrap_err().to_string();
        assert_eq!(run, r.errors.join("\n"));
    }

    #[test]
    fn spoofable_and_pid_rules_are_warnings_with_their_lines() {
        let text = "[[rule]]\nclass = \"online\"\ncomm = \"triton*\"\n\n\
                    [[rule]]\nclass = \"offline\"\npid = 4242\n";
        let r = check_text(text, "p.toml", &no_groups);
        assert!(r.errors.is_empty() && r.policy.is_some(), "{r:#?}");
        assert_eq!(r.warnings.len(), 2, "{:#?}", r.warnings);
        assert!(
            r.warnings[0].starts_with("p.toml:1: warning: rule 1 matches only on comm/cmdline")
                && r.warnings[0].contains("classed online"),
            "{}",
            r.warnings[0]
        );
        assert!(
            r.warnings[1].starts_with("p.toml:5: warning: rule 2 matches pid 4242")
                && r.warnings[1].contains("classed offline"),
            "{}",
            r.warnings[1]
        );
        // `run` names the first only: a pid rule is the operator's own, checked here.
        assert_eq!(
            r.policy.unwrap().trust_warnings(),
            [
                "p.toml: rule 1 (line 1) matches only on comm/cmdline, which a process sets \
              itself: any local user can name a process to match it and be classed online; \
              add uid, gid or cgroup"
            ]
        );
    }

    #[test]
    fn a_cmdline_rule_with_a_uid_is_not_spoofable() {
        let text = "[[rule]]\nclass = \"online\"\ncmdline = 'serve'\nuid = 990\n\n\
                    [[rule]]\nclass = \"offline\"\ncmdline = 'train'\ngid = 991\n";
        let r = check_text(text, "p.toml", &no_groups);
        assert!(r.errors.is_empty() && r.warnings.is_empty(), "{r:#?}");
    }

    #[test]
    fn a_policy_that_can_never_act_is_a_warning_on_line_1() {
        let r = check_text("[policy]\nstrategy = \"adaptive\"\n", "a.toml", &no_groups);
        assert!(r.errors.is_empty(), "{r:#?}");
        assert_eq!(r.warnings.len(), 1, "{:#?}", r.warnings);
        assert!(
            r.warnings[0].starts_with("a.toml:1: warning: 0 rule(s) and default ignore"),
            "{}",
            r.warnings[0]
        );
    }

    #[test]
    fn a_missing_control_group_is_a_host_warning_not_an_error() {
        let text = format!("{GOOD}\n[control]\ngroup = \"gpu-admins\"\n");
        let r = check_text(&text, "p.toml", &no_groups);
        assert!(r.errors.is_empty() && r.policy.is_some(), "{r:#?}");
        assert_eq!(r.warnings.len(), 1, "{:#?}", r.warnings);
        assert!(
            r.warnings[0].starts_with(
                "p.toml:14: warning: [control] group \"gpu-admins\" does not exist on this host"
            ),
            "{}",
            r.warnings[0]
        );
        // Where it exists there is nothing to say.
        let r = check_text(&text, "p.toml", &admins);
        assert!(r.warnings.is_empty(), "{:#?}", r.warnings);
        // A lookup that fails is said as such.
        let r = check_text(&text, "p.toml", &|_| Err("NSS unreachable".into()));
        assert!(
            r.warnings[0].contains("could not be looked up on this host (NSS unreachable)"),
            "{:#?}",
            r.warnings
        );
        // A name that is no group name is the parser's error, whatever the host has.
        let r = check_text("[control]\ngroup = \"a b\"\n", "p.toml", &admins);
        assert_eq!(
            r.errors,
            ["p.toml:2: group: \"a b\" is not a group name (letters, digits, _ . -)"]
        );
    }

    #[test]
    fn warnings_come_in_line_order() {
        let text = "[control]\ngroup = \"nobody-here\"\n\n\
                    [[rule]]\nclass = \"online\"\ncomm = \"a\"\n\n\
                    [[rule]]\nclass = \"offline\"\nuid = 5\n";
        let r = check_text(text, "p.toml", &no_groups);
        let lines: Vec<&str> = r
            .warnings
            .iter()
            .map(|w| w.split(':').nth(1).unwrap())
            .collect();
        assert_eq!(lines, ["2", "4"], "{:#?}", r.warnings);
    }
}
