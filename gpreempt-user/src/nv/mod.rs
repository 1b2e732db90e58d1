//! NVIDIA (RM, GSP firmware): pausing a process's GPU channels, and the guardian that undoes it.
pub mod control;
pub mod ctl;
pub mod guardian;
pub mod pausetest;
pub mod selftest;
pub mod startup;
