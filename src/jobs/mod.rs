//! Claiming, leases and heartbeats, the rescuer, the worker pool and the LISTEN/NOTIFY hub.

pub mod hub;
pub mod run_store;
pub mod webhooks;
pub mod worker;
