//! The canonical form Kubernetes prints a quantity in (apimachinery's `CanonicalizeBytes`).
//!
//! - Zero is `0`.
//! - A binary value is printed with the largest binary suffix that keeps it an integer
//!   (`1536Mi`, `1Gi`), unless it is below 1024 in magnitude or has a fractional part, in which
//!   case it is printed as decimal SI (`500m`).
//! - A decimal value is printed with the exponent a multiple of three and as large as possible
//!   without a fraction (`1500m`, `1G`, `80n`); decimal-exponent values keep `e` notation
//!   (`1e3`, `80e-3`).
//! - Where no suffix exists (decimal above `E`, binary above `Ei`), exponent notation is used,
//!   as current Kubernetes does (`1e21`, `1180591620717411303424`).

use super::{NANOS_PER_UNIT, QuantityFormat};

const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

pub(super) fn canonical(nanos: i128, format: QuantityFormat) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let magnitude = nanos.unsigned_abs();
    let unit = NANOS_PER_UNIT as u128;
    if format == QuantityFormat::BinarySi
        && magnitude >= 1024 * unit
        && magnitude.is_multiple_of(unit)
    {
        let mut mantissa = magnitude / unit;
        let mut exponent = 0;
        while mantissa.is_multiple_of(1024) {
            mantissa /= 1024;
            exponent += 1;
        }
        if let Some(suffix) = BINARY_SUFFIXES.get(exponent) {
            return format!("{sign}{mantissa}{suffix}");
        }
        return format!(
            "{sign}{}",
            decimal(magnitude, QuantityFormat::DecimalExponent)
        );
    }
    let decimal_format = match format {
        QuantityFormat::DecimalExponent => QuantityFormat::DecimalExponent,
        QuantityFormat::DecimalSi | QuantityFormat::BinarySi => QuantityFormat::DecimalSi,
    };
    format!("{sign}{}", decimal(magnitude, decimal_format))
}

/// Mantissa and suffix of a non-zero magnitude given in nanos.
fn decimal(magnitude_nanos: u128, format: QuantityFormat) -> String {
    let mut mantissa = magnitude_nanos;
    let mut exponent: i64 = -9;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exponent += 1;
    }
    // Push the exponent down to a multiple of three: the digits grow instead (as zeros).
    let pad = exponent.rem_euclid(3);
    exponent -= pad;
    let zeros = "0".repeat(pad as usize);
    let suffix = match (format, exponent) {
        (QuantityFormat::DecimalExponent, 0) => String::new(),
        (QuantityFormat::DecimalExponent, e) => format!("e{e}"),
        (_, -9) => "n".to_owned(),
        (_, -6) => "u".to_owned(),
        (_, -3) => "m".to_owned(),
        (_, 0) => String::new(),
        (_, 3) => "k".to_owned(),
        (_, 6) => "M".to_owned(),
        (_, 9) => "G".to_owned(),
        (_, 12) => "T".to_owned(),
        (_, 15) => "P".to_owned(),
        (_, 18) => "E".to_owned(),
        (_, e) => format!("e{e}"),
    };
    format!("{mantissa}{zeros}{suffix}")
}
