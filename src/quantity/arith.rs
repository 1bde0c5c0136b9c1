//! Arithmetic beyond `checked_add`/`checked_sub`, for consumers that keep running totals or
//! apply request policies: saturating sums, remainders and rounding up to a step.
//!
//! All of it is exact on the nano count; the printed format follows the same rule as
//! [`Quantity::checked_add`] unless a method says otherwise.

use super::{Quantity, QuantityError};

impl Quantity {
    /// `self + other`, clamped to the representable range instead of failing. The format
    /// follows [`checked_add`](Self::checked_add).
    ///
    /// For running totals of already-parsed amounts (what earlier allocations consume), where
    /// a clamp at about 1.7e29 can never change a comparison with a real capacity.
    pub fn saturating_add(&self, other: &Quantity) -> Quantity {
        self.saturating(other, self.nanos.saturating_add(other.nanos))
    }

    /// `self - other`, clamped to the representable range instead of failing. The format
    /// follows [`checked_add`](Self::checked_add).
    pub fn saturating_sub(&self, other: &Quantity) -> Quantity {
        self.saturating(other, self.nanos.saturating_sub(other.nanos))
    }

    fn saturating(&self, other: &Quantity, nanos: i128) -> Quantity {
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        Quantity { nanos, format }
    }

    /// The remainder of dividing `self` by `divisor` exactly, with the sign of `self` (as
    /// Rust's `%`), in `self`'s format. `2.5Gi` by `1Gi` is `512Mi`.
    ///
    /// `None` when `divisor` is zero (or in the single overflowing case of the most negative
    /// value divided by minus one nano).
    pub fn remainder(&self, divisor: &Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_rem(divisor.nanos)?;
        Some(Quantity {
            nanos,
            format: self.format,
        })
    }

    /// The smallest `base + n × step` (n ≥ 0) that is at least `self`: how Kubernetes rounds
    /// a requested capacity up to a request policy's `validRange` (`base` is its `min`).
    ///
    /// Returns `base` itself when `self` is at most `base`; otherwise the rounded value in
    /// `self`'s format, as Kubernetes keeps the request's format. Exact for any values, also
    /// fractional ones.
    ///
    /// # Errors
    /// [`QuantityError::NonPositiveStep`] when `step` is zero or negative,
    /// [`QuantityError::ArithmeticOverflow`] when the result leaves the supported range.
    pub fn round_up_to_step(
        &self,
        base: &Quantity,
        step: &Quantity,
    ) -> Result<Quantity, QuantityError> {
        if step.nanos <= 0 {
            return Err(QuantityError::NonPositiveStep {
                step: step.to_string(),
            });
        }
        if self.nanos <= base.nanos {
            return Ok(*base);
        }
        let overflow = || QuantityError::ArithmeticOverflow {
            op: "rounded up to a step of",
            lhs: self.to_string(),
            rhs: step.to_string(),
        };
        // self > base, so the difference is positive; it only fails to fit when the two
        // are at opposite ends of the range.
        let over = self.nanos.checked_sub(base.nanos).ok_or_else(overflow)?;
        let steps = over / step.nanos + i128::from(over % step.nanos != 0);
        let nanos = steps
            .checked_mul(step.nanos)
            .and_then(|span| base.nanos.checked_add(span))
            .ok_or_else(overflow)?;
        Ok(Quantity {
            nanos,
            format: self.format,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::QuantityFormat;
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn rounding_up_follows_the_step_from_the_base() {
        let cases = [
            ("5Gi", "1Gi", "2Gi", "5Gi"),
            ("6Gi", "1Gi", "2Gi", "7Gi"),
            ("0", "1Gi", "2Gi", "1Gi"),
            ("1Gi", "1Gi", "2Gi", "1Gi"),
            ("1.5", "0", "500m", "1500m"),
            ("1.6", "0", "500m", "2"),
            ("10241Mi", "0", "10Gi", "20Gi"),
        ];
        for (value, base, step, want) in cases {
            let got = q(value).round_up_to_step(&q(base), &q(step));
            assert_eq!(Ok(want.to_owned()), got.map(|g| g.to_string()), "{value}");
        }
    }

    #[test]
    fn rounded_values_keep_the_requests_format_and_the_base_keeps_its_own() {
        let rounded = q("3e9")
            .round_up_to_step(&q("1Gi"), &q("1Gi"))
            .expect("fits");
        assert_eq!(
            (q("3Gi"), QuantityFormat::DecimalExponent),
            (rounded, rounded.format())
        );
        let base = q("1").round_up_to_step(&q("1Gi"), &q("1Gi")).expect("fits");
        assert_eq!("1Gi", base.to_string());
    }

    #[test]
    fn rounding_to_a_zero_or_negative_step_is_an_error() {
        for step in ["0", "-1Gi"] {
            let got = q("5Gi").round_up_to_step(&q("1Gi"), &q(step));
            let want = Err(QuantityError::NonPositiveStep {
                step: q(step).to_string(),
            });
            assert_eq!(want, got, "{step}");
        }
        let err = q("5Gi")
            .round_up_to_step(&q("1Gi"), &q("0"))
            .expect_err("zero step");
        assert_eq!("a step must be above zero", err.problem());
    }

    #[test]
    fn rounding_past_the_range_is_an_error_not_a_clamp() {
        // The distance from the base does not fit, then the rounded value does not.
        let cases = [("1e29", "-1e29", "1"), ("150e27", "0", "1e29")];
        for (value, base, step) in cases {
            let got = q(value).round_up_to_step(&q(base), &q(step));
            assert!(
                matches!(got, Err(QuantityError::ArithmeticOverflow { .. })),
                "{value} from {base} by {step}: {got:?}"
            );
        }
    }

    #[test]
    fn remainders_are_exact_and_none_for_a_zero_divisor() {
        let cases = [
            ("2.5Gi", "1Gi", Some("512Mi")),
            ("4Gi", "2Gi", Some("0")),
            ("1.5", "400m", Some("300m")),
            ("-1.5", "1", Some("-500m")),
            ("1Gi", "0", None),
        ];
        for (value, divisor, want) in cases {
            let got = q(value).remainder(&q(divisor)).map(|r| r.to_string());
            assert_eq!(want.map(str::to_owned), got, "{value} % {divisor}");
        }
    }

    #[test]
    fn saturating_sums_clamp_at_the_ends_of_the_range() {
        let big = q("1e28");
        let mut sum = Quantity::ZERO;
        for _ in 0..100 {
            sum = sum.saturating_add(&big);
        }
        assert_eq!(i128::MAX, sum.as_nanos());
        let mut low = Quantity::ZERO;
        for _ in 0..100 {
            low = low.saturating_sub(&big);
        }
        assert_eq!(i128::MIN, low.as_nanos());
        assert_eq!(q("1536Mi"), q("1Gi").saturating_add(&q("512Mi")));
    }

    #[test]
    fn saturating_sums_keep_the_receivers_format_unless_it_is_zero() {
        let got = q("1Gi").saturating_sub(&q("1000"));
        assert_eq!("1073740824", got.to_string());
        assert_eq!(QuantityFormat::BinarySi, got.format());
        let got = Quantity::ZERO.saturating_add(&q("80Gi"));
        assert_eq!("80Gi", got.to_string());
    }
}
