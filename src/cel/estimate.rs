//! The static worst-case cost of an expression, computed at compile time, in the units the
//! runtime meter charges (see `cost.rs`): one per node, comprehensions multiplying their
//! condition and step by the largest number of elements they can iterate, and growing calls
//! (`+`, `replace`, `join`, `format`) a tenth of the largest size they can produce.
//!
//! Sizes come from the expression (literal strings and lists) and, for anything read from
//! the device, from the API's limits: a device has at most 32 attribute domains and names,
//! strings are at most 64 characters and `includes()` lists at most 48 elements, so no
//! device-derived string, list or map is larger than [`DEVICE_VALUE_SIZE`]. Like Kubernetes'
//! estimator this is an upper bound meant to reject expressions that could run away on some
//! device; it can be conservative for expressions that build large values out of device data.

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, LiteralValue, operators};

use super::walk;

/// The largest string, list or map a device can hold (64-character strings).
pub(super) const DEVICE_VALUE_SIZE: u64 = 64;

#[derive(Clone, Copy)]
struct Estimate {
    cost: u64,
    /// The largest length of the value, for strings, bytes, lists and maps.
    size: u64,
    /// For lists and maps, the largest size of an element.
    element: u64,
}

/// What a comprehension binds a name to: the largest size of its value and elements.
type Binding = (String, u64, u64);

/// The worst-case cost of evaluating `expr`.
pub(super) fn worst_case_cost(expr: &IdedExpr) -> u64 {
    estimate(expr, &mut Vec::new()).cost
}

/// `scope` holds the variables comprehensions bind, innermost last, with their largest size.
fn estimate(expr: &IdedExpr, scope: &mut Vec<Binding>) -> Estimate {
    match &expr.expr {
        Expr::Literal(LiteralValue::String(s)) => leaf(s.inner().len() as u64),
        Expr::Literal(LiteralValue::Bytes(b)) => leaf(b.inner().len() as u64),
        Expr::Literal(_) | Expr::Unspecified => leaf(1),
        Expr::Ident(name) => {
            let (size, element) = scope
                .iter()
                .rev()
                .find(|(bound, _, _)| bound == name)
                .map_or(
                    (DEVICE_VALUE_SIZE, DEVICE_VALUE_SIZE),
                    |(_, size, element)| (*size, *element),
                );
            Estimate {
                cost: 1,
                size,
                element,
            }
        }
        Expr::Comprehension(c) => comprehension(c, scope),
        Expr::Call(call) => {
            let parts: Vec<Estimate> = walk::children(expr)
                .into_iter()
                .map(|child| estimate(child, scope))
                .collect();
            let cost = sum_cost(&parts);
            let size_of = |i: usize| parts.get(i).map_or(1, |p| p.size);
            let element_of = |i: usize| parts.get(i).map_or(1, |p| p.element);
            let accumulates = matches!(
                call.args.first().map(|a| &a.expr),
                Some(Expr::Ident(name)) if name.starts_with('@')
            );
            let (size, element, grows) = match call.func_name.as_str() {
                operators::ADD => (
                    size_of(0).saturating_add(size_of(1)),
                    element_of(0).max(element_of(1)),
                    !accumulates,
                ),
                operators::CONDITIONAL => (
                    size_of(1).max(size_of(2)),
                    element_of(1).max(element_of(2)),
                    false,
                ),
                // Every character, and the ends, may become `new`.
                "replace" => (
                    size_of(0)
                        .saturating_add(1)
                        .saturating_mul(size_of(2).saturating_add(1)),
                    1,
                    true,
                ),
                "join" => (
                    size_of(0).saturating_mul(element_of(0).saturating_add(size_of(1))),
                    1,
                    true,
                ),
                "format" => (
                    size_of(0).saturating_add(size_of(1).saturating_mul(element_of(1))),
                    1,
                    true,
                ),
                "split" => (size_of(0).saturating_add(1), size_of(0), false),
                "lowerAscii" | "upperAscii" | "trim" | "reverse" | "substring" => {
                    (size_of(0), 1, false)
                }
                _ => (DEVICE_VALUE_SIZE, DEVICE_VALUE_SIZE, false),
            };
            let growth = if grows { size / 10 } else { 0 };
            Estimate {
                cost: cost.saturating_add(growth),
                size,
                element,
            }
        }
        Expr::List(list) => {
            let parts = children_estimates(expr, scope);
            Estimate {
                cost: sum_cost(&parts),
                size: list.elements.len() as u64,
                element: largest(&parts),
            }
        }
        Expr::Map(map) => {
            let parts = children_estimates(expr, scope);
            Estimate {
                cost: sum_cost(&parts),
                size: map.entries.len() as u64,
                element: largest(&parts),
            }
        }
        Expr::Select(_) | Expr::Struct(_) => {
            let parts = children_estimates(expr, scope);
            Estimate {
                cost: sum_cost(&parts),
                size: DEVICE_VALUE_SIZE,
                element: DEVICE_VALUE_SIZE,
            }
        }
    }
}

fn comprehension(c: &ComprehensionExpr, scope: &mut Vec<Binding>) -> Estimate {
    let range = estimate(&c.iter_range, scope);
    let init = estimate(&c.accu_init, scope);
    // The accumulator of `map`/`filter` collects at most one element per iteration; a
    // `cel.bind` variable is its initial value.
    let accumulator = if matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty()) {
        (range.size, DEVICE_VALUE_SIZE.max(range.element))
    } else {
        (init.size, init.element)
    };
    let depth = scope.len();
    // An element of the range, or its key for a map.
    let item = range.element.max(DEVICE_VALUE_SIZE);
    scope.push((c.iter_var.clone(), item, item));
    if let Some(second) = &c.iter_var2 {
        scope.push((second.clone(), item, item));
    }
    scope.push((c.accu_var.clone(), accumulator.0, accumulator.1));
    let cond = estimate(&c.loop_cond, scope);
    let step = estimate(&c.loop_step, scope);
    let result = estimate(&c.result, scope);
    scope.truncate(depth);
    let per_iteration = 1u64.saturating_add(cond.cost).saturating_add(step.cost);
    Estimate {
        cost: 1u64
            .saturating_add(range.cost)
            .saturating_add(init.cost)
            .saturating_add(range.size.saturating_mul(per_iteration))
            .saturating_add(result.cost),
        size: result.size,
        element: result.element,
    }
}

fn leaf(size: u64) -> Estimate {
    Estimate {
        cost: 1,
        size,
        element: 1,
    }
}

fn largest(parts: &[Estimate]) -> u64 {
    parts.iter().map(|p| p.size).max().unwrap_or(1)
}

fn children_estimates(expr: &IdedExpr, scope: &mut Vec<Binding>) -> Vec<Estimate> {
    walk::children(expr)
        .into_iter()
        .map(|child| estimate(child, scope))
        .collect()
}

/// One for the node itself plus the cost of its parts.
fn sum_cost(parts: &[Estimate]) -> u64 {
    parts
        .iter()
        .fold(1u64, |total, part| total.saturating_add(part.cost))
}
