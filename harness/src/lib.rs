//! # concord-harness
//!
//! **One job:** run one worker process per rank and bring every rank's outcome back, with
//! nothing left running or on disk afterwards. Also: the c10d-compatible file store the ranks
//! rendezvous through, and GPU gating.
//!
//! Modules: [`store`] (FileStore), [`outcome`] (what a rank reports), [`worker`] (the child side),
//! [`runner`] (the parent side: worlds, deadlines, teardown), [`gpu`] (GPU counting),
//! [`platform`] (every Linux-specific call).

pub mod gpu;
pub mod outcome;
pub mod platform;
pub mod runner;
pub mod store;
pub mod worker;
