//! Integration tests of knob-training-services: real processes, real sockets, bounded waits.

mod agent;
mod bad_input;
mod code_archive;
mod leases;
mod lifecycle;
mod nni_file;
mod nni_v3;
mod plugin;
mod prerequisite;
mod real_nni;
mod remote;
mod runner;
mod service_config;
mod slurm;
mod sshd;
mod support;
