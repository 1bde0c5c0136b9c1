//! Turning the `cel` crate's errors into the messages users see, with a position where one
//! can be found: parse errors carry theirs; for runtime errors the node that most likely
//! failed (the field, function or name the error names) is looked up in the expression.

use cel::common::ast::{Expr, IdedExpr, LiteralValue, SourceInfo, operators};
use cel::{ExecutionError, ParseErrors};

use super::error::Position;
use super::{CelError, cost, walk};

/// The compile error for a parse failure.
pub(super) fn syntax(expression: &str, errors: &ParseErrors) -> CelError {
    let position = errors.errors.first().and_then(|e| {
        let line = usize::try_from(e.pos.0).ok()?;
        let column = usize::try_from(e.pos.1).ok()?;
        (line > 0 && column > 0).then_some(Position { line, column })
    });
    CelError::Syntax {
        expression: expression.to_owned(),
        message: errors.to_string(),
        position,
    }
}

/// The evaluation error for `error`, raised while evaluating `ast`.
pub(super) fn runtime(
    expression: &str,
    ast: &IdedExpr,
    source: &SourceInfo,
    limit: u64,
    error: &ExecutionError,
) -> CelError {
    if matches!(error, ExecutionError::FunctionError { function, .. } if function == cost::CHARGE) {
        return CelError::CostLimit {
            expression: expression.to_owned(),
            limit,
        };
    }
    let (message, culprit) = describe(error);
    let position = culprit
        .and_then(|culprit| find(ast, &culprit))
        .and_then(|id| source.offset_for(id))
        .map(|(start, _)| position_of(expression, start as usize));
    CelError::Evaluation {
        expression: expression.to_owned(),
        message,
        position,
    }
}

/// What a node that raised the error looks like.
enum Culprit {
    /// A field selection or a constant index.
    Key(String),
    /// A call of this function.
    Function(String),
    /// An identifier.
    Name(String),
}

fn describe(error: &ExecutionError) -> (String, Option<Culprit>) {
    match error {
        ExecutionError::NoSuchKey(key) => (
            format!("no such key: {key}"),
            Some(Culprit::Key(key.to_string())),
        ),
        ExecutionError::UndeclaredReference(name) => (
            format!("undeclared reference to '{name}'"),
            Some(Culprit::Name(name.to_string())),
        ),
        ExecutionError::NoSuchOverload(overload) => (
            overload.to_string(),
            Some(Culprit::Function(overload.function().to_owned())),
        ),
        ExecutionError::FunctionError { function, message } => (
            format!("{function}(): {message}"),
            Some(Culprit::Function(function.clone())),
        ),
        other => (other.to_string(), None),
    }
}

/// The id of the first node, in evaluation order, that matches `culprit`.
fn find(ast: &IdedExpr, culprit: &Culprit) -> Option<u64> {
    let mut found = None;
    walk::visit(ast, &mut |node| {
        if found.is_none() && matches(node, culprit) {
            found = Some(node.id);
        }
    });
    found
}

fn matches(node: &IdedExpr, culprit: &Culprit) -> bool {
    match (&node.expr, culprit) {
        (Expr::Select(select), Culprit::Key(key)) => select.field == *key,
        (Expr::Call(call), Culprit::Key(key)) => {
            call.func_name == operators::INDEX
                && matches!(call.args.get(1).map(|a| &a.expr),
                    Some(Expr::Literal(LiteralValue::String(s))) if s.inner() == key)
        }
        (Expr::Call(call), Culprit::Function(name)) => call.func_name == *name,
        (Expr::Ident(ident), Culprit::Name(name)) => ident == name,
        (Expr::Call(call), Culprit::Name(name)) => call.func_name == *name,
        _ => false,
    }
}

/// Line and column (1-based, in characters) of character offset `offset`.
fn position_of(expression: &str, offset: usize) -> Position {
    let mut line = 1;
    let mut column = 1;
    for c in expression.chars().take(offset) {
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    Position { line, column }
}
