//! Point to point (issue 10): several messages in flight between one pair, received in issue
//! order; `irecv` before `isend`; more sends in flight than a backend's ring holds.
//!
//! * `p2p::in_flight_in_order::{sizes,same_size}::n4::ws{2,4}` — every rank issues 4 sends to its
//!   partner, then 4 receives, then waits: message `k` lands in receive `k` (different sizes:
//!   a reordering is a size mismatch; equal sizes: wrong values). At ws4 two pairs run at once.
//! * `p2p::in_flight_in_order::sizes::n17::ws2`, `...::same_size::n40::ws4` — more sends in
//!   flight both ways than shm's 16-slot ring, before any receive.
//! * `p2p::in_flight_in_order::same_size::n80::ws2` — 80 sends in flight both ways before any
//!   receive: a backend with a bounded credit window per peer (64, say) must queue, not block
//!   the 65th send at issue.
//! * `p2p::in_flight_in_order::mixed_protocols::ws2` — 1 MiB, 4-element, 512 KiB and 1-element
//!   messages alternate: a large message (rendezvous path) must not be overtaken by the small
//!   one issued after it (eager path).
//! * `p2p::in_order_across_other_traffic::ws3` — rank 0 sends to rank 2 (received once message 0 is issued),
//!   then message 0 to rank 1, waits for the send to 2, then message 1 to rank 1: traffic to
//!   another peer must not reorder the pair's messages.
//! * `p2p::group_and_world_messages_apart::ws2` — a group message and a world message between
//!   the same two ranks, received in the other order: matched per communicator.
//! * `p2p::recv_first_one_side::ws2` — rank 0 `irecv; isend`, rank 1 `isend; irecv`.
//! * `p2p::recv_first_both::n{1,20}::ws2` — `irecv(p); isend(p)` on both ranks.
//! * `p2p::ring_exchange::large::ws3` — every rank `isend(next); irecv(prev)` with 1 MiB
//!   messages, then waits: a ring shift (a transport grouping only one peer's send and receive
//!   deadlocks from 3 ranks on).
//! * `p2p::pair_first_on_new_group::ws3` — a new group's first op is a send / recv between two of
//!   its three members, while the third issues nothing until the pair is done: a backend whose
//!   first op runs a collective init over every member waits for it.
//! * `p2p::many_sends_one_way::n17::ws2` — rank 0 sends 17 messages before it receives; rank 1
//!   receives all 17 first, then sends 17 back.
//! * `p2p::sends_first_both::large::ws2` — `isend(p); irecv(p)` on both ranks with 1 MiB
//!   messages: a rendezvous protocol for large messages must not block the send at issue.
//! * `p2p::recv_before_barrier::ws2` — rank 0 `irecv(1); barrier; wait`, rank 1
//!   `barrier; isend(0); wait`: the receive, issued first, must not hold back the barrier.
//! * `p2p::send_behind_pending_collective::ws2` — rank 0 `all_reduce; isend(1)`, rank 1
//!   `irecv(0); wait; all_reduce`: a collective still waiting for its peer must not hold back a
//!   send issued after it (shm's progress thread used to wait for the collective's peers first;
//!   both ranks timed out). Once the send completed, the all_reduce is still pending
//!   (`is_completed()` false, a short wait a named timeout) until rank 1, told through the
//!   store, issues its side: a work's completion is its own op's, not the last posted one's
//!   (ai-dynamo/nixl PR #2176) nor one a wait-any retired in its neighbour's place
//!   (open-mpi/ompi PR #1725).
//! * `p2p::recv_behind_pending_collective::ws2` — the mirror: rank 1 `all_reduce; irecv(0)`,
//!   rank 0 `isend(1); wait; all_reduce` (a receive queued behind the collectives deadlocks);
//!   rank 1's all_reduce is still pending once its receive completed, as above.
//! * `p2p::send_behind_pending_collective::fresh_group::ws2` — the same on a new group that has
//!   run nothing yet: a lazily connecting backend's first collective waits for the peer inside
//!   its launch (NCCL: the connection), which must not hold the send back.
//!
//! shm issue 15 item 9 (one in-order progress thread that blocked in a receive, or in a send
//! beyond its ring, so `irecv; isend` on both ranks and 17 sends then 17 receives on both ranks
//! deadlocked) is fixed in `backends/shm/src/exec.rs`: queued point-to-point ops no longer block
//! the progress thread. Every legal pattern here is in the default catalogue.

use super::util::{expect_eq, fail, here, take_key, ArVehicle};
use crate::case::{Case, CaseEnd, CaseMeta, CaseResult, Ctx};
use crate::values::partner;
use concord_core::{Backend, DType, Tensor, Variant};

fn meta() -> CaseMeta {
    CaseMeta { suite: "p2p".into(), op: "send_recv".into(), variant: "outbuf".into(), dtype: "f32".into(), reduce: "-".into() }
}

/// Message `k` from rank `src`: `len` elements, distinct per (src, k, element).
fn message(src: usize, k: usize, len: usize) -> Tensor {
    Tensor::from_vec(&[len], (0..len).map(|i| (src * 10_000 + k * 100 + i % 100) as f32).collect())
}

