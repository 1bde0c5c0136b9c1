//! The runtime cost meter: Kubernetes stops a selector once it has spent its cost budget
//! (`actual cost limit exceeded`); the `cel` crate has no such meter, so compiled expressions
//! are instrumented to charge a per-evaluation [`Budget`].
//!
//! Cost units follow the static estimate in `estimate.rs`: one unit per evaluated node, each
//! comprehension iteration charging the nodes of its condition and step, and calls that can
//! grow strings or lists (`+`, `replace`, `join`, `format`) charging a tenth of the size of
//! what they produce. Charges are made by a hidden function, `@charge(value, @budget, cost)`,
//! that passes `value` through; `@` names cannot be written in CEL source, so expressions
//! cannot call or shadow it. The charge points are placed so that the interpreter's fast
//! paths for `map`/`filter` and its `all`/`exists` error rules still apply.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue, operators};
use cel::common::types::{CelBytes, CelInt, CelString, DYN_TYPE, INT_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// The hidden function that charges the budget.
pub(super) const CHARGE: &str = "@charge";
/// The hidden variable holding the budget of the running evaluation.
pub(super) const BUDGET: &str = "@budget";
/// The message of the error a spent budget raises.
pub(super) const EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

/// Calls whose result can be much larger than their operands.
const GROWING: [&str; 4] = [operators::ADD, "replace", "join", "format"];

static BUDGET_TYPE: Type = Type::new_unspecified_type("@budget");

/// What one evaluation may still spend.
#[derive(Debug)]
pub(super) struct Budget {
    spent: AtomicU64,
    limit: u64,
}

impl Budget {
    pub(super) fn new(limit: u64) -> Self {
        Budget {
            spent: AtomicU64::new(0),
            limit,
        }
    }

    /// Whether more than the limit was spent.
    pub(super) fn exceeded(&self) -> bool {
        self.spent.load(Ordering::Relaxed) > self.limit
    }

    fn charge(&self, cost: u64) -> Result<(), ExecutionError> {
        let spent = self
            .spent
            .fetch_add(cost, Ordering::Relaxed)
            .saturating_add(cost);
        if spent > self.limit {
            return Err(ExecutionError::function_error(CHARGE, EXCEEDED));
        }
        Ok(())
    }
}

impl Val for Budget {
    fn get_type(&self) -> &Type {
        &BUDGET_TYPE
    }

    fn cel_type() -> &'static Type {
        &BUDGET_TYPE
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(Budget {
            spent: AtomicU64::new(self.spent.load(Ordering::Relaxed)),
            limit: self.limit,
        })
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Budget {}

/// Declares `@charge` on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(
        CHARGE,
        "charge_budget",
        vec![DYN_TYPE, BUDGET_TYPE.to_owned(), INT_TYPE],
        charge,
    )
}

fn charge<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut args = args.into_iter();
    let (Some(value), Some(budget), Some(cost)) = (args.next(), args.next(), args.next()) else {
        return Err(ExecutionError::invalid_argument_count(3, 0));
    };
    let budget = budget
        .downcast_ref::<Budget>()
        .ok_or_else(|| ExecutionError::function_error(CHARGE, "no budget"))?;
    let fixed = cost
        .downcast_ref::<CelInt>()
        .map_or(1, |c| c.inner().unsigned_abs());
    budget.charge(fixed.saturating_add(size_of(value.as_ref()) / 10))?;
    Ok(value)
}

/// The length of a string, bytes, list or map; 0 for scalars.
fn size_of(value: &dyn Val) -> u64 {
    if let Some(s) = value.downcast_ref::<CelString>() {
        return s.inner().len() as u64;
    }
    if let Some(b) = value.downcast_ref::<CelBytes>() {
        return b.inner().len() as u64;
    }
    value
        .as_sizer()
        .map_or(0, |s| s.size().inner().unsigned_abs())
}

/// Node ids for the nodes the instrumentation adds.
pub(super) struct Ids(u64);

impl Ids {
    /// Ids above every id of `expr`.
    pub(super) fn after(expr: &IdedExpr) -> Self {
        let mut max = expr.id;
        super::walk::visit(expr, &mut |e| max = max.max(e.id));
        Ids(max + 1)
    }

    fn next(&mut self, expr: Expr) -> IdedExpr {
        let id = self.0;
        self.0 += 1;
        IdedExpr { id, expr }
    }
}

