//! NVIDIA (RM, GSP firmware): pausing a process's GPU channels and lowering its TSGs' timeslices
//! ([`rm`], [`controller`]), the [`guardian`] that undoes both, and the start-up self-test.
pub mod activity;
pub mod adopt;
pub mod controller;
pub mod guardian;
pub mod pausetest;
pub mod rm;
pub mod selftest;
pub mod startup;
