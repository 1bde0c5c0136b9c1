//! Kubernetes-compatible CEL for DRA device selectors, on the `cel` crate.
//!
//! A [`Selector`] is compiled once and evaluated against [`DeviceView`]s, the `device`
//! variable of Kubernetes' DRA CEL environment (driver, attributes, capacity,
//! allowMultipleAllocations). The environment adds to the CEL standard library what
//! Kubernetes selectors use: the strings extension, the quantity and semver libraries,
//! `includes()` and `cel.bind()`. Two guards keep expressions bounded as Kubernetes does:
//! a compile-time estimate of the worst-case cost ([`CelError::CostEstimate`]) and a runtime
//! meter that stops an evaluation past [`COST_LIMIT`] ([`CelError::CostLimit`],
//! `actual cost limit exceeded`). Pure: no I/O except [`evaluate_device_file`].
//!
//! Expressions are also bounded in shape ([`MAX_EXPRESSION_LENGTH`], [`MAX_BRACKET_NESTING`],
//! [`MAX_TREE_DEPTH`], [`MAX_CALL_NESTING`]) so that neither the parser nor the evaluator,
//! both recursive, can exhaust the stack of the calling thread.
//!
//! # Differences from Kubernetes
//!
//! - There is no static type checker: a type mismatch (`device.driver > 1`) is reported when
//!   the expression is evaluated, not when it is compiled; only a constant of another type
//!   than bool is rejected at compile time.
//! - Cost units follow cel-go's spirit (one per evaluated node, loops multiplied, growing
//!   strings and lists charged by size) but are not identical, so expressions very close to
//!   the limit may be judged differently.
//! - `isInteger()` and `asInteger()` judge the exact value (`quantity('1000m').isInteger()`
//!   is true); Kubernetes' answer depends on how the quantity happens to be stored.
//! - Quantities are exact up to a magnitude of about 1.7e29; larger ones are an error.

mod cost;
mod device;
mod diagnose;
mod domain_map;
mod env;
mod error;
mod estimate;
mod includes;
mod parse;
mod quantity_lib;
mod selector;
mod semver_lib;
mod walk;

pub use device::DeviceView;
pub use error::{CelError, Position};
pub use includes::MAX_LIST_LENGTH;
pub use parse::{MAX_BRACKET_NESTING, MAX_CALL_NESTING, MAX_TREE_DEPTH};
pub use selector::{
    COST_LIMIT, CompileOptions, MAX_EXPRESSION_LENGTH, Selector, evaluate_device_file,
};