/// Rewrites `expr` so that evaluating it charges the budget bound to [`BUDGET`].
pub(super) fn instrument(expr: &mut IdedExpr, ids: &mut Ids) {
    instrument_below(expr, false, ids);
}

/// `in_sum`: `expr` is an operand of `+`, whose charge covers it.
fn instrument_below(expr: &mut IdedExpr, in_sum: bool, ids: &mut Ids) {
    let is_sum = matches!(&expr.expr, Expr::Call(call) if call.func_name == operators::ADD);
    let per_iteration = match &expr.expr {
        Expr::Comprehension(c) => Some(1 + node_count(&c.loop_cond) + node_count(&c.loop_step)),
        _ => None,
    };
    for child in super::walk::children_mut(expr) {
        instrument_below(child, is_sum, ids);
    }
    match &mut expr.expr {
        Expr::Call(call) => {
            // The accumulator of `map`/`filter` (`@result + [x]`) grows by one element per
            // iteration, which the iteration charge already covers. In a chain `a + b + c`
            // only the outermost sum is charged: it is the largest, and each charge costs the
            // evaluator a stack frame.
            let accumulates = matches!(
                call.args.first().map(|a| &a.expr),
                Some(Expr::Ident(name)) if name.starts_with('@')
            );
            let charged_above = is_sum && in_sum;
            if GROWING.contains(&call.func_name.as_str()) && !accumulates && !charged_above {
                wrap(expr, 1, ids);
            }
        }
        Expr::Comprehension(c) => {
            if let Some(point) = iteration_charge_point(&mut c.loop_cond, &mut c.loop_step) {
                wrap(point, per_iteration.unwrap_or(1), ids);
            }
        }
        _ => {}
    }
}

/// The sub-expression evaluated once per iteration, chosen so that the interpreter still
/// recognises the loop's shape: the condition when it is not a constant (`all`, `exists`),
/// else the filter or predicate of a conditional step (`filter`, `exists_one`, 3-arg `map`),
/// else the appended element (`map`). `None` for `cel.bind`, which never iterates.
fn iteration_charge_point<'e>(
    loop_cond: &'e mut IdedExpr,
    loop_step: &'e mut IdedExpr,
) -> Option<&'e mut IdedExpr> {
    if !matches!(loop_cond.expr, Expr::Literal(_)) {
        return Some(loop_cond);
    }
    let shape = match &loop_step.expr {
        // `cel.bind`'s step is its variable, and its loop never runs.
        Expr::Ident(_) => return None,
        Expr::Call(call) if call.func_name == operators::CONDITIONAL => StepShape::Conditional,
        Expr::Call(call)
            if call.func_name == operators::ADD
                && matches!(call.args.get(1).map(|a| &a.expr), Some(Expr::List(l)) if !l.elements.is_empty()) =>
        {
            StepShape::Append
        }
        _ => StepShape::Other,
    };
    if matches!(shape, StepShape::Other) {
        return Some(loop_step);
    }
    let Expr::Call(call) = &mut loop_step.expr else {
        return None;
    };
    match shape {
        StepShape::Conditional => call.args.first_mut(),
        StepShape::Append => match call.args.get_mut(1).map(|a| &mut a.expr) {
            Some(Expr::List(list)) => list.elements.first_mut(),
            _ => None,
        },
        StepShape::Other => None,
    }
}

enum StepShape {
    /// `pred ? step : @result`: `filter`, `exists_one`, 3-argument `map`.
    Conditional,
    /// `@result + [x]`: `map`.
    Append,
    Other,
}

/// Replaces `expr` with `@charge(expr, @budget, cost)`.
fn wrap(expr: &mut IdedExpr, cost: u64, ids: &mut Ids) {
    let budget = ids.next(Expr::Ident(BUDGET.to_owned()));
    let cost = ids.next(Expr::Literal(LiteralValue::Int(CelInt::from(
        i64::try_from(cost).unwrap_or(i64::MAX),
    ))));
    let id = ids.0;
    ids.0 += 1;
    let original = std::mem::replace(
        expr,
        IdedExpr {
            id,
            expr: Expr::Unspecified,
        },
    );
    expr.expr = Expr::Call(CallExpr {
        func_name: CHARGE.to_owned(),
        target: None,
        args: vec![original, budget, cost],
    });
}

fn node_count(expr: &IdedExpr) -> u64 {
    let mut count = 0;
    super::walk::visit_shallow(expr, &mut |_| count += 1);
    count
}
