//! The service's resources other than tasks — API keys and tenants (`keys`), agent definitions
//! (`agents`), tools and tool sources (`tools`), usage (`usage`), the console's overview
//! (`overview`), console and MCP sessions (`sessions`), readiness and gauges (`health`) — each a
//! small module that owns its rules and its queries, as the lifecycle room does for tasks. A door
//! (`http`) extracts a request, makes one call here and shapes the answer: it reaches no pool, no
//! SQL and no `store`.
//!
//! May import: `tasks` (the room's handles, views and agent listing), `budget`, `engine`, `tools`,
//! `llm`, `store`, `hub`, `config`, `cache`, `kinds`. Never a door or `jobs`.

pub mod agents;
pub mod environments;
pub mod health;
pub mod keys;
pub mod overview;
pub mod sessions;
pub mod tools;
pub mod usage;
pub mod workspaces;

use crate::budget::BudgetError;
use crate::config::Config;
use crate::store::StoreError;
use crate::tasks::{Parts, TaskError};
use crate::tools::ToolError;

/// The handles the resources share with the room (one per process, cloned cheaply).
#[derive(Clone)]
pub struct Resources {
    p: Parts,
}

impl Resources {
    pub fn new(p: &Parts) -> Resources {
        Resources { p: p.clone() }
    }

    /// The service's configuration (read-only).
    pub fn config(&self) -> &Config {
        &self.p.cfg
    }
}

/// What a resource's operation refuses, or fails with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value of the request that cannot be taken, naming its field.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// No such resource of the caller's (what it is: `tool`, `agent`…).
    #[error("no such {0}")]
    NotFound(&'static str),
    /// The resource cannot be changed this way (a built-in, a file's definition…).
    #[error("{0}")]
    ReadOnly(String),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// Over a cap or a quota (`code` names which): 413.
    #[error("{detail}")]
    TooLarge { code: &'static str, detail: String },
    /// A body of a type the route does not take: 415.
    #[error("{0}")]
    MediaType(String),
    /// A failure below (the database), as the room reports it.
    #[error(transparent)]
    Task(#[from] TaskError),
}

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Error {
        Error::Invalid { field: field.to_string(), message: message.into() }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        Error::Task(TaskError::Store(e))
    }
}
