//! Seeing the host: load and attach the eBPF programs ([`probe`], with kernel struct offsets from
//! [`btf`]; GPU device files for the in-kernel filter from [`gpufiles`]), turn ring-buffer records into typed events ([`events`]), follow processes' facts
//! ([`procinfo`]), launch entry points ([`launch`]) and kernel names ([`kernel_names`]), and feed
//! the host model ([`watch`]).
pub mod btf;
pub mod events;
pub mod gpufiles;
pub mod hints;
pub mod host;
pub mod k8s;
pub mod kernel_names;
pub mod kfd;
pub mod launch;
pub mod losses;
pub mod model;
pub mod nv;
pub mod probe;
pub mod procinfo;
pub mod requests;
pub mod status;
pub(crate) mod target_file;
pub mod tracing;
pub mod watch;
