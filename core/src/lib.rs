//! # concord-core
//!
//! **One job:** define the vocabulary every other Concord crate speaks — dtypes, host tensors,
//! reduce ops, the [`Backend`] trait shaped after PyTorch's functional collectives, pending
//! [`Work`] handles, declared [`Capabilities`] and the named [`CollectiveError`]s — and the one
//! rule table of call validity ([`call`]) that the oracle and every backend decide bad input with.
//!
//! This crate has no I/O (but one stderr warning: a counted [`Work`] dropped without a wait),
//! no processes and no communication. Backends implement [`Backend`];
//! the oracle computes expected values from [`Tensor`]s; the suites drive any `B: Backend`.
#![deny(unsafe_code)] // one exception: the matmul kernel's call into matrixmultiply (fused.rs)

pub mod backend;
pub mod call;
pub mod caps;
pub mod dtype;
pub mod error;
pub mod fault;
pub mod forward;
pub mod fused;
pub mod op;
pub mod progress;
pub mod tensor;
pub mod work;

pub use backend::{queued_op_backstop, world_prefix, Backend, WorldInfo, LOCAL_RANK_OPTION};
pub use call::{validate_all, validate_local, validate_pair, BadInput, CallDesc, CallOp, FusedArgs, TensorDesc};
pub use caps::{AliasPolicy, Capabilities, FusedImpl, Gap, IntAvg, NanPolicy, Rounding};
pub use dtype::{DType, Element};
pub use error::{BadInputKind, CollectiveError, Result};
pub use fused::{Scale, Scaling};
#[doc(hidden)]
pub use half;
pub use op::{OpKind, ReduceOp, Variant};
pub use tensor::Tensor;
pub use work::{AsyncResult, Completion, Done, Failed, Flag, OutstandingCounter, Work, WorkMeta};
