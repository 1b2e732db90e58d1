//! What a running controller shares with the host and other commands: the lock, the status file,
//! the targets record and the control socket ([`daemon`]).
pub mod daemon;
