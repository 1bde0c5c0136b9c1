//! The Kubernetes quantity grammar, read the way apimachinery's `ParseQuantity` reads it.
//!
//! `<sign>? <digits> [. <digits>] <suffix>`, where the suffix is one of the binary (`Ki`..`Ei`)
//! or decimal (`n`..`E`) SI suffixes, or `e`/`E` followed by a signed exponent. Values are
//! rounded away from zero to the next nano (`0.1n` is `1n`), and binary values are capped at
//! 2^63-1, as Kubernetes does. The exact value is computed on a small arbitrary-precision
//! integer so that long inputs round exactly, then stored as an `i128` count of nanos.

use super::{NANOS_PER_UNIT, QuantityError, QuantityFormat};

/// Characters Kubernetes' scanner accepts at the start of a suffix.
const SUFFIX_CHARS: &[u8] = b"eEinumkKMGTP";

/// The largest magnitude a binary-suffixed value keeps: 2^63-1 units, in nanos.
const BINARY_CAP_NANOS: u128 = (i64::MAX as u128) * NANOS_PER_UNIT as u128;

/// What a suffix multiplies the number by.
enum Multiplier {
    /// `10^exponent`.
    Decimal(i64),
    /// `2^exponent`.
    Binary(u32),
}

/// Parses `input` into a signed count of nanos and the format it was written in.
pub(super) fn parse(input: &str) -> Result<(i128, QuantityFormat), QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bytes = input.as_bytes();
    let mut pos = 0;
    let negative = match bytes[0] {
        b'-' => {
            pos = 1;
            true
        }
        b'+' => {
            pos = 1;
            false
        }
        _ => false,
    };
    while pos < bytes.len() && bytes[pos] == b'0' {
        pos += 1;
    }
    // Kubernetes reads a sign followed by nothing but zeros ("-", "+0", "000") as zero.
    if pos == bytes.len() {
        return Ok((0, QuantityFormat::DecimalSi));
    }
    let num_start = pos;
    pos = skip_digits(bytes, pos);
    let num = &input[num_start..pos];
    let mut fraction = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        let start = pos + 1;
        pos = skip_digits(bytes, start);
        fraction = &input[start..pos];
    }
    let suffix_start = pos;
    while pos < bytes.len() && SUFFIX_CHARS.contains(&bytes[pos]) {
        pos += 1;
    }
    if pos < bytes.len() && matches!(bytes[pos], b'-' | b'+') {
        pos += 1;
    }
    pos = skip_digits(bytes, pos);
    if pos < bytes.len() {
        return Err(QuantityError::Malformed {
            value: input.to_owned(),
        });
    }
    let suffix = &input[suffix_start..];
    let (multiplier, format) =
        interpret_suffix(suffix).ok_or_else(|| QuantityError::UnknownSuffix {
            value: input.to_owned(),
            suffix: suffix.to_owned(),
        })?;

    let fraction_len = i64::try_from(fraction.len()).map_err(|_| out_of_range(input))?;
    let (shift10, binary_exponent) = match multiplier {
        Multiplier::Decimal(exponent) => (exponent - fraction_len, 0),
        Multiplier::Binary(exponent) => (-fraction_len, exponent),
    };
    let magnitude = nanos_of(num, fraction, shift10, binary_exponent);
    let magnitude = match (magnitude, format) {
        (Some(m), QuantityFormat::BinarySi) => m.min(BINARY_CAP_NANOS),
        (None, QuantityFormat::BinarySi) => BINARY_CAP_NANOS,
        (Some(m), _) if m <= i128::MAX as u128 => m,
        _ => return Err(out_of_range(input)),
    };
    // A binary value below one unit cannot be shown with a binary suffix; Kubernetes
    // switches it to decimal so that it prints as e.g. "512m".
    let format = if format == QuantityFormat::BinarySi
        && magnitude > 0
        && magnitude < NANOS_PER_UNIT as u128
    {
        QuantityFormat::DecimalSi
    } else {
        format
    };
    // The magnitude is at most i128::MAX here (the binary cap is far below it).
    let signed = i128::try_from(magnitude).map_err(|_| out_of_range(input))?;
    Ok((if negative { -signed } else { signed }, format))
}

fn out_of_range(input: &str) -> QuantityError {
    QuantityError::OutOfRange {
        value: input.to_owned(),
    }
}

fn skip_digits(bytes: &[u8], mut pos: usize) -> usize {
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    pos
}

fn interpret_suffix(suffix: &str) -> Option<(Multiplier, QuantityFormat)> {
    use Multiplier::{Binary, Decimal};
    use QuantityFormat::{BinarySi, DecimalExponent, DecimalSi};
    let known = match suffix {
        "" => (Decimal(0), DecimalSi),
        "n" => (Decimal(-9), DecimalSi),
        "u" => (Decimal(-6), DecimalSi),
        "m" => (Decimal(-3), DecimalSi),
        "k" => (Decimal(3), DecimalSi),
        "M" => (Decimal(6), DecimalSi),
        "G" => (Decimal(9), DecimalSi),
        "T" => (Decimal(12), DecimalSi),
        "P" => (Decimal(15), DecimalSi),
        "E" => (Decimal(18), DecimalSi),
        "Ki" => (Binary(10), BinarySi),
        "Mi" => (Binary(20), BinarySi),
        "Gi" => (Binary(30), BinarySi),
        "Ti" => (Binary(40), BinarySi),
        "Pi" => (Binary(50), BinarySi),
        "Ei" => (Binary(60), BinarySi),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .filter(|rest| !rest.is_empty())?
                .parse::<i64>()
                .ok()?;
            // Kubernetes keeps the exponent in an int32 that it negates.
            if exponent.unsigned_abs() > i32::MAX as u64 {
                return None;
            }
            (Decimal(exponent), DecimalExponent)
        }
    };
    Some(known)
}

