//! Traversal of the `cel` crate's expression tree, shared by the instrumentation, the cost
//! estimate and error positions.

use cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr};

/// The direct sub-expressions of `expr`, in evaluation order.
pub(super) fn children(expr: &IdedExpr) -> Vec<&IdedExpr> {
    match &expr.expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .collect(),
        Expr::Select(select) => vec![&select.operand],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map.entries.iter().flat_map(entry_children).collect(),
        Expr::Struct(s) => s.entries.iter().flat_map(entry_children).collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The direct sub-expressions of `expr`, mutably.
pub(super) fn children_mut(expr: &mut IdedExpr) -> Vec<&mut IdedExpr> {
    match &mut expr.expr {
        Expr::Call(call) => call
            .target
            .as_deref_mut()
            .into_iter()
            .chain(&mut call.args)
            .collect(),
        Expr::Select(select) => vec![&mut select.operand],
        Expr::List(list) => list.elements.iter_mut().collect(),
        Expr::Map(map) => map
            .entries
            .iter_mut()
            .flat_map(entry_children_mut)
            .collect(),
        Expr::Struct(s) => s.entries.iter_mut().flat_map(entry_children_mut).collect(),
        Expr::Comprehension(c) => vec![
            &mut c.iter_range,
            &mut c.accu_init,
            &mut c.loop_cond,
            &mut c.loop_step,
            &mut c.result,
        ],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

fn entry_children(entry: &IdedEntryExpr) -> Vec<&IdedExpr> {
    match &entry.expr {
        EntryExpr::StructField(field) => vec![&field.value],
        EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
    }
}

fn entry_children_mut(entry: &mut IdedEntryExpr) -> Vec<&mut IdedExpr> {
    match &mut entry.expr {
        EntryExpr::StructField(field) => vec![&mut field.value],
        EntryExpr::MapEntry(e) => vec![&mut e.key, &mut e.value],
    }
}

/// Calls `f` on `expr` and every node below it, parents first.
pub(super) fn visit<'e>(expr: &'e IdedExpr, f: &mut impl FnMut(&'e IdedExpr)) {
    f(expr);
    for child in children(expr) {
        visit(child, f);
    }
}

/// Like [`visit`], but without the condition and step of comprehensions: the nodes one
/// evaluation passes through once, loops counted as one pass.
pub(super) fn visit_shallow<'e>(expr: &'e IdedExpr, f: &mut impl FnMut(&'e IdedExpr)) {
    f(expr);
    if let Expr::Comprehension(c) = &expr.expr {
        for part in [&c.iter_range, &c.accu_init, &c.result] {
            visit_shallow(part, f);
        }
        return;
    }
    for child in children(expr) {
        visit_shallow(child, f);
    }
}
