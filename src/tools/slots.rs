//! The sandbox's slots: commands at once in this process, shared fairly between tenants. A
//! tenant holds at most its share of the slots (below the process's cap, so no tenant holds
//! them all), and a freed slot goes to the waiting tenants in turn, as claims do: the tenant
//! served longest ago first, each tenant's own commands in the order they asked.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The slots of one process.
pub struct Slots {
    state: Mutex<State>,
    cap: usize,
    share: usize,
}

#[derive(Default)]
struct State {
    free: usize,
    /// Slots each tenant holds now.
    held: HashMap<String, usize>,
    /// Each tenant's waiting commands, oldest first.
    waiting: HashMap<String, VecDeque<oneshot::Sender<Slot>>>,
    /// The tenants with waiting commands, the next to be served first.
    turn: VecDeque<String>,
    /// Commands refused because the process shuts down.
    closed: bool,
}

/// One slot, held while a command runs: given back when dropped.
pub struct Slot {
    slots: Option<Arc<Slots>>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(s) = self.slots.take() {
            s.give_back(&self.tenant);
        }
    }
}

impl Slots {
    /// `cap` slots; a tenant holds at most `share` of them (0: half the cap), never all of a cap
    /// over one.
    pub fn new(cap: usize, share: usize) -> Arc<Slots> {
        let cap = cap.max(1);
        let share = if share == 0 { (cap / 2).max(1) } else { share.min(cap) };
        Arc::new(Slots { state: Mutex::new(State { free: cap, ..Default::default() }), cap, share })
    }

    /// Commands at once in the process.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Commands at once for one tenant.
    pub fn share(&self) -> usize {
        self.share
    }

    /// A slot for a command of `tenant`: at once if one is free and the tenant holds less than
    /// its share, else when its turn comes. `None` once the process shuts down.
    pub async fn take(self: &Arc<Self>, tenant: &str) -> Option<Slot> {
        let rx = {
            let mut st = self.lock();
            if st.closed {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            let queue = st.waiting.entry(tenant.to_string()).or_default();
            queue.push_back(tx);
            if queue.len() == 1 {
                st.turn.push_back(tenant.to_string());
            }
            self.dispatch(&mut st);
            rx
        };
        // A waiter that gives up (its run stopped) drops the receiver; a slot already sent to
        // it is dropped with the channel, and so given back.
        rx.await.ok()
    }

    /// No more slots: waiting commands are answered `None`.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.waiting.clear();
        st.turn.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(self: &Arc<Self>, tenant: &str) {
        let mut st = self.lock();
        st.free += 1;
        if let Some(n) = st.held.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                st.held.remove(tenant);
            }
        }
        self.dispatch(&mut st);
    }

    /// Hand free slots to waiting commands: the tenants in turn, each below its share.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        let mut passed = 0;
        while st.free > 0 && passed < st.turn.len() {
            let Some(tenant) = st.turn.pop_front() else { break };
            if st.held.get(&tenant).copied().unwrap_or(0) >= self.share {
                // At its share: it keeps its place, the next tenant is asked.
                st.turn.push_back(tenant);
                passed += 1;
                continue;
            }
            let Some(queue) = st.waiting.get_mut(&tenant) else { continue };
            let mut served = false;
            while let Some(tx) = queue.pop_front() {
                if tx.is_closed() {
                    continue;
                }
                st.free -= 1;
                *st.held.entry(tenant.clone()).or_default() += 1;
                let slot = Slot { slots: Some(self.clone()), tenant: tenant.clone() };
                match tx.send(slot) {
                    Ok(()) => {
                        served = true;
                        break;
                    }
                    Err(mut slot) => {
                        // Gone between the check and the send: undone here, not by its drop
                        // (which would take the lock this holds).
                        slot.slots = None;
                        st.free += 1;
                        *st.held.entry(tenant.clone()).or_default() -= 1;
                    }
                }
            }
            if queue.is_empty() {
                st.waiting.remove(&tenant);
            } else {
                // Served (or not): to the back of the turn.
                st.turn.push_back(tenant.clone());
            }
            if st.held.get(&tenant) == Some(&0) {
                st.held.remove(&tenant);
            }
            passed = if served { 0 } else { passed + 1 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn soon(s: &Arc<Slots>, tenant: &str) -> Option<Slot> {
        tokio::time::timeout(Duration::from_millis(50), s.take(tenant)).await.ok().flatten()
    }

    #[tokio::test]
    async fn a_tenant_never_holds_every_slot_and_another_gets_one_at_once() {
        let s = Slots::new(2, 0);
        assert_eq!(s.share(), 1);
        let a1 = soon(&s, "a").await.expect("a's first command starts");
        assert!(soon(&s, "a").await.is_none(), "a's second waits: its share is 1");
        let b1 = soon(&s, "b").await.expect("b starts at once beside a");
        drop((a1, b1));
        assert!(soon(&s, "a").await.is_some(), "a slot given back is taken again");
    }

    #[tokio::test]
    async fn waiting_tenants_are_served_in_turn() {
        let s = Slots::new(1, 1);
        let first = s.take("a").await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = vec![];
        for (i, t) in ["a", "a", "a", "b", "c"].into_iter().enumerate() {
            let (s, order) = (s.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let slot = s.take(t).await.unwrap();
                order.lock().unwrap().push(format!("{t}{i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        // a waited first, so a goes first; then b and c before a's next ones.
        assert_eq!(*order.lock().unwrap(), ["a0", "b3", "c4", "a1", "a2"]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_slot() {
        let s = Slots::new(1, 1);
        let held = s.take("a").await.unwrap();
        assert!(soon(&s, "b").await.is_none(), "b gave up waiting");
        drop(held);
        assert!(soon(&s, "c").await.is_some(), "the slot went to c, not to the gone waiter");
        s.close();
        assert!(s.take("d").await.is_none());
    }
}
