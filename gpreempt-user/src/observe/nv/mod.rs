//! NVIDIA (RM, GSP firmware), as seen: the RM primitives on a duplicated fd ([`rm`], which the
//! backend's pause calls use too), the channels' activity ([`activity`]) and the objects journal
//! a restarted controller adopts ([`adopt`]).
pub mod activity;
pub mod adopt;
pub mod gpus;
pub mod rm;