/// Rank 0 `all_reduce; isend(1)`, then waits for both; rank 1 `irecv(0); wait; all_reduce`, on
/// `b` (the world or a group of ranks 0 and 1). Once its send completed, rank 0 checks that its
/// all_reduce is still pending ([`still_pending`]): rank 1 issues its side only after that (a
/// store key under `tag`).
fn send_behind_collective<B: Backend, C: Backend>(ctx: &Ctx<'_, C>, b: &B, tag: &str, w: &str) -> CaseResult {
    let timeout = ctx.timeout;
    // The pending collective only carries the check: an all_reduce the backend supports.
    let v = ArVehicle::pick(b, &[Variant::Out])?;
    let w = &format!("{w} (all_reduce reduce={})", v.op.name());
    let key = format!("{}/{}/{tag}/pending_checked", ctx.case, ctx.world.world_id);
    let x = b.upload(&Tensor::from_vec(&[4], vec![(b.rank() + 1) as f32; 4]))?;
    let sum = v.expected(2, |r| vec![(r + 1) as f32; 4]);
    if b.rank() == 0 {
        let ar = b.all_reduce(&x, v.op)?;
        let y = b.upload(&message(0, 0, 16))?;
        let s = b.send(&y, 1)?;
        let sent = s.wait(timeout).map_err(|e| fail(w, format!("send issued behind a pending all_reduce: {e} [{}]", e.name())));
        // The peer goes on whatever this rank saw (it issues its all_reduce once told).
        let verdict = sent.and_then(|_| still_pending(&ar, "the send", w));
        ctx.store.set(&key, b"1").map_err(|e| fail(w, e))?;
        let out = ar.wait(timeout).map_err(|e| fail(w, format!("all_reduce: {e} [{}]", e.name())));
        verdict?;
        expect_eq(b, out?, &sum, w)
    } else {
        let out = b.upload(&Tensor::zeros(DType::F32, &[16]))?;
        let r = b.recv(&out, 0)?;
        let got = r.wait(timeout).map_err(|e| fail(w, format!("receive: {e} [{}]", e.name())));
        take_key(ctx, &key, w, "rank 0 never said it had looked at its pending all_reduce")?;
        expect_eq(b, got?, &message(0, 0, 16), w)?;
        let ar = b.all_reduce(&x, v.op)?;
        let res = ar.wait(timeout).map_err(|e| fail(w, format!("all_reduce: {e} [{}]", e.name())))?;
        expect_eq(b, res, &sum, w)
    }
}

/// How long [`still_pending`] waits on an all_reduce its peer has not issued.
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Clause `async.every_op_every_rank`: `ar`, an all_reduce issued before a point-to-point op
/// (`later`) that has completed, still waits for its peer (which issues its side only once this
/// rank has looked): `is_completed()` MUST be false and `wait(PENDING_WAIT)` a named timeout. A
/// work's completion is its own op's: a check that reads the last posted request, or a wait that
/// retires the request before the one it saw complete, reports the all_reduce done with its
/// buffer not reduced.
fn still_pending<T>(ar: &concord_core::Work<T>, later: &str, w: &str) -> CaseResult {
    if ar.is_completed() {
        return Err(fail(
            w,
            format!("is_completed() of the all_reduce was true once {later} issued after it had completed, while the peer had not issued the all_reduce yet: a work's completion is its own op's"),
        ));
    }
    match ar.wait(PENDING_WAIT) {
        Ok(_) => Err(fail(
            w,
            format!("wait({PENDING_WAIT:?}) on the all_reduce returned Ok once {later} issued after it had completed, while the peer had not issued the all_reduce yet (its result cannot be there)"),
        )),
        Err(e) if e.name() == "timeout" => Ok(()),
        Err(e) => Err(fail(w, format!("wait({PENDING_WAIT:?}) on the all_reduce its peer had not issued: expected a named timeout, got {e} [{}]", e.name()))),
    }
}

