//! Ring-buffer throughput: one flooding producer per CPU under `gpreempt-ebpf trace`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::tracer::{poke, start, stop, Tracer};

/// One producer per CPU floods KFD ioctls; the tracer's accounting must cover every one.
pub(super) fn throughput(per_producer: u64, dev: &Path) -> Result<()> {
    let producers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let running = start(Tracer::Gpreempt, dev, Path::new("/dev/null"))?;
    let t = Instant::now();
    let handles: Vec<_> = (0..producers)
        .map(|_| {
            let dev = dev.to_path_buf();
            std::thread::spawn(move || poke(Tracer::None, &dev, per_producer, "kfd"))
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    }
    let wall = t.elapsed().as_secs_f64();
    // Let the consumer drain before stopping it.
    std::thread::sleep(Duration::from_millis(500));
    let out = stop(running)?;
    let summary = out
        .iter()
        .find(|l| l.contains("summary:"))
        .context("no summary from the tracer")?;
    let field = |k: &str| -> u64 {
        summary
            .split_whitespace()
            .find_map(|kv| {
                kv.strip_prefix(&format!("{k}="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    };
    let issued = per_producer * producers as u64;
    // Each producer's exit is one more written event.
    let written = field("written").saturating_sub(producers as u64);
    let lost = field("lost_ringbuf_full") + field("lost_inflight_full");
    println!(
        "\nring-buffer throughput: {producers} producers x {per_producer} KFD ioctls in {wall:.2} s = {:.2} M events/s offered",
        issued as f64 / wall / 1e6
    );
    println!(
        "delivered {written} ({:.2} M/s), lost and counted {lost}, unaccounted {}",
        written as f64 / wall / 1e6,
        issued as i64 - written as i64 - lost as i64
    );
    Ok(())
}
