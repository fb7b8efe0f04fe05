//! One integration-test binary (each file in tests/ would link the crate again).

mod fakes;
mod helpers;

mod agents;
mod health;
mod openapi;
mod providers;
mod tasks;
mod validation;
mod wait;
mod workers;
