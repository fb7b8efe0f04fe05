//! One integration-test binary (each file in tests/ would link the crate again).

mod fakes;
mod faults;
mod helpers;

mod a2a;
mod agents;
mod batching;
mod browser;
mod budgets;
mod caching;
mod chaos;
mod console;
mod contract;
mod dbrestart;
mod health;
mod holds;
mod imports;
mod lifecycle;
mod live;
mod liveness;
mod mcp;
mod observe;
mod openapi;
mod pauses;
mod providers;
mod ratelimit;
mod servers;
mod services;
mod structured;
mod submit;
mod tasks;
mod tenants;
mod tools;
mod validation;
mod wait;
mod workers;
