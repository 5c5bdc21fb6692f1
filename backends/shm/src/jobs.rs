//! The job queue from a backend's issuing threads to its progress thread: `std::sync::mpsc`'s
//! interface (one sender, one receiver, `recv` / `try_recv` / `recv_timeout`, disconnection when
//! either side is dropped), without its blocking receive's back-off. std's receive spins and then
//! calls `sched_yield` four times before it sleeps, and the progress thread blocks there after
//! every op: each op of each rank paid those system calls, most of them for nothing (the caller
//! is busy checking the result it was just woken for). Here a receive that finds the queue empty
//! sleeps on a condition variable at once, and a send wakes it only when it sleeps.
//!
//! The progress thread does not pop in its sleep any more ([`Receiver::wait_ready`]): items are
//! popped only by the holder of the engine (the progress thread or a caller running its own op
//! inline, `exec.rs`), so that ops run in issue order whoever runs them. Its sleep is *light*
//! (timed, [`TICK`]) for [`LIGHT_WINDOW`] after the last item was queued, then *deep*. A
//! collective queued during a light sleep does not wake it ([`Sender::send_quiet`]): its caller
//! will most likely wait for it at once and run it inline; if nobody does, the next tick runs it.

use std::collections::VecDeque;
#[cfg(test)]
use std::sync::mpsc::RecvTimeoutError;
use std::sync::mpsc::TryRecvError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How the receiver sleeps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sleep {
    Awake,
    /// A timed sleep of one [`TICK`]: a quiet send does not wake it.
    Light,
    /// Until woken: every send wakes it.
    Deep,
}

/// A light sleep's length: the longest a collective nobody waits for (or polls) stays queued
/// while the thread is in its light window.
pub const TICK: Duration = Duration::from_millis(5);
/// How long after the last queued item the receiver's sleep stays light.
pub const LIGHT_WINDOW: Duration = Duration::from_millis(50);

struct State<T> {
    items: VecDeque<T>,
    /// When the last item was queued.
    last: Instant,
    /// The engine has work of its own (queued point-to-point ops, a close to finish): the
    /// receiver must not sleep past it ([`Waker::set_pending`]).
    pending: bool,
    /// The sender still exists.
    sender: bool,
    /// The receiver still exists.
    receiver: bool,
    /// The receiver sleeps on `ready`.
    sleeping: Sleep,
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
        state: Mutex::new(State {
            items: VecDeque::new(),
            last: Instant::now(),
            pending: false,
            sender: true,
            receiver: true,
            sleeping: Sleep::Awake,
        }),
        ready: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `item` and wakes a sleeping receiver; gives it back when the receiver is gone.
    pub fn send(&self, item: T) -> Result<(), T> {
        self.push(item, true)
    }

    /// Queues `item`, waking the receiver only from a deep sleep (a light sleep ends by itself
    /// within a [`TICK`]).
    pub fn send_quiet(&self, item: T) -> Result<(), T> {
        self.push(item, false)
    }

    fn push(&self, item: T, urgent: bool) -> Result<(), T> {
        let mut s = self.0.lock();
        if !s.receiver {
            return Err(item);
        }
        s.items.push_back(item);
        s.last = Instant::now();
        if s.sleeping == Sleep::Deep || (urgent && s.sleeping == Sleep::Light) {
            self.0.ready.notify_one();
        }
        Ok(())
    }
}

/// A handle on the queue for the engine's other holders: wakes the receiver and tells it about
/// the engine's own pending work.
pub struct Waker<T>(Arc<Shared<T>>);

impl<T> Waker<T> {
    /// Wakes the receiver if it sleeps (a caller that will wait for its op on the receiver).
    pub fn wake(&self) {
        let s = self.0.lock();
        if s.sleeping != Sleep::Awake {
            self.0.ready.notify_one();
        }
    }

    /// Records whether the engine has pending work of its own; wakes the receiver if so.
    pub fn set_pending(&self, pending: bool) {
        let mut s = self.0.lock();
        s.pending = pending;
        if pending && s.sleeping != Sleep::Awake {
            self.0.ready.notify_one();
        }
    }

    /// Whether the receiver is in a light sleep now (tests).
    #[cfg(test)]
    fn sleeping_light(&self) -> bool {
        self.0.lock().sleeping == Sleep::Light
    }

    /// Sleeps (without popping) until an item is queued, the sender is gone or the engine has
    /// pending work ([`Waker::set_pending`]); `nap` (the engine has pending work): at most that
    /// long, woken by any send.
    /// Without `nap` the sleep is light (one [`TICK`] at a time, not woken by a quiet send)
    /// until [`LIGHT_WINDOW`] after the last item was queued, then deep.
    pub fn wait_ready(&self, nap: Option<Duration>) {
        let mut s = self.0.lock();
        let until = nap.map(|d| Instant::now() + d);
        loop {
            if !s.items.is_empty() || !s.sender || (s.pending && nap.is_none()) {
                return;
            }
            let now = Instant::now();
            let (mode, limit) = match until {
                Some(u) if now >= u => return,
                Some(u) => (Sleep::Deep, Some(u - now)),
                None if now < s.last + LIGHT_WINDOW => (Sleep::Light, Some(TICK)),
                None => (Sleep::Deep, None),
            };
            s.sleeping = mode;
            s = match limit {
                None => self.0.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(d) => self.0.ready.wait_timeout(s, d).unwrap_or_else(|e| e.into_inner()).0,
            };
            s.sleeping = Sleep::Awake;
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.sender = false;
        if s.sleeping != Sleep::Awake {
            self.0.ready.notify_one();
        }
    }
}

impl<T> Receiver<T> {
    /// A [`Waker`] for this queue.
    pub fn waker(&self) -> Waker<T> {
        Waker(self.0.clone())
    }

