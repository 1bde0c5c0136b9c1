//! The CEL environment of DRA selectors, built once per process: the CEL standard library,
//! the strings extension (`split`, `lowerAscii`, `join`, `replace`, `indexOf`, …), Kubernetes'
//! quantity and semver libraries, `includes()`, `cel.bind()` and the cost meter's hidden
//! function.

use std::sync::{Arc, LazyLock};

use cel::common::ast::{Expr, IdedExpr, ListExpr, LiteralValue};
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env, extensions};

use super::{cost, includes, quantity_lib, semver_lib};

static ENVIRONMENT: LazyLock<Result<Arc<Env>, DeclarationError>> =
    LazyLock::new(|| build().map(Arc::new));

/// The shared environment.
///
/// # Errors
/// Only if a declaration conflicts, which is a bug caught by any test.
pub(super) fn shared() -> Result<&'static Arc<Env>, DeclarationError> {
    ENVIRONMENT.as_ref().map_err(Clone::clone)
}

fn build() -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_extension(extensions::strings)?;
    quantity_lib::register(&mut env)?;
    semver_lib::register(&mut env)?;
    includes::register(&mut env)?;
    cost::register(&mut env)?;
    env.add_macro(Macro::receiver("bind", 3, bind))?;
    Ok(env)
}

/// `cel.bind(name, init, body)`: evaluates `body` with `name` bound to `init`, evaluated once.
/// Expands, as cel-go does, to a comprehension over an empty list whose accumulator is the
/// variable. A `bind` on any other target than `cel` is left alone.
fn bind(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(name)) if name == "cel") {
        return Ok(None);
    }
    // The macro is declared for exactly three arguments.
    let [variable, init, body] = <[IdedExpr; 3]>::try_from(std::mem::take(args)).map_err(|_| {
        helper.new_error(
            0,
            "cel.bind() takes a variable name, a value and an expression",
        )
    })?;
    let Expr::Ident(name) = variable.expr else {
        return Err(helper.new_error(
            variable.id,
            "cel.bind() variable name must be a simple identifier",
        ));
    };
    target.take();
    let iter_range = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let loop_cond = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let loop_step = helper.next_expr(Expr::Ident(name.clone()));
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(
        cel::common::ast::ComprehensionExpr {
            iter_range,
            iter_var: "#unused".to_owned(),
            iter_var2: None,
            accu_var: name,
            accu_init: init,
            loop_cond,
            loop_step,
            result: body,
        },
    )))))
}
