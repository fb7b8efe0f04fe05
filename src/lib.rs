//! subagentd: LLM sub-agents as durable jobs.

pub mod config;
pub mod db;
pub mod engine;
pub mod llm;
pub mod jobs;
pub mod store;
pub mod http;
pub mod service;