/// `ceil(digits × 2^binary_exponent × 10^(shift10 + 9))`, where the digits are those of
/// `num` then `fraction`: the magnitude in nanos, rounded away from zero, or `None` when it
/// does not fit in a `u128`.
fn nanos_of(num: &str, fraction: &str, shift10: i64, binary_exponent: u32) -> Option<u128> {
    // Up to 30 digits fit in a u128 with room for the binary multiplier: the common case,
    // computed without allocating.
    if num.len() + fraction.len() <= 30 {
        let digits = num.bytes().chain(fraction.bytes());
        let n = digits.fold(0u128, |acc, d| acc * 10 + u128::from(d - b'0'));
        return scale_nanos(n, shift10, binary_exponent);
    }
    nanos_of_long(&format!("{num}{fraction}"), shift10, binary_exponent)
}

/// `ceil(n × 2^binary_exponent × 10^(shift10 + 9))` in `u128` arithmetic.
fn scale_nanos(n: u128, shift10: i64, binary_exponent: u32) -> Option<u128> {
    if n == 0 {
        return Some(0);
    }
    let n = n.checked_mul(1u128.checked_shl(binary_exponent)?)?;
    let scale = shift10.saturating_add(9);
    if scale >= 0 {
        let factor = 10u128.checked_pow(u32::try_from(scale).ok()?)?;
        return n.checked_mul(factor);
    }
    // n < 10^39, so dividing by 10^39 or more leaves a non-zero fraction of one nano.
    let Some(divisor) = u32::try_from(scale.unsigned_abs())
        .ok()
        .and_then(|k| 10u128.checked_pow(k))
    else {
        return Some(1);
    };
    Some(n / divisor + u128::from(n % divisor != 0))
}

/// The general case of [`nanos_of`], for any number of digits.
fn nanos_of_long(digits: &str, shift10: i64, binary_exponent: u32) -> Option<u128> {
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some(0);
    }
    let trailing_zeros = (significant.len() - trimmed.len()) as i64;
    let scale = shift10.saturating_add(trailing_zeros).saturating_add(9);
    let digit_count = trimmed.len() as i64;
    // At least 10^(digit_count - 1 + scale) nanos: beyond any u128 once that is 10^39.
    if digit_count.saturating_add(scale) > 40 {
        return None;
    }
    // Below 10^(digit_count + scale) × 2^60 < 10^(digit_count + scale + 19) nanos: a
    // non-zero value that small rounds up to exactly one nano.
    if digit_count.saturating_add(scale).saturating_add(19) <= 0 {
        return Some(1);
    }
    let mut value = BigUint::from_decimal(trimmed);
    let mut remaining = binary_exponent;
    while remaining > 0 {
        let step = remaining.min(31);
        value.mul_small(1 << step);
        remaining -= step;
    }
    if scale >= 0 {
        value.mul_pow10(scale.unsigned_abs());
    } else if value.div_pow10(scale.unsigned_abs()) {
        value.add_small(1);
    }
    value.to_u128()
}

/// Just enough unsigned arbitrary-precision arithmetic to scale a decimal string exactly.
/// Little-endian base-2^32 limbs.
struct BigUint(Vec<u32>);

impl BigUint {
    fn from_decimal(digits: &str) -> Self {
        let mut value = BigUint(Vec::new());
        for chunk in digits.as_bytes().chunks(9) {
            let chunk_value = chunk
                .iter()
                .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
            value.mul_small(10u32.pow(chunk.len() as u32));
            value.add_small(chunk_value);
        }
        value
    }

    fn mul_small(&mut self, factor: u32) {
        let mut carry = 0u64;
        for limb in &mut self.0 {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = product as u32;
            carry = product >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    fn add_small(&mut self, addend: u32) {
        let mut carry = u64::from(addend);
        for limb in &mut self.0 {
            if carry == 0 {
                return;
            }
            let sum = u64::from(*limb) + carry;
            *limb = sum as u32;
            carry = sum >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    /// Divides in place and returns the remainder.
    fn div_small(&mut self, divisor: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.0.iter_mut().rev() {
            let current = (remainder << 32) | u64::from(*limb);
            *limb = (current / u64::from(divisor)) as u32;
            remainder = current % u64::from(divisor);
        }
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
        remainder as u32
    }

    fn mul_pow10(&mut self, mut exponent: u64) {
        while exponent > 0 {
            let step = exponent.min(9);
            self.mul_small(10u32.pow(step as u32));
            exponent -= step;
        }
    }

    /// Divides by `10^exponent`, truncating; returns whether anything was cut off.
    fn div_pow10(&mut self, mut exponent: u64) -> bool {
        let mut inexact = false;
        while exponent > 0 {
            if self.0.is_empty() {
                break;
            }
            let step = exponent.min(9);
            inexact |= self.div_small(10u32.pow(step as u32)) != 0;
            exponent -= step;
        }
        inexact
    }

    fn to_u128(&self) -> Option<u128> {
        let significant = self
            .0
            .iter()
            .rposition(|limb| *limb != 0)
            .map_or(0, |i| i + 1);
        if significant > 4 {
            return None;
        }
        Some(
            self.0[..significant]
                .iter()
                .rev()
                .fold(0u128, |acc, limb| (acc << 32) | u128::from(*limb)),
        )
    }
}
