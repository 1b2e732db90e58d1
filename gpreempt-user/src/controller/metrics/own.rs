//! The controller's own series: `gpreempt_build_info` and the standard process metrics under
//! their conventional unprefixed names (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_start_time_seconds`), read from /proc/self: what
//! an operator alerts on when a node agent grows or spins.

use anyhow::Result;
use prometheus::{Counter, Gauge, IntGaugeVec, Opts, Registry};

pub struct Own {
    pub registry: Registry,
    cpu: Counter,
    rss: Gauge,
    /// CPU seconds already counted (the counter only goes up by the difference).
    counted: f64,
}

impl Own {
    /// `build` is registered in the main (prefixed) registry as `gpreempt_build_info`.
    pub fn new(prefixed: &Registry) -> Result<Self> {
        let build = IntGaugeVec::new(
            Opts::new("build_info", "The running build: version; always 1."),
            &["version"],
        )?;
        prefixed.register(Box::new(build.clone()))?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let registry = Registry::new();
        let cpu = Counter::new(
            "process_cpu_seconds_total",
            "User and system CPU time of the controller.",
        )?;
        let rss = Gauge::new(
            "process_resident_memory_bytes",
            "Resident memory of the controller.",
        )?;
        let start = Gauge::new(
            "process_start_time_seconds",
            "When the controller started, since the Unix epoch.",
        )?;
        start.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        for c in [
            Box::new(cpu.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(rss.clone()),
            Box::new(start),
        ] {
            registry.register(c)?;
        }
        Ok(Self {
            registry,
            cpu,
            rss,
            counted: 0.0,
        })
    }

    /// Reads /proc/self now (a failed read leaves the last values).
    pub fn update(&mut self) {
        if let Some((cpu, rss)) = read_self() {
            if cpu > self.counted {
                self.cpu.inc_by(cpu - self.counted);
                self.counted = cpu;
            }
            self.rss.set(rss);
        }
    }
}

/// CPU seconds (utime + stime) and resident bytes of this process.
fn read_self() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    parse(&stat, &statm, clock_ticks(), page_size())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn page_size() -> f64 {
    // SAFETY: as above.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as f64
    } else {
        4096.0
    }
}

/// Fields 14 and 15 of `stat` (utime, stime, in clock ticks), counted after the command's
/// closing parenthesis (a command may hold spaces and parentheses); the second field of
/// `statm` (resident pages).
fn parse(stat: &str, statm: &str, ticks: f64, page: f64) -> Option<(f64, f64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(((utime + stime) / ticks, pages * page))
}

#[cfg(test)]
mod tests {
    #[test]
    fn stat_and_statm_parse_with_an_odd_command() {
        let stat = "4242 (gp ) x (y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 \
                    100 1000000 300 18446744073709551615";
        let (cpu, rss) = super::parse(stat, "5000 300 200 10 0 400 0\n", 100.0, 4096.0).unwrap();
        assert!((cpu - 3.0).abs() < 1e-9, "{cpu}");
        assert!((rss - 300.0 * 4096.0).abs() < 1e-9, "{rss}");
        assert!(super::read_self().is_some_and(|(c, r)| c >= 0.0 && r > 0.0));
    }
}
