//! Point to point (issue 10): several messages in flight between one pair, received in issue
//! order; `irecv` before `isend`; many sends before the peer receives.
//!
//! In the default catalogue ([`cases`]):
//! * `p2p::in_flight_in_order::{sizes,same_size}::n4::ws{2,4}` — every rank issues 4 sends to its
//!   partner, then 4 receives, then waits: message `k` lands in receive `k` (different sizes:
//!   a reordering is a size mismatch; equal sizes: wrong values). At ws4 two pairs run at once.
//! * `p2p::recv_first_one_side::ws2` — rank 0 `irecv; isend`, rank 1 `isend; irecv`.
//! * `p2p::many_sends_one_way::n17::ws2` — rank 0 sends 17 messages (more than shm's 16-slot
//!   ring) before it receives; rank 1 receives all 17 first, then sends 17 back.
//!
//! KNOWN FAILING on shm ([`known_failing`], NOT in the default catalogue): shm issue 15, item 9 —
//! sends beyond its 16-slot ring and receives are served by one in-order progress thread per
//! rank, so a receive (or a 17th send) that must wait for the peer blocks every op queued behind
//! it, the peer's too:
//! * `p2p::recv_first_both::ws2` — `irecv(p); isend(p)` on both ranks: each progress thread
//!   waits in its receive, neither send is ever posted (deadlock until the op deadline).
//! * `p2p::in_flight_in_order::sizes::n17::ws2` — 17 sends then 17 receives on both ranks: each
//!   17th send waits for the peer to consume the first, whose receive is queued behind it.
//!
//! Both programs are legal (the contract in `concord_core::backend` requires them to complete);
//! a backend that passes them runs them with `catalogue = concord_suites::with_known_failing`.

use super::util::{expect_eq, fail, here};
use crate::case::{Case, CaseMeta, CaseResult, Ctx};
use crate::values::partner;
use concord_core::{Backend, DType, Tensor};

fn meta() -> CaseMeta {
    CaseMeta { suite: "p2p".into(), op: "send_recv".into(), variant: "outbuf".into(), dtype: "f32".into(), reduce: "-".into() }
}

/// Message `k` from rank `src`: `len` elements, distinct per (src, k, element).
fn message(src: usize, k: usize, len: usize) -> Tensor {
    Tensor::from_vec(&[len], (0..len).map(|i| (src * 10_000 + k * 100 + i % 100) as f32).collect())
}

/// Order of issue on one rank.
#[derive(Clone, Copy)]
enum Order {
    SendsFirst,
    RecvsFirst,
}

/// Issues `n` sends to the partner and `n` receives from it in `order`, then waits for all, and
/// checks message `k` landed in receive `k`.
fn exchange<B: Backend>(ctx: &Ctx<'_, B>, n: usize, same_size: bool, order: Order) -> CaseResult {
    let b = ctx.b;
    let (me, ws) = (b.rank(), b.world_size());
    let Some(peer) = partner(me, ws) else { return Ok(()) };
    let len = |k: usize| if same_size { 16 } else { [1, 7, 64, 1000][k % 4] + k };
    let w = format!("{} peer={peer} messages={n}", here(b, "send_recv", "outbuf", DType::F32));
    let sends: Vec<B::Buffer> = (0..n).map(|k| b.upload(&message(me, k, len(k)))).collect::<Result<_, _>>()?;
    let outs: Vec<B::Buffer> = (0..n).map(|k| b.upload(&Tensor::zeros(DType::F32, &[len(k)]))).collect::<Result<_, _>>()?;
    let issue_sends = || sends.iter().map(|x| b.send(x, peer)).collect::<Result<Vec<_>, _>>();
    let issue_recvs = || outs.iter().map(|o| b.recv(o, peer)).collect::<Result<Vec<_>, _>>();
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
        expect_eq(b, got, &message(peer, k, len(k)), &format!("{w} receive #{k} (messages must arrive in issue order)"))?;
    }
    for (k, s) in sw.iter().enumerate() {
        s.wait(ctx.timeout).map_err(|e| fail(&w, format!("send #{k}: {e} [{}]", e.name())))?;
    }
    Ok(())
}

pub fn cases<B: Backend>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    for ws in [2, 4] {
        for (tag, same) in [("sizes", false), ("same_size", true)] {
            v.push(Case::<B>::new(format!("p2p::in_flight_in_order::{tag}::n4::ws{ws}"), meta(), ws, move |ctx| {
                exchange(ctx, 4, same, Order::SendsFirst)
            }));
        }
    }
    v.push(Case::<B>::new("p2p::recv_first_one_side::ws2", meta(), 2, |ctx| {
        let order = if ctx.rank() == 0 { Order::RecvsFirst } else { Order::SendsFirst };
        exchange(ctx, 1, false, order)
    }));
    v.push(Case::<B>::new("p2p::many_sends_one_way::n17::ws2", meta(), 2, |ctx| {
        let order = if ctx.rank() == 0 { Order::SendsFirst } else { Order::RecvsFirst };
        exchange(ctx, 17, false, order)
    }));
    v
}

/// Legal programs the shm backend deadlocks on (issue 15, item 9); see the module docs.
pub fn known_failing<B: Backend>() -> Vec<Case<B>> {
    vec![
        Case::<B>::new("p2p::recv_first_both::ws2", meta(), 2, |ctx| exchange(ctx, 1, false, Order::RecvsFirst)).isolated(),
        Case::<B>::new("p2p::in_flight_in_order::sizes::n17::ws2", meta(), 2, |ctx| exchange(ctx, 17, false, Order::SendsFirst)).isolated(),
    ]
}
