//! Compiled device selectors and the `gpu-dra cel` entry point.

use std::path::Path;
use std::sync::Arc;

use cel::Context;
use cel::Value;
use cel::common::ast::{Expr, IdedExpr, LiteralValue, SourceInfo};
use cel::common::types::CelBool;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use k8s_openapi::api::resource::v1::Device;

use super::cost::{self, Budget, Ids};
use super::device::DeviceVal;
use super::{CelError, DeviceView, diagnose, env, estimate, parse};

/// Kubernetes' cost limit for one evaluation of a device selector
/// (`CELSelectorExpressionMaxCost`).
pub const COST_LIMIT: u64 = 1_000_000;

/// Kubernetes' limit on the length of a selector expression, in bytes
/// (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;

/// How to compile a selector; the default is what Kubernetes does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// The cost an evaluation may spend before it is stopped, and the bound on the
    /// compile-time estimate.
    pub cost_limit: u64,
    /// Whether to reject expressions whose estimated worst-case cost exceeds `cost_limit`
    /// at compile time. Without it, only the runtime meter stops them.
    pub estimate_cost: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            cost_limit: COST_LIMIT,
            estimate_cost: true,
        }
    }
}

/// A CEL device selector, compiled once and evaluated against any number of devices, from any
/// number of threads (`Send + Sync`).
#[derive(Debug)]
pub struct Selector {
    expression: String,
    ast: IdedExpr,
    source: SourceInfo,
    estimated_cost: u64,
    cost_limit: u64,
}

impl Selector {
    /// Compiles `expression` with Kubernetes' limits (see [`CompileOptions::default`]).
    ///
    /// # Errors
    /// [`CelError::TooLong`], [`CelError::Syntax`] (with the position),
    /// [`CelError::NotBoolean`] for a constant of another type, and
    /// [`CelError::CostEstimate`] when the worst case is too expensive.
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        Self::compile_with(expression, CompileOptions::default())
    }

    /// Compiles `expression` with explicit limits.
    ///
    /// # Errors
    /// As [`compile`](Self::compile).
    pub fn compile_with(expression: &str, options: CompileOptions) -> Result<Self, CelError> {
        if expression.len() > MAX_EXPRESSION_LENGTH {
            return Err(CelError::TooLong {
                start: expression.chars().take(40).collect(),
                length: expression.len(),
                limit: MAX_EXPRESSION_LENGTH,
            });
        }
        let env = env::shared().map_err(|source| CelError::Environment { source })?;
        let (mut ast, source) = parse::parse(env, expression)?;
        if let Some(found) = constant_type(&ast).filter(|t| *t != "bool") {
            return Err(CelError::NotBoolean {
                expression: expression.to_owned(),
                found: found.to_owned(),
            });
        }
        let estimated_cost = estimate::worst_case_cost(&ast);
        if options.estimate_cost && estimated_cost > options.cost_limit {
            return Err(CelError::CostEstimate {
                expression: expression.to_owned(),
                estimated: estimated_cost,
                limit: options.cost_limit,
            });
        }
        let mut ids = Ids::after(&ast);
        cost::instrument(&mut ast, &mut ids);
        parse::check_call_nesting(expression, &ast)?;
        Ok(Selector {
            expression: expression.to_owned(),
            ast,
            source,
            estimated_cost,
            cost_limit: options.cost_limit,
        })
    }

    /// Whether `device` matches.
    ///
    /// # Errors
    /// [`CelError::Evaluation`] for runtime errors (a missing attribute name, a type
    /// mismatch, a failing function), with the position of the culprit where it can be
    /// found; [`CelError::CostLimit`] when the evaluation spent more than the cost limit;
    /// [`CelError::NotBool`] when the result is not a bool.
    pub fn evaluate(&self, device: &DeviceView) -> Result<bool, CelError> {
        let env = env::shared().map_err(|source| CelError::Environment { source })?;
        let budget = Budget::new(self.cost_limit);
        let scope = Scope {
            device: device.value(),
            budget: &budget,
        };
        let mut context = Context::with_env(Arc::clone(env));
        context.set_variable_resolver(&scope);
        let result = Value::resolve_val(&self.ast, &context);
        if budget.exceeded() {
            return Err(CelError::CostLimit {
                expression: self.expression.clone(),
                limit: self.cost_limit,
            });
        }
        let value = result.map_err(|error| {
            diagnose::runtime(
                &self.expression,
                &self.ast,
                &self.source,
                self.cost_limit,
                &error,
            )
        })?;
        match value.downcast_ref::<CelBool>() {
            Some(matched) => Ok(*matched.inner()),
            None => Err(CelError::NotBool {
                expression: self.expression.clone(),
                found: value.get_type().name().to_owned(),
            }),
        }
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The compile-time worst-case cost estimate, in the units of [`COST_LIMIT`].
    pub fn estimated_cost(&self) -> u64 {
        self.estimated_cost
    }
}

/// The variables of one evaluation: the device, and the budget the cost meter charges.
struct Scope<'a> {
    device: &'a DeviceVal,
    budget: &'a Budget,
}

impl VariableResolver for Scope<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        match variable {
            "device" => Some(CowVal::Borrowed(self.device as &dyn Val)),
            cost::BUDGET => Some(CowVal::Borrowed(self.budget as &dyn Val)),
            _ => None,
        }
    }
}

/// The type name of a constant root expression, which cannot change at runtime.
fn constant_type(ast: &IdedExpr) -> Option<&'static str> {
    Some(match &ast.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => "bool",
        Expr::Literal(LiteralValue::Int(_)) => "int",
        Expr::Literal(LiteralValue::UInt(_)) => "uint",
        Expr::Literal(LiteralValue::Double(_)) => "double",
        Expr::Literal(LiteralValue::String(_)) => "string",
        Expr::Literal(LiteralValue::Bytes(_)) => "bytes",
        Expr::Literal(LiteralValue::Null) => "null_type",
        Expr::List(_) => "list",
        Expr::Map(_) => "map",
        _ => return None,
    })
}

/// Evaluates `expression` against the device described in `device_file`: a
/// resource.k8s.io/v1 `Device` object (name, attributes, capacity, allowMultipleAllocations)
/// in YAML or JSON, published by `driver`. Backs `gpu-dra cel --expression EXPR --device FILE
/// [--driver NAME]`.
///
/// # Errors
/// [`CelError::ReadDevice`] and [`CelError::DecodeDevice`] for the file, the errors of
/// [`DeviceView::from_api`] for its content, and those of [`Selector::compile`] and
/// [`Selector::evaluate`].
pub fn evaluate_device_file(
    expression: &str,
    device_file: &Path,
    driver: &str,
) -> Result<bool, CelError> {
    let text = std::fs::read_to_string(device_file).map_err(|source| CelError::ReadDevice {
        path: device_file.to_owned(),
        source,
    })?;
    let device: Device = serde_yaml::from_str(&text).map_err(|source| CelError::DecodeDevice {
        path: device_file.to_owned(),
        source,
    })?;
    let selector = Selector::compile(expression)?;
    selector.evaluate(&DeviceView::from_api(driver, &device)?)
}