/// The mirror of [`send_behind_collective`]: rank 1 `all_reduce; irecv(0)`, then waits for
/// both; rank 0 `isend(1); wait; all_reduce`. The all_reduce pending on rank 1 (its peer is in a
/// send) must not hold back the receive issued after it; once the receive completed it is still
/// pending ([`still_pending`]: rank 0 issues its all_reduce only after rank 1 looked).
fn recv_behind_collective<B: Backend, C: Backend>(ctx: &Ctx<'_, C>, b: &B, w: &str) -> CaseResult {
    let timeout = ctx.timeout;
    // The pending collective only carries the check: an all_reduce the backend supports.
    let v = ArVehicle::pick(b, &[Variant::Out])?;
    let w = &format!("{w} (all_reduce reduce={})", v.op.name());
    let key = format!("{}/{}/pending_checked", ctx.case, ctx.world.world_id);
    let x = b.upload(&Tensor::from_vec(&[4], vec![(b.rank() + 1) as f32; 4]))?;
    let sum = v.expected(2, |r| vec![(r + 1) as f32; 4]);
    if b.rank() == 1 {
        let ar = b.all_reduce(&x, v.op)?;
        let out = b.upload(&Tensor::zeros(DType::F32, &[16]))?;
        let r = b.recv(&out, 0)?;
        let got = r.wait(timeout).map_err(|e| fail(w, format!("receive issued behind a pending all_reduce: {e} [{}]", e.name())));
        // The peer goes on whatever this rank saw (it issues its all_reduce once told).
        let verdict = got.and_then(|got| expect_eq(b, got, &message(0, 0, 16), w)).and_then(|_| still_pending(&ar, "the receive", w));
        ctx.store.set(&key, b"1").map_err(|e| fail(w, e))?;
        let res = ar.wait(timeout).map_err(|e| fail(w, format!("all_reduce: {e} [{}]", e.name())));
        verdict?;
        expect_eq(b, res?, &sum, w)
    } else {
        let y = b.upload(&message(0, 0, 16))?;
        let send = b.send(&y, 1)?;
        let sent = send.wait(timeout).map(|_| ()).map_err(|e| fail(w, format!("send: {e} [{}]", e.name())));
        take_key(ctx, &key, w, "rank 1 never said it had looked at its pending all_reduce")?;
        sent?;
        let out = b.all_reduce(&x, v.op)?.into_value(timeout).map_err(|e| fail(w, format!("all_reduce: {e} [{}]", e.name())))?;
        expect_eq(b, &out, &sum, w)
    }
}

/// How long rank 0 polls its send's `is_completed()` before the receiver posts.
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Rank 0 issues a send to rank 1, which has not posted its receive yet, and polls
/// `is_completed()` for [`POLL`]: if the send says it is done, its buffer is the caller's again,
/// and rank 0 overwrites it with zeros. Only then (a store key) does rank 1 receive: it must get
/// what was sent. A backend whose send is still pending (rendezvous), or which staged the data
/// (a correct eager send), passes; one that reports an eager send complete while it still reads
/// the caller's buffer later (zero-copy) delivers the zeros.
fn send_buffer_reused_once_completed<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let w = format!(
        "{} (rank 0: isend, poll is_completed, reuse the buffer if done; rank 1: then irecv)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let key = format!("{}/{}/send_polled", ctx.case, ctx.world.world_id);
    let sent = message(0, 0, 64);
    if b.rank() == 0 {
        let x = b.upload(&sent)?;
        let s = b.send(&x, 1)?;
        let t0 = std::time::Instant::now();
        let done = loop {
            if s.is_completed() {
                break true;
            }
            if t0.elapsed() > POLL {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        if done {
            b.write(&x, &Tensor::zeros(DType::F32, &[64]))?;
        }
        ctx.store.set(&key, if done { b"done" } else { b"pending" }).map_err(|e| fail(&w, e))?;
        s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send: {e} [{}]", e.name())))?;
        Ok(())
    } else {
        let polled = take_key(ctx, &key, &w, "rank 0 never polled its send")?;
        let out = b.upload(&Tensor::zeros(DType::F32, &[64]))?;
        let got = b.recv(&out, 0)?.into_value(ctx.timeout).map_err(|e| fail(&w, format!("receive: {e} [{}]", e.name())))?;
        let why = if polled == b"done" {
            "rank 0's send said is_completed() before this rank posted its receive, and rank 0 then reused its buffer: the send still read it"
        } else {
            "the send was still pending when this rank posted its receive"
        };
        expect_eq(b, &got, &sent, &format!("{w}: {why}"))
    }
}

/// Order of issue on one rank.
#[derive(Clone, Copy)]
enum Order {
    SendsFirst,
    RecvsFirst,
}

/// The lengths of the messages of an exchange.
#[derive(Clone, Copy)]
enum Sizes {
    /// 1 to 1000 elements (all below any eager limit): a reordering is a size mismatch.
    Varied,
    /// 16 elements each: a reordering is wrong values.
    Same,
    /// 1 MiB, 4 elements, 512 KiB + 12 bytes, 1 element: large and small messages alternate, so
    /// a transport with one path for large messages (rendezvous) and one for small (eager) must
    /// still deliver them in issue order.
    Mixed,
}

impl Sizes {
    fn len(self, k: usize) -> usize {
        match self {
            Sizes::Varied => [1, 7, 64, 1000][k % 4] + k,
            Sizes::Same => 16,
            Sizes::Mixed => [1 << 18, 4, (1 << 17) + 3, 1][k % 4],
        }
    }
}

/// Issues `n` sends to the partner and `n` receives from it in `order`, then waits for all, and
/// checks message `k` landed in receive `k`.
fn exchange<B: Backend>(ctx: &Ctx<'_, B>, n: usize, sizes: Sizes, order: Order) -> CaseResult {
    let b = ctx.b;
    let (me, ws) = (b.rank(), b.world_size());
    let Some(peer) = partner(me, ws) else { return Ok(()) };
    let len = |k: usize| sizes.len(k);
    let w = format!("{} peer={peer} messages={n}", here(b, "send_recv", "outbuf", DType::F32));
    let sends: Vec<B::Buffer> = (0..n).map(|k| b.upload(&message(me, k, len(k)))).collect::<Result<_, _>>()?;
    let outs: Vec<B::Buffer> = (0..n).map(|k| b.upload(&Tensor::zeros(DType::F32, &[len(k)]))).collect::<Result<_, _>>()?;
    // Issue errors name the case too (a receive that blocks at issue ends here, in a timeout).
    let issue_sends = || {
        sends
            .iter()
            .map(|x| b.send(x, peer))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(&w, format!("issuing the sends: {e} [{}]", e.name())))
    };
    let issue_recvs = || {
        outs.iter()
            .map(|o| b.recv(o, peer))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(&w, format!("issuing the receives: {e} [{}]", e.name())))
    };
    let (sw, rw) = match order {
        Order::SendsFirst => {
            let s = issue_sends()?;
            (s, issue_recvs()?)
        }
        Order::RecvsFirst => {
            let r = issue_recvs()?;
            (issue_sends()?, r)
        }
    };
    for (k, r) in rw.iter().enumerate() {
        let got = r.wait(ctx.timeout).map_err(|e| fail(&w, format!("receive #{k}: {e} [{}]", e.name())))?;
        expect_recv(b, got, &outs[k], &message(peer, k, len(k)), &format!("{w} receive #{k} (messages must arrive in issue order)"))?;
    }
    for (k, s) in sw.iter().enumerate() {
        s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send #{k}: {e} [{}]", e.name())))?;
    }
    Ok(())
}

