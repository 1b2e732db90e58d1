//! The entry/return pairs on a driver's ioctl dispatcher (`kfd_ioctl`, `nvidia_unlocked_ioctl`):
//! with one attached, no other ioctl on the host runs a program. Fentry/fexit through BPF
//! trampolines where BTF has the function, else a kprobe pair; doctor tries them for a moment.

use anyhow::Result;
use aya::{programs::KProbe, Ebpf};

use super::{
    load::{load_object, verifier_text, EBPF_OBJECT},
    source::{Pair, NV_IOCTL},
    HostProbeFacts,
};

/// The kprobe pair's programs, entry then return.
const KFD_PAIR: [&str; 2] = ["kfd_ioctl_entry", "kfd_ioctl_return"];

fn pair_program<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut KProbe, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))
}

pub(super) fn load_kfd_pair(ebpf: &mut Ebpf) -> Result<(), String> {
    for program in KFD_PAIR {
        pair_program(ebpf, program)?
            .load()
            .map_err(|e| format!("the verifier rejected {program}: {}", verifier_text(&e)))?;
    }
    Ok(())
}

/// Return first: an entry without its return would leave calls in flight.
pub(super) fn attach_kfd_pair(ebpf: &mut Ebpf) -> Result<(), String> {
    for program in KFD_PAIR.iter().rev() {
        pair_program(ebpf, program)?
            .attach("kfd_ioctl", 0)
            .map_err(|e| format!("attaching {program} to kfd_ioctl: {e}"))?;
    }
    Ok(())
}

/// Attaches the fentry/fexit pair on `kfd_ioctl` for a moment (doctor's check): Err says why
/// it cannot be the source here.
pub fn try_fentry_pair(facts: &HostProbeFacts) -> Result<(), String> {
    use crate::observe::tracing::Programs;
    let target = facts
        .kfd_ioctl_btf
        .as_ref()
        .ok_or("kfd_ioctl has no BTF (amdgpu not loaded, or built without module BTF)")?;
    let ebpf = load_object(false).map_err(|e| format!("{e:#}"))?;
    let programs = Programs::of(&ebpf, EBPF_OBJECT).map_err(|e| format!("{e:#}"))?;
    attach_fentry_pair(&programs, target).map(drop)
}

/// Attaches the NVIDIA pair for a moment (doctor's check): which one attached, or why none.
pub fn try_nv_pair(facts: &HostProbeFacts, plan: &[Pair]) -> Result<Pair, String> {
    let mut ebpf = load_object(false).map_err(|e| format!("{e:#}"))?;
    let programs = crate::observe::tracing::Programs::of(&ebpf, EBPF_OBJECT).ok();
    attach_nv_pair(&mut ebpf, programs.as_ref(), facts, plan).map(|(p, _links)| p)
}

/// The fentry/fexit programs of the NVIDIA ioctl pair, exit first.
pub const NV_FENTRY_PAIR: [(&str, crate::observe::tracing::Hook); 2] = [
    ("nv_ioctl_fexit", crate::observe::tracing::Hook::Exit),
    ("nv_ioctl_fentry", crate::observe::tracing::Hook::Entry),
];
/// The kprobe pair's programs, entry first (attached in reverse).
const NV_PAIR: [&str; 2] = ["nv_ioctl_entry", "nv_ioctl_return"];

/// Attaches the NVIDIA ioctl source per `plan` (the first that attaches wins).
pub(super) fn attach_nv_pair(
    ebpf: &mut Ebpf,
    programs: Option<&crate::observe::tracing::Programs>,
    facts: &HostProbeFacts,
    plan: &[Pair],
) -> Result<(Pair, Vec<crate::observe::tracing::Attached>), String> {
    let mut why = Vec::new();
    for p in plan {
        let r = match p {
            Pair::Fentry => match (programs, &facts.nv_ioctl_btf) {
                (Some(programs), Some(t)) => NV_FENTRY_PAIR
                    .iter()
                    .map(|(name, hook)| programs.attach(name, *hook, t))
                    .collect::<Result<Vec<_>>>()
                    .map_err(|e| format!("{e:#}")),
                _ => Err("no BTF-typed programs".into()),
            },
            Pair::Kprobe => (|| {
                for program in NV_PAIR {
                    pair_program(ebpf, program)?.load().map_err(|e| {
                        format!("the verifier rejected {program}: {}", verifier_text(&e))
                    })?;
                }
                for program in NV_PAIR.iter().rev() {
                    pair_program(ebpf, program)?
                        .attach(NV_IOCTL, 0)
                        .map_err(|e| format!("attaching {program} to {NV_IOCTL}: {e}"))?;
                }
                Ok(Vec::new())
            })(),
        };
        match r {
            Ok(links) => return Ok((*p, links)),
            Err(e) => why.push(format!("{}: {e}", p.name())),
        }
    }
    Err(why.join("; "))
}

/// The fentry/fexit programs of the KFD ioctl pair, exit first (an entry without its exit
/// would leave calls in flight).
pub const FENTRY_PAIR: [(&str, crate::observe::tracing::Hook); 2] = [
    ("kfd_ioctl_fexit", crate::observe::tracing::Hook::Exit),
    ("kfd_ioctl_fentry", crate::observe::tracing::Hook::Entry),
];

/// Loads and attaches the fentry/fexit pair on `target` (all or nothing).
pub fn attach_fentry_pair(
    programs: &crate::observe::tracing::Programs,
    target: &crate::observe::tracing::Target,
) -> Result<Vec<crate::observe::tracing::Attached>, String> {
    FENTRY_PAIR
        .iter()
        .map(|(p, hook)| programs.attach(p, *hook, target))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| format!("{e:#}"))
}
