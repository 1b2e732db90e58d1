//! CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns()`, so event and snapshot times compare.

pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        // CLOCK_MONOTONIC cannot fail on Linux; 0 only makes a snapshot look old.
        Err(_) => 0,
    }
}
