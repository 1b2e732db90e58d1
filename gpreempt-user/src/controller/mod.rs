//! The acting side's shared parts: what a running controller shares with the host and other
//! commands ([`daemon`]: lock, status file), the one acting path every controller takes
//! ([`hold`]: lock, backends, held queues, restore), the control socket
//! ([`socket`]: who may send what) and how it answers requests
//! ([`requests`], through the backend seam), the loop of `run` itself ([`run_loop`])
//! and what comes before it ([`startup`]: the self-tests), what it tells systemd ([`notify`]:
//! readiness, reloads, the watchdog); what it audits ([`record`], written
//! by [`audit`]) and publishes ([`metrics`]).
pub mod alarm;
pub mod audit;
pub mod daemon;
pub mod hold;
pub mod limits;
pub mod metrics;
pub mod notify;
pub mod record;
pub mod requests;
pub mod run_loop;
pub mod socket;
pub mod startup;
