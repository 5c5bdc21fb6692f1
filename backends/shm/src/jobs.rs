//! The job queue from a backend's issuing threads to its progress thread: `std::sync::mpsc`'s
//! interface (one sender, one receiver, `recv` / `try_recv` / `recv_timeout`, disconnection when
//! either side is dropped), without its blocking receive's back-off. std's receive spins and then
//! calls `sched_yield` four times before it sleeps, and the progress thread blocks there after
//! every op: each op of each rank paid those system calls, most of them for nothing (the caller
//! is busy checking the result it was just woken for). Here a receive that finds the queue empty
//! sleeps on a condition variable at once, and a send wakes it only when it sleeps.

use std::collections::VecDeque;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct State<T> {
    items: VecDeque<T>,
    /// The sender still exists.
    sender: bool,
    /// The receiver still exists.
    receiver: bool,
    /// The receiver sleeps on `ready`.
    sleeping: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending side (dropping it disconnects the receiver once the queue is drained).
pub struct Sender<T>(Arc<Shared<T>>);

/// The receiving side (dropping it makes every later send fail, and drops what is queued).
pub struct Receiver<T>(Arc<Shared<T>>);

/// A new queue.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { items: VecDeque::new(), sender: true, receiver: true, sleeping: false }),
        ready: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `item`; gives it back when the receiver is gone.
    pub fn send(&self, item: T) -> Result<(), T> {
        let mut s = self.0.lock();
        if !s.receiver {
            return Err(item);
        }
        s.items.push_back(item);
        if s.sleeping {
            self.0.ready.notify_one();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.sender = false;
        if s.sleeping {
            self.0.ready.notify_one();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item, or `Disconnected` once the sender is gone and the queue is empty.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut s = self.0.lock();
        s.items.pop_front().ok_or(if s.sender { TryRecvError::Empty } else { TryRecvError::Disconnected })
    }

    /// The next item, waiting as long as it takes; `None` once the sender is gone and the queue
    /// is empty.
    pub fn recv(&self) -> Option<T> {
        self.wait(None).ok()
    }

    /// The next item, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.wait(Some(Instant::now() + timeout))
    }

    fn wait(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let mut s = self.0.lock();
        loop {
            if let Some(item) = s.items.pop_front() {
                return Ok(item);
            }
            if !s.sender {
                return Err(RecvTimeoutError::Disconnected);
            }
            s.sleeping = true;
            s = match deadline {
                None => self.0.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        s.sleeping = false;
                        return Err(RecvTimeoutError::Timeout);
                    }
                    self.0.ready.wait_timeout(s, d - now).unwrap_or_else(|e| e.into_inner()).0
                }
            };
            s.sleeping = false;
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let items = {
            let mut s = self.0.lock();
            s.receiver = false;
            std::mem::take(&mut s.items)
        };
        drop(items); // outside the lock: an item's drop may do anything
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_arrive_in_order_and_a_sleeping_receiver_is_woken() {
        let (tx, rx) = channel();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.recv(), Some(2));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send(3).unwrap();
            tx
        });
        assert_eq!(rx.recv(), Some(3), "woken by a send while sleeping");
        let tx = t.join().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(tx);
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Err(RecvTimeoutError::Disconnected), "woken by the sender's drop");
        t.join().unwrap();
    }

    #[test]
    fn disconnection_both_ways() {
        let (tx, rx) = channel();
        tx.send(7).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(7), "what was queued before the sender went is still received");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.recv(), None);

        let (tx, rx) = channel();
        let item = Arc::new(());
        tx.send(item.clone()).unwrap();
        drop(rx);
        assert_eq!(Arc::strong_count(&item), 1, "the receiver's drop drops what was queued");
        assert!(tx.send(item).is_err(), "a send after the receiver went fails");
    }
}