/// A recv's result: the buffer `recv` returned MUST be `out` itself, and `out` holds the
/// message (checking only the returned buffer would pass a recv that lands in its own staging
/// buffer and leaves `out` untouched).
fn expect_recv<B: Backend>(b: &B, got: &B::Buffer, out: &B::Buffer, expected: &Tensor, w: &str) -> Result<(), CaseEnd> {
    if b.buffer_addr(got) != b.buffer_addr(out) {
        return Err(fail(
            w,
            format!("recv returned a buffer (0x{:x}) other than its out (0x{:x})", b.buffer_addr(got), b.buffer_addr(out)),
        ));
    }
    expect_eq(b, out, expected, w)
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    for ws in [2, 4] {
        for (tag, sizes) in [("sizes", Sizes::Varied), ("same_size", Sizes::Same)] {
            v.push(Case::<B>::new(format!("p2p::in_flight_in_order::{tag}::n4::ws{ws}"), meta(), ws, move |ctx| {
                exchange(ctx, 4, sizes, Order::SendsFirst)
            }));
        }
    }
    v.push(Case::<B>::new("p2p::in_flight_in_order::sizes::n17::ws2", meta(), 2, |ctx| {
        exchange(ctx, 17, Sizes::Varied, Order::SendsFirst)
    }));
    v.push(Case::<B>::new("p2p::in_flight_in_order::same_size::n40::ws4", meta(), 4, |ctx| {
        exchange(ctx, 40, Sizes::Same, Order::SendsFirst)
    }));
    v.push(Case::<B>::new("p2p::in_flight_in_order::same_size::n80::ws2", meta(), 2, |ctx| {
        exchange(ctx, 80, Sizes::Same, Order::SendsFirst)
    }));
    v.push(Case::<B>::new("p2p::in_flight_in_order::mixed_protocols::ws2", meta(), 2, |ctx| {
        exchange(ctx, 4, Sizes::Mixed, Order::SendsFirst)
    }));
    v.push(Case::<B>::new("p2p::recv_first_one_side::ws2", meta(), 2, |ctx| {
        let order = if ctx.rank() == 0 { Order::RecvsFirst } else { Order::SendsFirst };
        exchange(ctx, 1, Sizes::Varied, order)
    }));
    for n in [1, 20] {
        v.push(Case::<B>::new(format!("p2p::recv_first_both::n{n}::ws2"), meta(), 2, move |ctx| {
            exchange(ctx, n, Sizes::Varied, Order::RecvsFirst)
        }));
    }
    v.push(Case::<B>::new("p2p::recv_before_barrier::ws2", meta(), 2, |ctx| {
        let b = ctx.b;
        let w = format!("{} (rank 0: irecv, barrier; rank 1: barrier, isend)", here(b, "send_recv", "outbuf", DType::F32));
        if b.rank() == 0 {
            let out = b.upload(&Tensor::zeros(DType::F32, &[16]))?;
            let r = b.recv(&out, 1)?;
            b.barrier()?
                .wait(ctx.timeout)
                .map_err(|e| fail(&w, format!("the barrier issued after a pending receive: {e} [{}]", e.name())))?;
            let got = r.wait(ctx.timeout).map_err(|e| fail(&w, format!("receive: {e} [{}]", e.name())))?;
            expect_eq(b, got, &message(1, 0, 16), &w)
        } else {
            b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("barrier: {e} [{}]", e.name())))?;
            let x = b.upload(&message(1, 0, 16))?;
            b.send(&x, 0)?.wait(ctx.timeout).map_err(|e| fail(&w, format!("send: {e} [{}]", e.name())))?;
            Ok(())
        }
    }));
    v.push(Case::<B>::new("p2p::send_behind_pending_collective::ws2", meta(), 2, |ctx| {
        // Rank 0 `all_reduce; isend(1)`, then waits for both; rank 1 `irecv(0); wait;
        // all_reduce`. Legal (MPI runs it): the all_reduce pending on rank 0 (its peer is in a
        // receive) must not hold back the send issued after it. A barrier first, so that a
        // backend that connects lazily has run a collective on this communicator.
        let b = ctx.b;
        let w = format!("{} (rank 0: all_reduce, isend; rank 1: irecv, wait, all_reduce)", here(b, "send_recv", "outbuf", DType::F32));
        b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("barrier: {e} [{}]", e.name())))?;
        send_behind_collective(ctx, b, "world", &w)
    }));
    v.push(Case::<B>::new("p2p::recv_behind_pending_collective::ws2", meta(), 2, |ctx| {
        // The mirror: rank 1 `all_reduce; irecv(0)`, rank 0 `isend(1); wait; all_reduce`. A
        // backend that queues receives behind the collectives issued before them (one stream)
        // deadlocks here until the deadline, while the send case above passes.
        let b = ctx.b;
        let w = format!("{} (rank 1: all_reduce, irecv; rank 0: isend, wait, all_reduce)", here(b, "send_recv", "outbuf", DType::F32));
        b.barrier()?.wait(ctx.timeout).map_err(|e| fail(&w, format!("barrier: {e} [{}]", e.name())))?;
        recv_behind_collective(ctx, b, &w)
    }));
    v.push(Case::<B>::new("p2p::send_behind_pending_collective::fresh_group::ws2", meta(), 2, |ctx| {
        // The same program on a communicator that has run nothing yet (a new group of both
        // ranks): a backend that connects lazily must not hold the send back behind its first
        // collective's connection, which waits for the peer (in its receive).
        let b0 = ctx.b;
        if !b0.capabilities().subgroups {
            return Err(crate::case::CaseEnd::Unsupported("backend declares no subgroup support".into()));
        }
        let w = format!(
            "{} on a fresh new_group([0, 1]) (rank 0: all_reduce, isend; rank 1: irecv, wait, all_reduce)",
            here(b0, "send_recv", "outbuf", DType::F32)
        );
        let g = b0.new_group(&[0, 1]).map_err(|e| fail(&w, format!("new_group: {e} [{}]", e.name())))?;
        let b = g.as_ref().ok_or_else(|| fail(&w, "new_group([0, 1]) returned nothing to a member"))?;
        send_behind_collective(ctx, b, "fresh_group", &w)
    }));
    v.push(Case::<B>::new("p2p::sends_first_both::large::ws2", meta(), 2, sends_first_both_large));
    v.push(Case::<B>::new("p2p::send_buffer_reused_once_completed::ws2", meta(), 2, send_buffer_reused_once_completed));
    for ws in [3, 4] {
        v.push(Case::<B>::new(format!("p2p::recvs_from_every_peer::ws{ws}"), meta(), ws, recvs_from_every_peer));
    }
    v.push(Case::<B>::new("p2p::group_and_world_messages_apart::ws2", meta(), 2, group_and_world_messages_apart));
    v.push(Case::<B>::new("p2p::in_order_across_other_traffic::ws3", meta(), 3, in_order_across_other_traffic));
    v.push(Case::<B>::new("p2p::in_order_mixed_dtypes::ws2", CaseMeta { dtype: "mixed".into(), ..meta() }, 2, in_order_mixed_dtypes));
    v.push(Case::<B>::new("p2p::ring_exchange::large::ws3", meta(), 3, ring_exchange_large));
    v.push(Case::<B>::new("p2p::pair_first_on_new_group::ws3", meta(), 3, pair_first_on_new_group));
    v.push(Case::<B>::new("p2p::many_sends_one_way::n17::ws2", meta(), 2, |ctx| {
        let order = if ctx.rank() == 0 { Order::SendsFirst } else { Order::RecvsFirst };
        exchange(ctx, 17, Sizes::Varied, order)
    }));
    v
}

