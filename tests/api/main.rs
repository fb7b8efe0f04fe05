//! One integration-test binary (each file in tests/ would link the crate again).

mod helpers;

mod health;
mod openapi;
mod tasks;
mod validation;
mod wait;
mod workers;
