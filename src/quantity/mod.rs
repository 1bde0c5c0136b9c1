//! Kubernetes `resource.Quantity`: exact fixed-point amounts such as `80Gi`, `1500m` or `1e3`.
//!
//! A [`Quantity`] holds its value as a signed count of nanos (10^-9) in an `i128`, which is
//! exact for everything Kubernetes can store (it rounds every quantity up to the next nano),
//! and covers magnitudes up to about 1.7 × 10^29. Parsing follows apimachinery's
//! `ParseQuantity` (suffixes, rounding away from zero to the nano, binary values capped at
//! 2^63-1) and [`Display`](std::fmt::Display) prints the canonical form Kubernetes prints.
//! Values beyond the supported range are rejected with [`QuantityError::OutOfRange`] rather
//! than silently clamped. Equality, ordering and hashing go by exact value only: `1Gi`,
//! `1024Mi` and `1073741824` are equal.
//!
//! Used by the device model (capacities), the allocator (consumable capacity) and opaque
//! configuration validation; pure, no I/O.

mod arith;
mod format;
mod parse;

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nanos in one unit: quantities are stored as multiples of 10^-9.
pub const NANOS_PER_UNIT: i64 = 1_000_000_000;

/// The suffixes a quantity may carry, for error messages.
const VALID_SUFFIXES: &str = "Ki, Mi, Gi, Ti, Pi, Ei (binary), n, u, m, k, M, G, T, P, E \
     (decimal), none, or e/E followed by an integer exponent such as 1e3";

/// How a quantity was written, which decides how it is printed (Kubernetes' `Format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantityFormat {
    /// Powers of ten with SI suffixes: `1500m`, `10G`.
    DecimalSi,
    /// Powers of two with binary suffixes: `1536Mi`, `80Gi`.
    BinarySi,
    /// Powers of ten in `e` notation: `1e3`, `80e-3`.
    DecimalExponent,
}

/// Why a quantity could not be parsed or computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Parsing: the string is empty.
    #[error("\"\" is not a quantity: the value is empty; write a number with an optional suffix ({suffixes})", suffixes = VALID_SUFFIXES)]
    Empty,
    /// Parsing: the string does not have the shape `<sign><digits>.<digits><suffix>`.
    #[error("{value:?} is not a quantity: expected an optional sign, digits with an optional decimal point, and an optional suffix ({suffixes})", suffixes = VALID_SUFFIXES)]
    Malformed { value: String },
    /// Parsing: the number is followed by something that is not a known suffix.
    #[error("{value:?} is not a quantity: unknown suffix {suffix:?}; valid suffixes are {suffixes}", suffixes = VALID_SUFFIXES)]
    UnknownSuffix { value: String, suffix: String },
    /// Parsing: the value is well formed but larger than this implementation supports.
    #[error(
        "{value:?} is outside the supported range of quantities (magnitude up to about 1.7e29)"
    )]
    OutOfRange { value: String },
    /// Conversion to an integer: the value has a fractional part.
    #[error("cannot convert {value} to an integer: it has a fractional part")]
    NotAnInteger { value: String },
    /// Conversion to an integer: the value does not fit in an `i64`.
    #[error("cannot convert {value} to an integer: it is outside the 64-bit integer range")]
    IntegerOverflow { value: String },
    /// Arithmetic: the result leaves the supported range.
    #[error("{lhs} {op} {rhs} is outside the supported range of quantities")]
    ArithmeticOverflow {
        op: &'static str,
        lhs: String,
        rhs: String,
    },
    /// Rounding to a step: the step is zero or negative, so no multiple of it reaches the value.
    #[error("cannot round to a step of {step}: a step must be above zero")]
    NonPositiveStep { step: String },
}

impl QuantityError {
    /// What is wrong, without repeating the value: for messages that already name the field
    /// and the value themselves, such as `capacity.memory is "lots": it does not start with a
    /// number`. Parse problems about the suffix list the valid suffixes.
    pub fn problem(&self) -> String {
        match self {
            QuantityError::Empty => "it is empty".to_owned(),
            QuantityError::Malformed { value } => {
                let unsigned = value.strip_prefix(['+', '-']).unwrap_or(value);
                let after_whole = skip_digits(unsigned);
                let after = after_whole
                    .strip_prefix('.')
                    .map_or(after_whole, skip_digits);
                if after.len() == unsigned.len() {
                    "it does not start with a number".to_owned()
                } else {
                    unknown_suffix(after)
                }
            }
            QuantityError::UnknownSuffix { suffix, .. } => unknown_suffix(suffix),
            QuantityError::OutOfRange { .. } => {
                "it is outside the supported range of quantities (magnitude up to about 1.7e29)"
                    .to_owned()
            }
            QuantityError::NotAnInteger { .. } => "it has a fractional part".to_owned(),
            QuantityError::IntegerOverflow { .. } => {
                "it is outside the 64-bit integer range".to_owned()
            }
            QuantityError::ArithmeticOverflow { op, lhs, rhs } => {
                format!("{lhs} {op} {rhs} is outside the supported range of quantities")
            }
            QuantityError::NonPositiveStep { .. } => "a step must be above zero".to_owned(),
        }
    }
}

