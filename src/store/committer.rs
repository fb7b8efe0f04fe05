//! Group commit of runs' writes (the batched form of `runs::commit_turns`,
//! `budget::reserve_many` and `events::append_many`): the turn checkpoints, call reservations and event appends of
//! runs that are ready at the same moment go to PostgreSQL as one statement of each kind, every
//! write still fenced on its own run's lease and answered on its own.
//!
//! For each kind a few lanes take turns at its queue. A lane takes every write waiting when it
//! gets there (up to `MAX_BATCH`) and writes them together; meanwhile the next writes gather for
//! the next free lane. Nothing waits on a timer: a write waits at most for the batches ahead of
//! it, and a write that finds the queue empty goes at once, as a batch of one. Durability is
//! unchanged: a run's write returns only once it is committed, so a turn is always committed
//! before that run's next provider call, and a call is reserved before it is made.
//!
//! A batch that fails writes nothing (one statement, one transaction), and each of its writes is
//! then made alone, with the usual retries: one bad write, or a database restart, fails only the
//! runs it should.

use std::sync::Arc;
use std::time::Instant;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::budget::{self as budget_sql, Reserve, ReserveWrite};
use super::events::{self, EventsWrite};
use super::runs::{self, Committed, TurnWrite};
use super::{retrying, StoreError};

/// The most writes in one statement: bounds a batch's time, and so any write's wait.
pub const MAX_BATCH: usize = 64;
/// Batches of one kind in flight at once. Two measured better than three (bigger batches: 1,098
/// and 1,121 tasks/s against 947 and 990, alternating, on 2 cores), with wait mode within target.
pub const LANES: usize = 2;

/// A write that can be made with others of its kind in one statement.
#[async_trait::async_trait]
pub trait Batch: Send + Sync + Sized + 'static {
    type Out: Send + 'static;
    /// The metrics' label for this kind.
    const KIND: &'static str;
    /// Many, in one statement: each one's result, in order. An error writes none of them.
    async fn together(pool: &PgPool, items: &[&Self]) -> Result<Vec<Self::Out>, StoreError>;
    /// This one by itself, once.
    async fn alone(&self, pool: &PgPool) -> Result<Self::Out, StoreError>;
}

#[async_trait::async_trait]
impl Batch for TurnWrite {
    type Out = Committed;
    const KIND: &'static str = "turn";
    async fn together(pool: &PgPool, items: &[&Self]) -> Result<Vec<Committed>, StoreError> {
        runs::commit_turns(pool, items).await
    }
    async fn alone(&self, pool: &PgPool) -> Result<Committed, StoreError> {
        let mut conn = pool.acquire().await?;
        self.commit_alone(&mut conn).await
    }
}

#[async_trait::async_trait]
impl Batch for ReserveWrite {
    type Out = Reserve;
    const KIND: &'static str = "reserve";
    async fn together(pool: &PgPool, items: &[&Self]) -> Result<Vec<Reserve>, StoreError> {
        budget_sql::reserve_many(pool, items).await
    }
    async fn alone(&self, pool: &PgPool) -> Result<Reserve, StoreError> {
        budget_sql::reserve(pool, self.fence, self.ask, self.defaults, self.event.as_ref()).await
    }
}

#[async_trait::async_trait]
impl Batch for EventsWrite {
    type Out = bool;
    const KIND: &'static str = "events";
    async fn together(pool: &PgPool, items: &[&Self]) -> Result<Vec<bool>, StoreError> {
        events::append_many(pool, items).await
    }
    async fn alone(&self, pool: &PgPool) -> Result<bool, StoreError> {
        events::append(pool, self.fence, &self.events).await
    }
}

/// The process's group committer: one queue and its lanes per kind of write.
pub struct Committer {
    pub turns: Batcher<TurnWrite>,
    pub reserves: Batcher<ReserveWrite>,
    pub events: Batcher<EventsWrite>,
}

impl Committer {
    /// Start the lanes on the current runtime. They stop when the committer is dropped.
    pub fn start(pool: PgPool) -> Arc<Committer> {
        Arc::new(Committer {
            turns: Batcher::start(pool.clone()),
            reserves: Batcher::start(pool.clone()),
            events: Batcher::start(pool),
        })
    }
}

struct Job<B: Batch> {
    item: B,
    queued: Instant,
    reply: oneshot::Sender<Result<B::Out, StoreError>>,
}

/// One kind's queue (see the module's note).
pub struct Batcher<B: Batch> {
    pool: PgPool,
    queue: mpsc::UnboundedSender<Job<B>>,
}

impl<B: Batch> Batcher<B> {
    fn start(pool: PgPool) -> Batcher<B> {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..LANES {
            tokio::spawn(lane(pool.clone(), rx.clone()));
        }
        Batcher { pool, queue }
    }

    /// Write `item` with whatever others of its kind are being written now; its result alone.
    pub async fn write(&self, item: B) -> Result<B::Out, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { item, queued: Instant::now(), reply };
        if let Err(mpsc::error::SendError(job)) = self.queue.send(job) {
            return alone(&self.pool, &job.item).await;
        }
        match answer.await {
            Ok(r) => r,
            // The lane went away without an answer (the runtime is stopping): the run stops this
            // attempt as for any failed write, and a rescue settles whatever was written.
            Err(_) => Err(StoreError::Db(sqlx::Error::PoolClosed)),
        }
    }
}

/// One lane: take what is queued, write it, answer each; again.
async fn lane<B: Batch>(pool: PgPool, rx: Arc<Mutex<mpsc::UnboundedReceiver<Job<B>>>>) {
    loop {
        let mut batch = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(job) => batch.push(job),
                None => return,
            }
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
        }
        let now = Instant::now();
        for j in &batch {
            metrics::histogram!("subagentd_write_queue_seconds", "kind" => B::KIND)
                .record((now - j.queued).as_secs_f64());
        }
        metrics::counter!("subagentd_write_batches_total", "kind" => B::KIND).increment(1);
        metrics::counter!("subagentd_writes_total", "kind" => B::KIND).increment(batch.len() as u64);
        write_batch(&pool, batch).await;
    }
}

async fn write_batch<B: Batch>(pool: &PgPool, batch: Vec<Job<B>>) {
    let result = if let [one] = batch.as_slice() {
        one.item.alone(pool).await.map(|r| vec![r])
    } else {
        let items: Vec<&B> = batch.iter().map(|j| &j.item).collect();
        B::together(pool, &items).await
    };
    match result {
        Ok(results) => {
            for (job, r) in batch.into_iter().zip(results) {
                let _ = job.reply.send(Ok(r));
            }
        }
        Err(e) => {
            // Nothing was written. Each write goes alone, with retries, off this lane.
            if batch.len() > 1 {
                tracing::warn!(error = %e, kind = B::KIND, writes = batch.len(), "group write failed; writing each alone");
            }
            for job in batch {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let r = alone(&pool, &job.item).await;
                    let _ = job.reply.send(r);
                });
            }
        }
    }
}

/// One write by itself, retried through short outages (`retrying`).
async fn alone<B: Batch>(pool: &PgPool, item: &B) -> Result<B::Out, StoreError> {
    retrying(pool, || item.alone(pool)).await
}