    /// The next item, or `Disconnected` once the sender is gone and the queue is empty.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut s = self.0.lock();
        s.items.pop_front().ok_or(if s.sender { TryRecvError::Empty } else { TryRecvError::Disconnected })
    }

    #[cfg(test)]
    /// The next item, waiting as long as it takes; `None` once the sender is gone and the queue
    /// is empty.
    pub fn recv(&self) -> Option<T> {
        self.wait(None).ok()
    }

    /// The next item, waiting up to `timeout`.
    #[cfg(test)]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.wait(Some(Instant::now() + timeout))
    }

    #[cfg(test)]
    fn wait(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let mut s = self.0.lock();
        loop {
            if let Some(item) = s.items.pop_front() {
                return Ok(item);
            }
            if !s.sender {
                return Err(RecvTimeoutError::Disconnected);
            }
            s.sleeping = Sleep::Deep;
            s = match deadline {
                None => self.0.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        s.sleeping = Sleep::Awake;
                        return Err(RecvTimeoutError::Timeout);
                    }
                    self.0.ready.wait_timeout(s, d - now).unwrap_or_else(|e| e.into_inner()).0
                }
            };
            s.sleeping = Sleep::Awake;
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

    #[test]
    fn a_quiet_send_leaves_a_light_sleep_alone_and_wakes_a_deep_one() {
        let (tx, rx) = channel::<u32>();
        let w = rx.waker();
        // Light: an item was just queued (and taken), so the sleep is one tick at a time.
        tx.send(0).unwrap();
        assert_eq!(rx.try_recv(), Ok(0));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            tx.send_quiet(1).unwrap();
            tx
        });
        let t0 = Instant::now();
        w.wait_ready(None);
        let tx = t.join().unwrap();
        assert_eq!(rx.try_recv(), Ok(1));
        assert!(t0.elapsed() < TICK * 20, "a light sleep ends within its tick, woken or not");
        // ... and a quiet send does not end it: the sleeper wakes at its tick's end. Sent as
        // soon as the sleep is seen light; over a few trials the latest wake-up after the send
        // is most of a tick (a woken sleeper returns within microseconds of every send).
        let (tx, w) = (Arc::new(tx), Arc::new(w));
        let mut latest = Duration::ZERO;
        for i in 0..6u32 {
            tx.send(100 + 2 * i).unwrap();
            assert_eq!(rx.try_recv(), Ok(100 + 2 * i));
            let (tx2, w2) = (tx.clone(), w.clone());
            let sender = std::thread::spawn(move || {
                let give_up = Instant::now() + Duration::from_secs(5);
                while !w2.sleeping_light() && Instant::now() < give_up {
                    std::hint::spin_loop();
                }
                let at = Instant::now();
                tx2.send_quiet(101 + 2 * i).unwrap();
                at
            });
            w.wait_ready(None);
            let woke = Instant::now();
            let sent = sender.join().unwrap();
            assert_eq!(rx.try_recv(), Ok(101 + 2 * i));
            latest = latest.max(woke.saturating_duration_since(sent));
        }
        assert!(latest >= TICK / 2, "a quiet send woke a light sleep: the latest wake-up came {latest:?} after its send");
        let (tx, w) = (Arc::into_inner(tx).expect("one sender"), Arc::into_inner(w).expect("one waker"));
        // Pending work of the engine ends the wait at once; a nap ignores it.
        w.set_pending(true);
        let t0 = Instant::now();
        w.wait_ready(None);
        assert!(t0.elapsed() < Duration::from_secs(1));
        w.wait_ready(Some(Duration::from_millis(5)));
        assert!(t0.elapsed() >= Duration::from_millis(5), "a nap runs its length while only the engine's own work is pending");
        w.set_pending(false);
        // Deep (past the light window): a quiet send wakes it (checked with a deadline: a
        // sleeper that was not woken is released by the sender's drop below).
        std::thread::sleep(LIGHT_WINDOW + Duration::from_millis(5));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            w.wait_ready(None);
            let _ = done_tx.send(());
            w
        });
        std::thread::sleep(Duration::from_millis(30));
        tx.send_quiet(2).unwrap();
        let woken = done_rx.recv_timeout(Duration::from_secs(10));
        drop(tx);
        let w = sleeper.join().unwrap();
        assert!(woken.is_ok(), "a quiet send wakes a deep sleep");
        assert_eq!(rx.try_recv(), Ok(2));
        w.wait_ready(None); // the sender is gone: returns at once
    }
}
