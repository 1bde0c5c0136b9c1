//! `includes()`: one test that works whether an attribute is a scalar or a list, so selectors
//! keep working when a driver turns a scalar attribute into a list (Kubernetes' list-typed
//! attributes). `x.includes(v)` is `x == v` for a scalar and "some element equals `v`" for a
//! list; lists longer than [`MAX_LIST_LENGTH`] are an error.

use cel::common::types::{CelBool, DYN_TYPE, Kind};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};

/// The longest list `includes()` accepts.
pub const MAX_LIST_LENGTH: usize = 48;

/// Declares `includes` on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload(
        "includes",
        "dyn_includes_dyn",
        DYN_TYPE,
        vec![DYN_TYPE],
        includes,
    )
}

fn includes<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [target, needle] = args.as_slice() else {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    };
    let found = match target.as_iterable() {
        Some(iterable) if target.get_type().kind() == Kind::List => {
            let length = target.as_sizer().map_or(0, |s| *s.size().inner());
            if length > MAX_LIST_LENGTH as i64 {
                return Err(ExecutionError::function_error(
                    "includes",
                    format!(
                        "the list has {length} elements, includes() accepts at most {MAX_LIST_LENGTH}"
                    ),
                ));
            }
            let mut items = iterable.iter();
            let mut found = false;
            while let Some(item) = items.next() {
                if item.equals(needle.as_ref()) {
                    found = true;
                    break;
                }
            }
            found
        }
        _ => target.equals(needle.as_ref()),
    };
    Ok(CowVal::owned(CelBool::from(found)))
}