/// Messages between the same two processes on two communicators (the world and the group
/// `[1, 0]`) are matched per communicator: each rank sends a group message, then a world
/// message, to the other, then receives the world message first and the group message second
/// (same dtype and size), then waits. A backend whose group traffic rides the world's channel
/// without a communicator tag hands the world receive the group message.
fn group_and_world_messages_apart<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    if !b.capabilities().subgroups {
        return Err(crate::case::CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    let w = format!(
        "{} group=[1, 0] (each rank: group isend, world isend, world irecv, group irecv, then wait)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let g = b.new_group(&[1, 0]).map_err(|e| named("new_group", e))?;
    let g = g.as_ref().ok_or_else(|| fail(&w, "new_group([1, 0]) returned nothing to a member"))?;
    let (me, peer) = (b.rank(), 1 - b.rank());
    let (gme, gpeer) = (g.rank(), 1 - g.rank());
    let n = 16;
    // Group messages are `k = 1`, world messages `k = 0` of [`message`].
    let gx = g.upload(&message(me, 1, n))?;
    let wx = b.upload(&message(me, 0, n))?;
    let gs = g.send(&gx, gpeer).map_err(|e| named("group send", e))?;
    let ws_ = b.send(&wx, peer).map_err(|e| named("world send", e))?;
    let wout = b.alloc(DType::F32, &[n])?;
    let gout = g.alloc(DType::F32, &[n])?;
    let wr = b.recv(&wout, peer).map_err(|e| named("world recv", e))?;
    let gr = g.recv(&gout, gpeer).map_err(|e| named("group recv", e))?;
    let wgot = wr.into_value(ctx.timeout).map_err(|e| named("world recv", e))?;
    let ggot = gr.into_value(ctx.timeout).map_err(|e| named("group recv", e))?;
    ws_.wait(ctx.timeout).map_err(|e| named("world send", e))?;
    gs.wait(ctx.timeout).map_err(|e| named("group send", e))?;
    expect_eq(b, &wgot, &message(peer, 0, n), &format!("{w}: the world receive from rank {peer}"))?;
    expect_eq(g, &ggot, &message(peer, 1, n), &format!("{w}: the group receive from group rank {gpeer} (this rank is group rank {gme})"))
}

/// `p2p::pair_first_on_new_group::ws3`: a new group of every rank (`[2, 0, 1]`), whose first op
/// is a send / recv between group ranks 1 and 2 (world ranks 0 and 1), waited by both, while group
/// rank 0 (world rank 2) issues nothing on any communicator until the pair says (through the
/// store) that its exchange completed; then all three run a barrier on the group. A send / recv
/// pair completes without the communicator's other members (clause `p2p.no_deadlock`): a backend
/// that creates a communicator lazily, by a collective init run at its first op, waits in that
/// init for the member that issues nothing (openucx/ucc PR #974, an active-set op as TL/NCCL's
/// first collective).
fn pair_first_on_new_group<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    if !b.capabilities().subgroups {
        return Err(CaseEnd::Unsupported("backend declares no subgroup support".into()));
    }
    let members = [2usize, 0, 1];
    let w = format!(
        "{} group={members:?} made in the case (its first op: group rank 1 sends to group rank 2; group rank 0 issues nothing until the pair is done)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let named = |what: &str, e: concord_core::CollectiveError| fail(&w, format!("{what}: {e} [{}]", e.name()));
    let g = b.new_group(&members).map_err(|e| named("new_group", e))?;
    let g = g.as_ref().ok_or_else(|| fail(&w, format!("new_group({members:?}) returned nothing to a member")))?;
    let key = format!("{}/{}/pair_done", ctx.case, ctx.world.world_id);
    let n = 16;
    match g.rank() {
        1 => {
            let x = g.upload(&message(1, 0, n))?;
            g.send(&x, 2).map_err(|e| named("group send to group rank 2 (the group's first op)", e))?.wait(ctx.timeout).map_err(|e| {
                named("group send to group rank 2 (the group's first op; group rank 0 issues nothing until it completes)", e)
            })?;
            ctx.store.set(&key, b"1").map_err(|e| fail(&w, e))?;
        }
        2 => {
            let out = g.alloc(DType::F32, &[n])?;
            g.recv(&out, 1).map_err(|e| named("group recv from group rank 1 (the group's first op)", e))?.wait(ctx.timeout).map_err(
                |e| named("group recv from group rank 1 (the group's first op; group rank 0 issues nothing until it completes)", e),
            )?;
            expect_eq(g, &out, &message(1, 0, n), &format!("{w}: the message from group rank 1"))?;
        }
        _ => {
            take_key(ctx, &key, &w, "the pair's send never completed (group rank 0 waits for it before its first op on any communicator)")?;
        }
    }
    g.barrier()
        .map_err(|e| named("group barrier after the pair", e))?
        .wait(ctx.timeout)
        .map_err(|e| named("group barrier after the pair", e))?;
    Ok(())
}

/// Rank 0 `isend(2); isend(1) [message 0]; wait the send to 2; isend(1) [message 1]`; rank 2
/// receives only once rank 0 has issued message 0 (a store handshake: the send to it is still in
/// flight when message 0 is issued, done before message 1 is, however the ranks are scheduled;
/// with a 5 ms sleep instead, a rank 0 held back as long found the send to 2 done and
/// send_retry_overtaken survived 1 run of 30 at load 20); rank 1 `irecv(0); irecv(0)`, then
/// waits: message 0 lands in the first receive.
/// A send engine that parks a send issued while another peer's is in flight, and sends the next
/// one straight when idle, delivers message 1 first (same sizes: wrong values).
fn in_order_across_other_traffic<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let me = b.rank();
    let w = format!(
        "{} (rank 0: isend(2); isend(1) #0; wait the send to 2; isend(1) #1; rank 2 receives once #0 is issued)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let n = 8;
    let t = ctx.timeout;
    let issued = format!("{}/{}/issued_message0", ctx.case, ctx.world.world_id);
    fn named<T>(r: Result<T, concord_core::CollectiveError>, w: &str, what: &str) -> Result<T, crate::case::CaseEnd> {
        r.map_err(|e| fail(w, format!("{what}: {e} [{}]", e.name())))
    }
    match me {
        0 => {
            let (to2, m0, m1) = (b.upload(&message(0, 9, n))?, b.upload(&message(0, 0, n))?, b.upload(&message(0, 1, n))?);
            let s2 = named(b.send(&to2, 2), &w, "isend to rank 2")?;
            let s0 = named(b.send(&m0, 1), &w, "isend #0 to rank 1")?;
            ctx.store.set(&issued, b"1").map_err(|e| fail(&w, format!("store: {e}")))?;
            named(s2.wait(t), &w, "the send to rank 2")?;
            let s1 = named(b.send(&m1, 1), &w, "isend #1 to rank 1")?;
            named(s0.wait(t), &w, "send #0 to rank 1")?;
            named(s1.wait(t), &w, "send #1 to rank 1")?;
        }
        1 => {
            let outs = [b.alloc(DType::F32, &[n])?, b.alloc(DType::F32, &[n])?];
            let rs = outs.iter().map(|o| b.recv(o, 0)).collect::<Result<Vec<_>, _>>();
            for (k, r) in named(rs, &w, "irecv from rank 0")?.iter().enumerate() {
                named(r.wait(t), &w, &format!("receive #{k} from rank 0"))?;
            }
            for (k, o) in outs.iter().enumerate() {
                expect_eq(b, o, &message(0, k, n), &format!("{w}: receive #{k} from rank 0"))?;
            }
        }
        _ => {
            let out = b.alloc(DType::F32, &[n])?;
            take_key(ctx, &issued, &w, "rank 0 never issued message 0 to rank 1")?;
            let r = named(b.recv(&out, 0), &w, "irecv from rank 0")?;
            named(r.wait(t), &w, "receive from rank 0")?;
            expect_eq(b, &out, &message(0, 9, n), &format!("{w}: the message from rank 0"))?;
        }
    }
    Ok(())
}

/// The dtypes of [`in_order_mixed_dtypes`]' messages, in sending order: 8-byte ones between
/// narrower ones (a backend may stage or pack one element width on a path of its own).
const MIXED: [DType; 6] = [DType::F64, DType::F32, DType::I64, DType::U8, DType::U64, DType::F16];

/// Rank 0 issues one send of each [`MIXED`] dtype to rank 1 back to back, un-waited, then waits
/// them; rank 1 posts the receives in the same order: each receive gets the message sent in its
/// place (order is per pair of ranks, whatever the dtypes). The wide_send_staged mutant (8-byte
/// sends posted late by a staging thread) let a narrower send overtake them; the random
/// program that caught it did so only when its timing allowed.
fn in_order_mixed_dtypes<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    // The dtypes the backend declares it moves: a declared gap is skipped (a backend may refuse
    // its send as unsupported); UNSUPPORTED when fewer than two are left (no order to keep).
    let caps = b.capabilities();
    let (mut mixed, mut declared) = (Vec::new(), Vec::new());
    for (k, d) in MIXED.into_iter().enumerate() {
        match caps.check_call(concord_core::OpKind::SendRecv, Some(concord_core::Variant::OutBuf), Some(d), None) {
            Ok(()) => mixed.push((k, d)),
            Err(why) => declared.push(format!("{d} ({why})")),
        }
    }
    if mixed.len() < 2 {
        return Err(crate::case::CaseEnd::Unsupported(format!(
            "declared gap: fewer than two of the dtypes {MIXED:?} are declared for send / recv: {}",
            declared.join("; ")
        )));
    }
    let dtypes: Vec<DType> = mixed.iter().map(|&(_, d)| d).collect();
    let w = format!("{} dtypes={dtypes:?} (rank 0 sends them back to back, un-waited)", here(b, "send_recv", "outbuf", DType::F32))
        .replace("dtype=f32", "dtype=mixed");
    let n = 6;
    let msg = |k: usize, d: DType| Tensor::from_f64(d, &[n], &(0..n).map(|i| (k * 10 + i + 1) as f64).collect::<Vec<_>>());
    let t = ctx.timeout;
    match b.rank() {
        0 => {
            let bufs = mixed.iter().map(|&(k, d)| b.upload(&msg(k, d))).collect::<Result<Vec<_>, _>>()?;
            let sends = bufs.iter().map(|x| b.send(x, 1)).collect::<Result<Vec<_>, _>>()?;
            for (s, &(k, d)) in sends.into_iter().zip(&mixed) {
                s.wait(t).map_err(|e| fail(&w, format!("send #{k} ({d}): {e} [{}]", e.name())))?;
            }
        }
        _ => {
            let outs = mixed.iter().map(|&(_, d)| b.alloc(d, &[n])).collect::<Result<Vec<_>, _>>()?;
            let recvs = outs.iter().map(|o| b.recv(o, 0)).collect::<Result<Vec<_>, _>>()?;
            for (r, &(k, d)) in recvs.into_iter().zip(&mixed) {
                r.wait(t).map_err(|e| fail(&w, format!("receive #{k} ({d}): {e} [{}]", e.name())))?;
            }
            for (o, &(k, d)) in outs.iter().zip(&mixed) {
                expect_eq(b, o, &msg(k, d), &format!("{w}: receive #{k} ({d})"))?;
            }
        }
    }
    Ok(())
}

/// Every rank posts a receive from every other rank (same dtype and size, peers in rank order),
/// then sends to every other rank, then waits: the `k`-th recv from `a` takes `a`'s message, not
/// whichever message of that size arrived first (matching is per source).
fn recvs_from_every_peer<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (ws, me) = (b.world_size(), b.rank());
    let w = format!("{} (every rank: irecv from every peer, isend to every peer, then wait)", here(b, "send_recv", "outbuf", DType::F32));
    let n = 6;
    let peers: Vec<usize> = (0..ws).filter(|&p| p != me).collect();
    let outs: Vec<B::Buffer> = peers.iter().map(|_| b.alloc(DType::F32, &[n])).collect::<Result<_, _>>()?;
    let recvs = peers
        .iter()
        .zip(&outs)
        .map(|(&p, o)| b.recv(o, p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(&w, format!("issuing the receives: {e} [{}]", e.name())))?;
    let x = b.upload(&message(me, 0, n))?;
    let sends = peers
        .iter()
        .map(|&p| b.send(&x, p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(&w, format!("issuing the sends: {e} [{}]", e.name())))?;
    for (r, &p) in recvs.iter().zip(&peers) {
        r.wait(ctx.timeout).map_err(|e| fail(&w, format!("receive from rank {p}: {e} [{}]", e.name())))?;
    }
    for (s, &p) in sends.iter().zip(&peers) {
        s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send to rank {p}: {e} [{}]", e.name())))?;
    }
    for (o, &p) in outs.iter().zip(&peers) {
        expect_eq(b, o, &message(p, 0, n), &format!("{w}: the message from rank {p}"))?;
    }
    Ok(())
}

/// `p2p::ring_exchange::large::ws3`: every rank `isend(next); irecv(prev)` with 1 MiB messages,
/// then waits the receive and the send — a ring shift, legal (clause `p2p.no_deadlock`). At 2
/// ranks next = previous, so a transport that groups only a peer's own send and receive
/// (a rendezvous send holding back the ops issued after it, but for a receive from the same peer)
/// passes every 2-rank case; from 3 ranks each rank's receive waits behind its own send, whose
/// receiver waits behind its own: a deadlock.
fn ring_exchange_large<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (me, ws) = (b.rank(), b.world_size());
    let (next, prev) = ((me + 1) % ws, (me + ws - 1) % ws);
    let w = format!(
        "{} shape=[{LARGE}] (every rank: isend(next={next}), irecv(prev={prev}), then wait: a ring shift)",
        here(b, "send_recv", "outbuf", DType::F32)
    );
    let x = b.upload(&message(me, 0, LARGE))?;
    let out = b.alloc(DType::F32, &[LARGE])?;
    let s = b.send(&x, next).map_err(|e| fail(&w, format!("issuing the send: {e} [{}]", e.name())))?;
    let r = b.recv(&out, prev).map_err(|e| fail(&w, format!("issuing the receive: {e} [{}]", e.name())))?;
    let got = r.wait(ctx.timeout).map_err(|e| fail(&w, format!("receive from rank {prev}: {e} [{}]", e.name())))?;
    s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send to rank {next}: {e} [{}]", e.name())))?;
    expect_recv(b, got, &out, &message(prev, 0, LARGE), &format!("{w}: the message from rank {prev}"))
}

/// Elements of the large messages (1 MiB of f32: past the eager limits of common transports).
const LARGE: usize = 1 << 18;

/// `isend(p); irecv(p)` on both ranks with 1 MiB messages, then wait: a transport that switches
/// to a rendezvous protocol for large messages must still not block the caller at issue (both
/// ranks would sit in their sends). Each send's issue is timed.
fn sends_first_both_large<B: Backend>(ctx: &mut Ctx<'_, B>) -> CaseResult {
    let b = ctx.b;
    let (me, ws) = (b.rank(), b.world_size());
    let Some(peer) = partner(me, ws) else { return Ok(()) };
    let w = format!("{} peer={peer} shape=[{LARGE}] (both ranks: isend, irecv, then wait)", here(b, "send_recv", "outbuf", DType::F32));
    let x = b.upload(&message(me, 0, LARGE))?;
    let out = b.alloc(DType::F32, &[LARGE])?;
    let t0 = std::time::Instant::now();
    let s = b.send(&x, peer).map_err(|e| fail(&w, format!("issuing the send: {e} [{}]", e.name())))?;
    let took = t0.elapsed();
    let r = b.recv(&out, peer).map_err(|e| fail(&w, format!("issuing the receive: {e} [{}]", e.name())))?;
    let got = r.wait(ctx.timeout).map_err(|e| fail(&w, format!("receive: {e} [{}]", e.name())))?;
    s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send: {e} [{}]", e.name())))?;
    // Generous: a loaded 2-core machine stalls any call this long.
    if took > std::time::Duration::from_secs(2) {
        return Err(fail(
            &w,
            format!(
                "issuing a 1 MiB send blocked the caller for {took:?} (the peer was in its own send): issuing never blocks on the peer"
            ),
        ));
    }
    expect_recv(b, got, &out, &message(peer, 0, LARGE), &w)
}
