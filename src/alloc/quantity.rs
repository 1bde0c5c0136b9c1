//! Exact arithmetic on Kubernetes quantities, just enough for capacities and counters.
//!
//! A stand-in until `crate::quantity` is available: amounts are held as whole nano-units in
//! an `i128`, so `80Gi`, `9984Mi`, `1` and `500m` add and compare without rounding.

use std::fmt;

/// A quantity in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i128);

/// How a quantity was written, so results are printed back in the same family of suffixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Ki, Mi, Gi, … (powers of 1024).
    Binary,
    /// k, M, G, … or no suffix (powers of 1000).
    Decimal,
}

const NANO: i128 = 1_000_000_000;

const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

const DECIMAL: [(&str, i32); 10] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// Parses a quantity such as `80Gi`, `1.5G`, `250m` or `1e3`.
    ///
    /// Fails with a short description of the problem when the text is not a quantity, is
    /// finer than a nano-unit or too large to hold.
    pub fn parse(text: &str) -> Result<(Amount, Style), &'static str> {
        let text = text.trim();
        let (negative, rest) = match text.as_bytes().first() {
            None => return Err("it is empty"),
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            Some(_) => (false, text),
        };
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err("it does not start with a number");
        }
        if whole.len() + fraction.len() > 30 {
            return Err("it has too many digits");
        }
        let mut mantissa: i128 = 0;
        for digit in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa * 10 + i128::from(digit - b'0');
        }
        let (style, exp10, exp2) = suffix_scale(suffix)?;
        let scaled = mantissa
            .checked_mul(1i128 << exp2)
            .ok_or("it is too large")?;
        let power = exp10 - fraction.len() as i32 + 9;
        let nanos = if power >= 0 {
            10i128
                .checked_pow(power as u32)
                .and_then(|p| scaled.checked_mul(p))
                .ok_or("it is too large")?
        } else {
            let divisor = 10i128
                .checked_pow((-power) as u32)
                .ok_or("it is finer than a nano-unit")?;
            if scaled % divisor != 0 {
                return Err("it is finer than a nano-unit");
            }
            scaled / divisor
        };
        Ok((Amount(if negative { -nanos } else { nanos }), style))
    }

    /// Adds, saturating instead of overflowing.
    pub fn plus(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }

    /// Subtracts, saturating instead of overflowing.
    pub fn minus(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// True for amounts below zero.
    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The remainder of `self` divided by `step`, or `None` for a zero step.
    pub fn rem(self, step: Amount) -> Option<Amount> {
        (step.0 != 0).then(|| Amount(self.0 % step.0))
    }

    /// Rounds `self` up to the next `base + n * step` (n ≥ 0). `None` for a zero step.
    pub fn round_up_from(self, base: Amount, step: Amount) -> Option<Amount> {
        if step.0 <= 0 {
            return None;
        }
        if self.0 <= base.0 {
            return Some(base);
        }
        let over = self.0 - base.0;
        let steps = over / step.0 + i128::from(over % step.0 != 0);
        Some(Amount(base.0.saturating_add(steps.saturating_mul(step.0))))
    }

    /// Prints the amount the way Kubernetes prints a canonical quantity of this style.
    pub fn format(self, style: Style) -> String {
        let sign = if self.0 < 0 { "-" } else { "" };
        let nanos = self.0.unsigned_abs();
        if nanos == 0 {
            return "0".to_string();
        }
        let nano = NANO.unsigned_abs();
        if !nanos.is_multiple_of(nano) {
            for (suffix, divisor) in [("m", 1_000_000u128), ("u", 1_000), ("n", 1)] {
                if nanos.is_multiple_of(divisor) {
                    return format!("{sign}{}{suffix}", nanos / divisor);
                }
            }
        }
        let units = nanos / nano;
        if style == Style::Binary {
            for (suffix, shift) in BINARY.iter().rev() {
                if units.is_multiple_of(1u128 << shift) {
                    return format!("{sign}{}{suffix}", units >> shift);
                }
            }
            return format!("{sign}{units}");
        }
        for (suffix, exp) in DECIMAL.iter().rev().filter(|(_, e)| *e > 0) {
            let divisor = 10u128.pow(*exp as u32);
            if units.is_multiple_of(divisor) {
                return format!("{sign}{}{suffix}", units / divisor);
            }
        }
        format!("{sign}{units}")
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format(Style::Decimal))
    }
}

/// Returns (style, power of ten, power of two) for a suffix.
fn suffix_scale(suffix: &str) -> Result<(Style, i32, u32), &'static str> {
    if let Some((_, shift)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        return Ok((Style::Binary, 0, *shift));
    }
    if let Some((_, exp)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        return Ok((Style::Decimal, *exp, 0));
    }
    if let Some(exponent) = suffix.strip_prefix(['e', 'E']) {
        let exp: i32 = exponent
            .parse()
            .map_err(|_| "its suffix is not a known unit")?;
        if !(-40..=40).contains(&exp) {
            return Err("its exponent is out of range");
        }
        return Ok((Style::Decimal, exp, 0));
    }
    Err("its suffix is not a known unit (valid: n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(text: &str) -> Amount {
        Amount::parse(text).expect("test quantity parses").0
    }

    #[test]
    fn binary_and_decimal_suffixes_compare_exactly() {
        assert_eq!(amount("1Gi"), amount("1024Mi"));
        assert_eq!(amount("1.5Gi"), amount("1536Mi"));
        assert_eq!(amount("1k"), amount("1000"));
        assert_eq!(amount("1e3"), amount("1k"));
        assert_eq!(amount("500m").plus(amount("0.5")), amount("1"));
        assert!(amount("9984Mi") < amount("10Gi"));
    }

    #[test]
    fn amounts_print_in_canonical_form() {
        let cases = [
            ("80Gi", Style::Binary, "80Gi"),
            ("1.5Gi", Style::Binary, "1536Mi"),
            ("1000", Style::Decimal, "1k"),
            ("1500", Style::Decimal, "1500"),
            ("0.5", Style::Decimal, "500m"),
            ("1000", Style::Binary, "1000"),
            ("0", Style::Binary, "0"),
        ];
        for (input, style, want) in cases {
            assert_eq!(want, amount(input).format(style), "{input}");
        }
    }

    #[test]
    fn malformed_quantities_are_rejected_with_the_problem() {
        assert_eq!(Err("it is empty"), Amount::parse(""));
        assert_eq!(Err("it does not start with a number"), Amount::parse("Gi"));
        assert!(Amount::parse("10Xi").is_err());
        assert_eq!(
            Err("it is finer than a nano-unit"),
            Amount::parse("0.0000000001")
        );
    }

    #[test]
    fn rounding_up_follows_the_step_from_the_base() {
        let got = amount("5Gi").round_up_from(amount("1Gi"), amount("2Gi"));
        assert_eq!(Some(amount("5Gi")), got);
        let got = amount("6Gi").round_up_from(amount("1Gi"), amount("2Gi"));
        assert_eq!(Some(amount("7Gi")), got);
        let got = amount("0").round_up_from(amount("1Gi"), amount("2Gi"));
        assert_eq!(Some(amount("1Gi")), got);
    }
}
