//! Small helpers the hand-written suites share.

use crate::case::CaseEnd;
use concord_core::{Backend, DType, Element, Tensor};
use concord_oracle::{compare, Tolerance};

/// `backend=.. world_size=.. rank=..` for messages of hand-written cases.
pub fn here<B: Backend>(b: &B, op: &str, variant: &str, dtype: DType) -> String {
    format!(
        "backend={} op={op} variant={variant} dtype={dtype} world_size={} rank={}",
        crate::case::backend_label(b),
        b.world_size(),
        b.rank()
    )
}

/// A tensor of `shape` filled with `v`.
pub fn full<T: Element + Copy>(shape: &[usize], v: T) -> Tensor {
    Tensor::from_vec(shape, vec![v; shape.iter().product()])
}

/// Downloads `buf` and compares it bit-exactly with `expected`, failing with `where_`.
/// For a backend that moves no data (`Capabilities::moves_data == false`, the fake backend)
/// only the dtype and shape are compared: values are not part of its contract.
pub fn expect_eq<B: Backend>(b: &B, buf: &B::Buffer, expected: &Tensor, where_: &str) -> Result<(), CaseEnd> {
    if !b.capabilities().moves_data {
        let (dt, shape) = (b.buffer_dtype(buf), b.buffer_shape(buf));
        if dt != expected.dtype() || shape != expected.shape() {
            return Err(CaseEnd::Fail(format!("{where_}: result is {dt}{shape:?}, expected {}{:?}", expected.dtype(), expected.shape())));
        }
        return Ok(());
    }
    let got = b.download(buf).map_err(|e| CaseEnd::Fail(format!("{where_}: download: {e}")))?;
    compare(&got, expected, Tolerance::Exact).map_err(|m| CaseEnd::Fail(format!("{where_}: {m}")))
}

pub fn fail(where_: &str, what: impl std::fmt::Display) -> CaseEnd {
    CaseEnd::Fail(format!("{where_}: {what}"))
}

/// Compares this rank's result `got` with the oracle's answer for `coll` over every rank's
/// `inputs` (index = rank), bit-exactly; nothing to compare where the oracle leaves it undefined.
pub fn expect_oracle<B: Backend>(
    b: &B,
    coll: &concord_oracle::Collective,
    inputs: &[Tensor],
    got: &B::Buffer,
    where_: &str,
) -> Result<(), CaseEnd> {
    let sem = concord_oracle::Semantics::of(&b.capabilities());
    let exp = concord_oracle::expected(coll, inputs, &sem)
        .map_err(|e| fail(where_, format!("suite bug: the oracle rejected the case's own input: {e}")))?;
    let r = b.rank();
    if !exp.defined[r] {
        return Ok(());
    }
    expect_eq(b, got, &exp.outputs[r], where_)
}
