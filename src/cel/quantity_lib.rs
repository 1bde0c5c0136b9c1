//! Kubernetes' CEL quantity library: `quantity()`, `isQuantity()` and the methods of
//! `kubernetes.Quantity` (`compareTo`, `isGreaterThan`, `isLessThan`, `add`, `sub`, `sign`,
//! `isInteger`, `asInteger`, `asApproximateFloat`). Two quantities are `==` when their values
//! are equal (`quantity('1k') == quantity('1000')`); `<` and friends are not defined on them,
//! as in Kubernetes.

use std::any::Any;

use cel::common::types::{CelBool, CelDouble, CelInt, CelString, INT_TYPE, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use crate::quantity::{Quantity, QuantityFormat};

/// The CEL type of capacities and of `quantity()` results.
pub(super) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");

/// A quantity as a CEL value.
#[derive(Clone, Debug)]
pub(super) struct QuantityVal(pub(super) Quantity);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|other| other.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityVal {}

/// Declares the library on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || QUANTITY_TYPE.to_owned();
    env.add_type(q())?;
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        quantity,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    // Kubernetes declares `sign` as a global overload but documents `q.sign()`: accept both.
    env.add_overload("sign", "quantity_sign", vec![q()], sign)?;
    env.add_member_overload("sign", "quantity_sign_member", q(), vec![], sign)?;
    env.add_member_overload(
        "isGreaterThan",
        "quantity_is_greater_than",
        q(),
        vec![q()],
        is_greater_than,
    )?;
    env.add_member_overload(
        "isLessThan",
        "quantity_is_less_than",
        q(),
        vec![q()],
        is_less_than,
    )?;
    env.add_member_overload(
        "compareTo",
        "quantity_compare_to",
        q(),
        vec![q()],
        compare_to,
    )?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_get_float",
        q(),
        vec![],
        as_approximate_float,
    )?;
    env.add_member_overload("asInteger", "quantity_get_int", q(), vec![], as_integer)?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], is_integer)?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], add)?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], add)?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], sub)?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], sub)?;
    Ok(())
}

fn string_arg<'a>(args: &'a [CowVal<'_, '_>], function: &str) -> Result<&'a str, ExecutionError> {
    args.first()
        .and_then(|arg| arg.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "expects a string argument"))
}

fn quantity_arg(
    args: &[CowVal<'_, '_>],
    index: usize,
    function: &str,
) -> Result<Quantity, ExecutionError> {
    let arg = args
        .get(index)
        .ok_or_else(|| ExecutionError::function_error(function, "missing argument"))?;
    if let Some(q) = arg.downcast_ref::<QuantityVal>() {
        return Ok(q.0);
    }
    // Kubernetes turns an int operand into a decimal-exponent quantity; the format only
    // shows when the receiver is zero.
    if let Some(i) = arg.downcast_ref::<CelInt>() {
        return Ok(Quantity::from_i64(*i.inner()).with_format(QuantityFormat::DecimalExponent));
    }
    Err(ExecutionError::function_error(
        function,
        format!("expects a quantity, got {}", arg.get_type().name()),
    ))
}

fn owned<'b, 'v>(val: impl Val + 'v) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(val))
}

fn quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let parsed = string_arg(&args, "quantity")?
        .parse::<Quantity>()
        .map_err(|e| ExecutionError::function_error("quantity", e))?;
    owned(QuantityVal(parsed))
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let valid = string_arg(&args, "isQuantity")?.parse::<Quantity>().is_ok();
    owned(CelBool::from(valid))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelInt::from(i64::from(
        quantity_arg(&args, 0, "sign")?.sign(),
    )))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (
        quantity_arg(&args, 0, "isGreaterThan")?,
        quantity_arg(&args, 1, "isGreaterThan")?,
    );
    owned(CelBool::from(a > b))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (
        quantity_arg(&args, 0, "isLessThan")?,
        quantity_arg(&args, 1, "isLessThan")?,
    );
    owned(CelBool::from(a < b))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (
        quantity_arg(&args, 0, "compareTo")?,
        quantity_arg(&args, 1, "compareTo")?,
    );
    owned(CelInt::from(a.cmp(&b) as i64))
}

fn as_approximate_float<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelDouble::from(
        quantity_arg(&args, 0, "asApproximateFloat")?.as_f64(),
    ))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let value = quantity_arg(&args, 0, "asInteger")?
        .as_i64()
        .map_err(|e| ExecutionError::function_error("asInteger", e))?;
    owned(CelInt::from(value))
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelBool::from(
        quantity_arg(&args, 0, "isInteger")?.is_integer(),
    ))
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (
        quantity_arg(&args, 0, "add")?,
        quantity_arg(&args, 1, "add")?,
    );
    let sum = a
        .checked_add(&b)
        .map_err(|e| ExecutionError::function_error("add", e))?;
    owned(QuantityVal(sum))
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (
        quantity_arg(&args, 0, "sub")?,
        quantity_arg(&args, 1, "sub")?,
    );
    let difference = a
        .checked_sub(&b)
        .map_err(|e| ExecutionError::function_error("sub", e))?;
    owned(QuantityVal(difference))
}
