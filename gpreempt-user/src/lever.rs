//! The levers: the ways an offline process can be made to yield the GPU to online work, named
//! once for every vendor. A backend advertises which of them it offers ([`Offers`]), what each
//! costs and how it is undone; the policy engine and its tuner choose among the advertised ones
//! and never ask which vendor offers them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One way of making offline work yield.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lever {
    /// Nothing: processes are classed, offline work is left alone. The baseline a lever must
    /// beat, and what a tuner keeps where no lever buys anything.
    None,
    /// A short hardware timeslice only while online work is busy on the GPU (the episodes that
    /// would pause it), and the process's own value back after.
    Dynamic,
    /// A short hardware timeslice set once, at classification, and kept; never paused. The
    /// GPU's scheduler then switches to online work within that slice, with no call per request.
    Timeslice,
    /// The queues are taken off the GPU while online work is busy, and put back after.
    Pause,
    /// The short timeslice always, and a pause only when online work stays busy longer than
    /// `pause_after` (the timeslice alone is not keeping up).
    Both,
    /// The process's cgroup is frozen while online work is busy: it submits nothing new, but
    /// what it queued already runs to completion. For processes whose queues cannot be paused.
    Freeze,
    /// A pause only once an online burst has outlasted a deferral the engine tunes (from at
    /// once to never: the adaptive strategy's defer ladder), so short bursts leave offline work
    /// running. The backend pauses as for `pause`.
    Defer,
}

impl Lever {
    pub const ALL: [Lever; 7] = [
        Self::None,
        Self::Dynamic,
        Self::Timeslice,
        Self::Pause,
        Self::Both,
        Self::Freeze,
        Self::Defer,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Dynamic => "dynamic",
            Self::Timeslice => "timeslice",
            Self::Pause => "pause",
            Self::Both => "both",
            Self::Freeze => "freeze",
            Self::Defer => "defer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.label() == s)
    }

    /// The short timeslice is set once, at classification, and kept (`timeslice`, `both`).
    pub fn timeslice(self) -> bool {
        matches!(self, Self::Timeslice | Self::Both)
    }

    /// The engine's suspend/resume decisions reach the process (as a pause, a freeze, or for
    /// `Dynamic` as the short timeslice and back).
    pub fn acts_per_episode(self) -> bool {
        matches!(
            self,
            Self::Dynamic | Self::Pause | Self::Both | Self::Freeze | Self::Defer
        )
    }

    /// How far it reaches into the offline work, least first: between two levers that both meet
    /// the online goal, a tuner keeps the one that intrudes less.
    pub fn intrusion(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Dynamic => 1,
            Self::Timeslice => 2,
            Self::Both => 3,
            Self::Defer => 4,
            Self::Freeze => 5,
            Self::Pause => 6,
        }
    }
}

impl fmt::Display for Lever {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A set of levers (a bit mask, so that the policy's tables stay `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeverSet(u8);

impl LeverSet {
    /// The tuner's default candidates: the null lever, the two timeslice levers, the pause and
    /// the deferred pause (each where the GPU's backend offers it). `both` is left out (its
    /// pause half is the `pause` candidate's cost), and so is `freeze` (it stops the process's
    /// own CPU side too).
    pub const DEFAULT: LeverSet = LeverSet::of(&[
        Lever::None,
        Lever::Dynamic,
        Lever::Timeslice,
        Lever::Pause,
        Lever::Defer,
    ]);

    pub const EMPTY: LeverSet = LeverSet(0);

    pub const fn of(levers: &[Lever]) -> Self {
        let mut bits = 0u8;
        let mut i = 0;
        while i < levers.len() {
            bits |= 1 << levers[i] as u8;
            i += 1;
        }
        Self(bits)
    }

    pub fn contains(self, l: Lever) -> bool {
        self.0 & (1 << l as u8) != 0
    }

    pub fn insert(&mut self, l: Lever) {
        self.0 |= 1 << l as u8;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The levers in both sets.
    pub fn and(self, other: LeverSet) -> LeverSet {
        LeverSet(self.0 & other.0)
    }

    /// In the order of [`Lever::ALL`] (`none` first: the null lever is the reference).
    pub fn iter(self) -> impl Iterator<Item = Lever> {
        Lever::ALL.into_iter().filter(move |&l| self.contains(l))
    }
}

impl Default for LeverSet {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for LeverSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Lever::label).collect();
        f.write_str(&names.join(", "))
    }
}

/// How what a lever did is undone, on a normal stop and when the controller dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// Nothing to undo.
    Nothing,
    /// The queues are resumed; a dead controller's are resumed by the kernel itself.
    ResumeByKernel,
    /// The queues are resumed; a dead controller's by its guardian process.
    ResumeByGuardian,
    /// The original timeslice is put back; a dead controller's by its guardian process.
    RestoreByGuardian,
    /// The cgroup is thawed; a dead controller's by its guardian process.
    ThawByGuardian,
}

/// One lever a backend offers on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub lever: Lever,
    /// What one act costs, for a person (docs and `doctor`).
    pub cost: &'static str,
    pub undo: Undo,
}

/// The levers a backend offers on its GPUs, and which one it uses where the policy names none
/// of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offers {
    pub list: &'static [Offer],
    pub default: Lever,
}

impl Offers {
    /// A backend that advertises nothing: its processes are paused, as the engine asks.
    pub const UNKNOWN: Offers = Offers {
        list: &[],
        default: Lever::Pause,
    };

    /// Whether `candidates` leave a choice here (two or more of them offered): only then is
    /// there a lever to tune.
    pub fn choice(&self, candidates: LeverSet) -> bool {
        self.set().and(candidates).len() >= 2
    }

    pub fn set(&self) -> LeverSet {
        let mut s = LeverSet::EMPTY;
        for o in self.list {
            s.insert(o.lever);
        }
        s
    }

    /// The lever this backend acts by when `wanted` is asked for: `wanted` where it is
    /// offered, the backend's default otherwise.
    pub fn resolve(&self, wanted: Lever) -> Lever {
        if self.set().contains(wanted) {
            wanted
        } else {
            self.default
        }
    }

    /// What `lever` costs and how it is undone here.
    pub fn get(&self, lever: Lever) -> Option<&Offer> {
        self.list.iter().find(|o| o.lever == lever)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: Offers = Offers {
        list: &[
            Offer {
                lever: Lever::Pause,
                cost: "one call",
                undo: Undo::ResumeByKernel,
            },
            Offer {
                lever: Lever::Freeze,
                cost: "a cgroup write",
                undo: Undo::ThawByGuardian,
            },
        ],
        default: Lever::Pause,
    };

    #[test]
    fn a_lever_not_offered_resolves_to_the_backends_default() {
        assert_eq!(TWO.resolve(Lever::Timeslice), Lever::Pause);
        assert_eq!(TWO.resolve(Lever::Freeze), Lever::Freeze);
        assert_eq!(TWO.set().len(), 2);
        assert_eq!(
            TWO.set().and(LeverSet::DEFAULT),
            LeverSet::of(&[Lever::Pause])
        );
        assert_eq!(
            TWO.get(Lever::Freeze).map(|o| o.undo),
            Some(Undo::ThawByGuardian)
        );
    }

    #[test]
    fn labels_parse_back() {
        for l in Lever::ALL {
            assert_eq!(Lever::parse(l.label()), Some(l));
        }
        assert_eq!(Lever::parse("suspend"), None);
        assert_eq!(
            LeverSet::DEFAULT.to_string(),
            "none, dynamic, timeslice, pause, defer"
        );
    }
}