fn skip_digits(text: &str) -> &str {
    text.trim_start_matches(|c: char| c.is_ascii_digit())
}

fn unknown_suffix(suffix: &str) -> String {
    format!("unknown suffix {suffix:?}; valid suffixes are {VALID_SUFFIXES}")
}

/// An exact Kubernetes quantity. See the [module documentation](self).
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: QuantityFormat,
}

impl Quantity {
    /// Zero, printed as `0`.
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: QuantityFormat::DecimalSi,
    };

    /// The integer `value`, in decimal SI format (`1000` prints as `1k`).
    pub fn from_i64(value: i64) -> Self {
        Quantity {
            nanos: i128::from(value) * i128::from(NANOS_PER_UNIT),
            format: QuantityFormat::DecimalSi,
        }
    }

    /// Parses the string of a Kubernetes API quantity.
    ///
    /// # Errors
    /// Fails as [`str::parse`] does, naming the value.
    pub fn from_k8s(
        quantity: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    ) -> Result<Self, QuantityError> {
        quantity.0.parse()
    }

    /// The Kubernetes API form, carrying the canonical string.
    pub fn to_k8s(&self) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(self.to_string())
    }

    /// The exact value as a count of nanos (10^-9 units).
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }

    /// How the value is printed.
    pub fn format(&self) -> QuantityFormat {
        self.format
    }

    /// The same value, printed in another format.
    pub fn with_format(self, format: QuantityFormat) -> Self {
        Quantity { format, ..self }
    }

    /// `-1`, `0` or `1` as the value is negative, zero or positive.
    pub fn sign(&self) -> i32 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whether [`as_i64`](Self::as_i64) succeeds: the value is whole and fits an `i64`.
    pub fn is_integer(&self) -> bool {
        self.as_i64().is_ok()
    }

    /// The value as an `i64`.
    ///
    /// # Errors
    /// [`QuantityError::NotAnInteger`] when the value has a fractional part,
    /// [`QuantityError::IntegerOverflow`] when it is outside the `i64` range.
    pub fn as_i64(&self) -> Result<i64, QuantityError> {
        let unit = i128::from(NANOS_PER_UNIT);
        if self.nanos % unit != 0 {
            return Err(QuantityError::NotAnInteger {
                value: self.to_string(),
            });
        }
        i64::try_from(self.nanos / unit).map_err(|_| QuantityError::IntegerOverflow {
            value: self.to_string(),
        })
    }

    /// The value as the nearest `f64`; large values lose precision.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    /// `self + other`, exactly. The result keeps this quantity's format, or takes
    /// `other`'s when this one is zero (as Kubernetes' `Add` does).
    ///
    /// # Errors
    /// [`QuantityError::ArithmeticOverflow`] when the sum leaves the supported range.
    pub fn checked_add(&self, other: &Quantity) -> Result<Quantity, QuantityError> {
        self.combine(other, "+", self.nanos.checked_add(other.nanos))
    }

    /// `self - other`, exactly, with the same format rule as [`checked_add`](Self::checked_add).
    ///
    /// # Errors
    /// [`QuantityError::ArithmeticOverflow`] when the difference leaves the supported range.
    pub fn checked_sub(&self, other: &Quantity) -> Result<Quantity, QuantityError> {
        self.combine(other, "-", self.nanos.checked_sub(other.nanos))
    }

    fn combine(
        &self,
        other: &Quantity,
        op: &'static str,
        nanos: Option<i128>,
    ) -> Result<Quantity, QuantityError> {
        let nanos = nanos.ok_or_else(|| QuantityError::ArithmeticOverflow {
            op,
            lhs: self.to_string(),
            rhs: other.to_string(),
        })?;
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        Ok(Quantity { nanos, format })
    }
}

impl Default for Quantity {
    fn default() -> Self {
        Quantity::ZERO
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    /// Parses Kubernetes' quantity syntax, e.g. `80Gi`, `1500m`, `1.5`, `-2e3`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (nanos, format) = parse::parse(s)?;
        Ok(Quantity { nanos, format })
    }
}

impl fmt::Display for Quantity {
    /// The canonical form, as Kubernetes prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format::canonical(self.nanos, self.format))
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl From<i64> for Quantity {
    fn from(value: i64) -> Self {
        Quantity::from_i64(value)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    /// Accepts the string form, or a plain JSON/YAML number as Kubernetes does.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity such as \"80Gi\", \"1500m\" or 4")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity::from_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        v.to_string().parse().map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        v.to_string().parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests;
