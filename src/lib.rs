//! subagentd: LLM sub-agents as durable jobs.

pub mod a2a;
pub mod budget;
pub mod cache;
pub mod config;
pub mod console;
pub mod db;
pub mod engine;
pub mod http;
pub mod hub;
pub mod jobs;
pub mod kinds;
pub mod live;
pub mod llm;
pub mod resources;
pub mod service;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod tools;
pub mod workspace;
