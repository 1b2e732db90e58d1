//! One file per command: each owns its arguments and reaches the kernel only through the
//! observer ([`crate::observe`]) and the backend seam ([`crate::backend`]).
pub mod manual;
pub mod queues;
pub mod run;
pub mod sim;
pub mod top;
