//! Parsing without risking the caller's stack.
//!
//! The `cel` crate's ANTLR parser recurses deeply: each nested bracket costs it well over
//! 100 KiB of stack in debug builds, and long operator or field chains a few KiB per link, so
//! a hostile 10 KiB expression would overflow a 2 MiB thread and abort the process. Parsing
//! therefore runs on a thread of its own with a large stack (reserved, not committed), after
//! a lexical check bounds bracket nesting, and the tree it produces is rejected when it is
//! deeper than evaluation can safely recurse.

use std::sync::Arc;

use cel::Env;
use cel::common::ast::{Expr, IdedExpr, SourceInfo, operators};

use super::{CelError, diagnose, walk};

/// How deep brackets (`(`, `[`, `{`) may nest.
pub const MAX_BRACKET_NESTING: usize = 32;

/// How deep the expression tree may be.
pub const MAX_TREE_DEPTH: usize = 200;

/// How many function calls, operators, conditionals, comprehensions and list or map literals
/// may nest (`&&`, `||` and `!` not counted): each costs the evaluator tens of KiB of stack in debug builds, and
/// evaluation runs on the caller's thread.
pub const MAX_CALL_NESTING: usize = 24;

/// Stack for the parser thread; only the pages it touches are committed.
const PARSER_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Parses `expression` into its tree and source positions.
pub(super) fn parse(env: &Arc<Env>, expression: &str) -> Result<(IdedExpr, SourceInfo), CelError> {
    let brackets = bracket_nesting(expression);
    if brackets > MAX_BRACKET_NESTING {
        return Err(too_complex(
            expression,
            format!(
                "brackets nest {brackets} levels deep, at most {MAX_BRACKET_NESTING} are allowed"
            ),
        ));
    }
    let parsed = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("cel-parser".to_owned())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(scope, || env.parser().parse_with_source_info(expression))
            .map(|handle| handle.join())
    });
    let (ast, source) = match parsed {
        Err(source) => {
            return Err(CelError::ParserThread {
                expression: expression.to_owned(),
                source,
            });
        }
        Ok(Err(_panic)) => {
            return Err(too_complex(
                expression,
                "the parser gave up on it".to_owned(),
            ));
        }
        Ok(Ok(result)) => result.map_err(|errors| diagnose::syntax(expression, &errors))?,
    };
    let (depth, _) = nesting(&ast);
    if depth > MAX_TREE_DEPTH {
        return Err(too_complex(
            expression,
            format!(
                "its tree is {depth} levels deep, at most {MAX_TREE_DEPTH} are allowed; split long chains of operators"
            ),
        ));
    }
    Ok((ast, source))
}

/// Checks the call nesting of the tree that will be evaluated (after instrumentation).
pub(super) fn check_call_nesting(expression: &str, ast: &IdedExpr) -> Result<(), CelError> {
    let (_, calls) = nesting(ast);
    if calls > MAX_CALL_NESTING {
        return Err(too_complex(
            expression,
            format!(
                "function calls and operators nest {calls} levels deep, at most {MAX_CALL_NESTING} are allowed"
            ),
        ));
    }
    Ok(())
}

pub(super) fn too_complex(expression: &str, reason: String) -> CelError {
    CelError::TooComplex {
        expression: expression.to_owned(),
        reason,
    }
}

/// The deepest nesting of brackets outside string literals.
fn bracket_nesting(expression: &str) -> usize {
    let mut depth: usize = 0;
    let mut deepest = 0;
    let mut quote: Option<char> = None;
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                if c == '\\' {
                    chars.next();
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => quote = Some(c),
                '(' | '[' | '{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

/// The depth of the tree and its deepest nesting of calls, without recursion (the tree
/// may be deep).
fn nesting(ast: &IdedExpr) -> (usize, usize) {
    let (mut deepest, mut most_calls) = (0, 0);
    let mut pending = vec![(ast, 1, 0)];
    while let Some((node, depth, calls)) = pending.pop() {
        let calls = calls + frames(node);
        deepest = deepest.max(depth);
        most_calls = most_calls.max(calls);
        pending.extend(
            walk::children(node)
                .into_iter()
                .map(|child| (child, depth + 1, calls)),
        );
    }
    (deepest, most_calls)
}

/// How many large stack frames evaluating `node` takes, beyond its operands' (measured on
/// the `cel` crate: `&&`, `||`, `!`, field selection and leaves are cheap; a comprehension
/// costs two).
fn frames(node: &IdedExpr) -> usize {
    match &node.expr {
        Expr::Call(call) => usize::from(!matches!(
            call.func_name.as_str(),
            operators::LOGICAL_AND | operators::LOGICAL_OR | operators::LOGICAL_NOT
        )),
        Expr::Comprehension(_) => 2,
        Expr::List(_) | Expr::Map(_) | Expr::Struct(_) => 1,
        Expr::Select(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    }
}
