//! NVIDIA (RM, GSP firmware): pausing a process's GPU channels, and the guardian that undoes it.
pub mod controller;
pub mod guardian;
pub mod pausetest;
pub mod rm;
pub mod selftest;
pub mod startup;
