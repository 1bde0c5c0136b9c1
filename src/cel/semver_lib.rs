//! Kubernetes' CEL semver library: `semver(s[, normalize])`, `isSemver(s[, normalize])` and the
//! methods of `kubernetes.Semver` (`major`, `minor`, `patch`, `compareTo`, `isGreaterThan`,
//! `isLessThan`). Versions compare by semver precedence, build metadata ignored; `==` follows
//! the same rule. Version attributes of devices are values of this type.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::types::{BOOL_TYPE, CelBool, CelInt, CelString, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// The CEL type of version attributes and of `semver()` results.
pub(super) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

/// A semantic version as a CEL value.
#[derive(Clone, Debug)]
pub(super) struct SemverVal(pub(super) semver::Version);

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|other| other.0.cmp_precedence(&self.0) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for SemverVal {}

/// Declares the library on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || SEMVER_TYPE.to_owned();
    env.add_type(s())?;
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver_fn)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        semver_fn,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    env.add_member_overload("major", "semver_major", s(), vec![], major)?;
    env.add_member_overload("minor", "semver_minor", s(), vec![], minor)?;
    env.add_member_overload("patch", "semver_patch", s(), vec![], patch)?;
    env.add_member_overload("compareTo", "semver_compare_to", s(), vec![s()], compare_to)?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_is_greater_than",
        s(),
        vec![s()],
        is_greater_than,
    )?;
    env.add_member_overload(
        "isLessThan",
        "semver_is_less_than",
        s(),
        vec![s()],
        is_less_than,
    )?;
    Ok(())
}

/// Parses a version strictly (semver.org 2.0.0), as device attributes and `semver(s)` do.
pub(super) fn parse_strict(text: &str) -> Result<semver::Version, semver::Error> {
    semver::Version::parse(text)
}

/// Kubernetes' normalization for `semver(s, true)`: drops a leading `v`, strips leading zeros
/// from the numeric parts and fills in a missing minor or patch with 0.
fn parse_normalized(text: &str) -> Result<semver::Version, String> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts: Vec<String> = text.splitn(3, '.').map(str::to_owned).collect();
    for part in &mut parts {
        if part.len() > 1 {
            let trimmed = part.trim_start_matches('0');
            *part = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                trimmed.to_owned()
            } else {
                format!("0{trimmed}")
            };
        }
    }
    if parts.len() < 3 {
        if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
            return Err("short version cannot contain PreRelease/Build meta data".to_owned());
        }
        parts.resize(3, "0".to_owned());
    }
    parse_strict(&parts.join(".")).map_err(|e| e.to_string())
}

fn parse_args(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<Result<semver::Version, String>, ExecutionError> {
    let text = args
        .first()
        .and_then(|arg| arg.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "expects a string argument"))?;
    let normalize = match args.get(1) {
        None => false,
        Some(arg) => *arg
            .downcast_ref::<CelBool>()
            .ok_or_else(|| {
                ExecutionError::function_error(function, "expects a bool as second argument")
            })?
            .inner(),
    };
    Ok(if normalize {
        parse_normalized(text)
    } else {
        parse_strict(text).map_err(|e| e.to_string())
    }
    .map_err(|reason| format!("{text:?} is not a semantic version: {reason}")))
}

fn version_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    index: usize,
    function: &str,
) -> Result<&'a semver::Version, ExecutionError> {
    args.get(index)
        .and_then(|arg| arg.downcast_ref::<SemverVal>())
        .map(|v| &v.0)
        .ok_or_else(|| ExecutionError::function_error(function, "expects a semver argument"))
}

fn semver_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let version =
        parse_args(&args, "semver")?.map_err(|e| ExecutionError::function_error("semver", e))?;
    Ok(CowVal::owned(SemverVal(version)))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let valid = parse_args(&args, "isSemver")?.is_ok();
    Ok(CowVal::owned(CelBool::from(valid)))
}

fn component(value: u64, function: &str) -> Result<CelInt, ExecutionError> {
    i64::try_from(value).map(CelInt::from).map_err(|_| {
        ExecutionError::function_error(function, format!("{value} does not fit in an int"))
    })
}

fn major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component(
        version_arg(&args, 0, "major")?.major,
        "major",
    )?))
}

fn minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component(
        version_arg(&args, 0, "minor")?.minor,
        "minor",
    )?))
}

fn patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(component(
        version_arg(&args, 0, "patch")?.patch,
        "patch",
    )?))
}

fn precedence(args: &[CowVal<'_, '_>], function: &str) -> Result<Ordering, ExecutionError> {
    let a = version_arg(args, 0, function)?;
    let b = version_arg(args, 1, function)?;
    Ok(a.cmp_precedence(b))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelInt::from(
        precedence(&args, "compareTo")? as i64
    )))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let greater = precedence(&args, "isGreaterThan")? == Ordering::Greater;
    Ok(CowVal::owned(CelBool::from(greater)))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let less = precedence(&args, "isLessThan")? == Ordering::Less;
    Ok(CowVal::owned(CelBool::from(less)))
}
