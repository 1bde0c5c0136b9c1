//! Tables taken from Kubernetes' own quantity examples (values and canonical forms).

use super::*;

fn q(s: &str) -> Quantity {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

/// `mantissa × 10^exponent` in nanos.
fn nanos(mantissa: i128, exponent: i32) -> i128 {
    let e = exponent + 9;
    if e >= 0 {
        mantissa * 10i128.pow(e as u32)
    } else {
        mantissa / 10i128.pow((-e) as u32)
    }
}

#[test]
fn kubernetes_parse_examples_have_the_same_value_and_format() {
    use QuantityFormat::*;
    let table: &[(&str, i128, QuantityFormat)] = &[
        ("0", 0, DecimalSi),
        ("0n", 0, DecimalSi),
        ("0Ki", 0, BinarySi),
        ("0Ti", 0, BinarySi),
        ("1", nanos(1, 0), DecimalSi),
        ("1Ki", nanos(1024, 0), BinarySi),
        ("7Mi", nanos(7 * 1024 * 1024, 0), BinarySi),
        ("3Ei", nanos(3 << 60, 0), BinarySi),
        ("100Ti", nanos(100 << 40, 0), BinarySi),
        ("5n", nanos(5, -9), DecimalSi),
        ("4u", nanos(4, -6), DecimalSi),
        ("3m", nanos(3, -3), DecimalSi),
        ("50k", nanos(5, 4), DecimalSi),
        ("300T", nanos(3, 14), DecimalSi),
        ("1E", nanos(1, 18), DecimalSi),
        ("1E-3", nanos(1, -3), DecimalExponent),
        ("1e3", nanos(1, 3), DecimalExponent),
        ("1E18", nanos(1, 18), DecimalExponent),
        ("100.035k", nanos(100035, 0), DecimalSi),
        ("0.0005k", nanos(5, -1), DecimalSi),
        ("0.00050k", nanos(5, -1), DecimalSi),
        ("0.5e-2", nanos(5, -3), DecimalExponent),
        ("1.3E+6", nanos(13, 5), DecimalExponent),
        ("1.53E12", nanos(153, 10), DecimalExponent),
        ("6.987654321G", nanos(6987654321, 0), DecimalSi),
        ("1.01E", nanos(101, 16), DecimalSi),
        ("3.001n", nanos(4, -9), DecimalSi),
        ("1.1E-9", nanos(2, -9), DecimalExponent),
        ("0.0000000001", nanos(1, -9), DecimalSi),
        ("0.5e-9", nanos(1, -9), DecimalExponent),
        ("0.00000012345", nanos(124, -9), DecimalSi),
        ("9Ei", nanos(i64::MAX as i128, 0), BinarySi),
        (
            "9223372036854775807Ki",
            nanos(i64::MAX as i128, 0),
            BinarySi,
        ),
        ("12E", nanos(12, 18), DecimalSi),
        ("100.035Ki", nanos(10243584, -2), BinarySi),
        ("0.5Mi", nanos(512 * 1024, 0), BinarySi),
        ("0.025Ti", nanos(274877906944, -1), BinarySi),
        ("0.000000000001Ki", nanos(2, -9), DecimalSi),
        (".001", nanos(1, -3), DecimalSi),
        (".0001k", nanos(100, -3), DecimalSi),
        ("1.", nanos(1, 0), DecimalSi),
        ("1.G", nanos(1, 9), DecimalSi),
        (".", 0, DecimalSi),
    ];
    for (input, want_nanos, want_format) in table {
        let got = q(input);
        assert_eq!(
            (got.as_nanos(), got.format()),
            (*want_nanos, *want_format),
            "{input}"
        );
        let negated = q(&format!("-{input}"));
        assert_eq!(negated.as_nanos(), -want_nanos, "-{input}");
        assert_eq!(q(&format!("+{input}")).as_nanos(), *want_nanos, "+{input}");
    }
    for sign_only in ["-", "+", "-.", "+000"] {
        assert_eq!(
            q(sign_only),
            Quantity::ZERO,
            "{sign_only:?} reads as zero, as in Kubernetes"
        );
    }
}

#[test]
fn kubernetes_invalid_examples_are_rejected_naming_the_value() {
    for input in [
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        "1e4294967297",
        " 1",
        "1 ",
        "200K",
        "10Mo",
        "10Mm",
        "5G1",
        "1e",
        "1Ki3",
        "½",
    ] {
        let err = input.parse::<Quantity>().expect_err(input);
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("{input:?} is not a quantity")),
            "{message}"
        );
        assert!(
            message.contains("Ki, Mi, Gi"),
            "lists the suffixes: {message}"
        );
    }
}

#[test]
fn parse_errors_say_what_was_wrong() {
    let cases = [
        ("", QuantityError::Empty),
        (
            "5G1",
            QuantityError::UnknownSuffix {
                value: "5G1".into(),
                suffix: "G1".into(),
            },
        ),
        (
            "10Mo",
            QuantityError::Malformed {
                value: "10Mo".into(),
            },
        ),
    ];
    for (input, want) in cases {
        assert_eq!(input.parse::<Quantity>(), Err(want), "{input:?}");
    }
    assert!(
        "5G1"
            .parse::<Quantity>()
            .unwrap_err()
            .to_string()
            .starts_with(r#""5G1" is not a quantity: unknown suffix "G1""#)
    );
}

#[test]
fn values_beyond_the_supported_range_are_an_error_not_a_clamp() {
    let got = "9999999999999999999999999999999999999G".parse::<Quantity>();
    assert_eq!(
        got,
        Err(QuantityError::OutOfRange {
            value: "9999999999999999999999999999999999999G".into()
        })
    );
    assert!("1e30".parse::<Quantity>().is_err());
    assert_eq!(q("1e28").as_nanos(), 10i128.pow(37));
}

#[test]
fn tiny_values_round_up_to_one_nano() {
    assert_eq!(q("1e-100").as_nanos(), 1);
    assert_eq!(q("-1e-2147483647").as_nanos(), -1);
    assert_eq!(q(&format!("0.{}1", "0".repeat(5000))).as_nanos(), 1);
    assert_eq!(
        q(&format!("1.{}1", "0".repeat(60))).as_nanos(),
        1_000_000_001
    );
}

#[test]
fn kubernetes_canonical_forms_are_printed() {
    let table = [
        ("1Ki", "1Ki"),
        ("1024Mi", "1Gi"),
        ("1000Mi", "1000Mi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        ("1.5Gi", "1536Mi"),
        ("1.5", "1500m"),
        ("1024Mi", "1Gi"),
        ("307200Ki", "300Mi"),
        ("1025024Mi", "1001Gi"),
        ("5000m", "5"),
        ("0.5", "500m"),
        ("0.001T", "1G"),
        ("1000u", "1m"),
        ("1.08", "1080m"),
        ("1080000000n", "1080m"),
        (".001e12", "1e9"),
        ("0.001e0", "1e-3"),
        ("1000e-12", "1e-9"),
        ("80e-3", "80e-3"),
        ("300e6", "300e6"),
        ("00", "0"),
        ("1000E", "1e21"),
        ("5000E", "5e21"),
        ("1000000E", "1e24"),
        ("9Ei", "9223372036854775807"),
        ("1025", "1025"),
        ("0.3Ki", "307200m"),
        ("1.1Ki", "1126400m"),
        ("9984Mi", "9984Mi"),
        ("16", "16"),
        ("80Gi", "80Gi"),
    ];
    for (input, want) in table {
        assert_eq!(q(input).to_string(), want, "{input}");
        if q(input).sign() != 0 {
            assert_eq!(
                q(&format!("-{input}")).to_string(),
                format!("-{want}"),
                "-{input}"
            );
        }
        assert_eq!(q(want), q(input), "{want} parses back to the same value");
    }
}

#[test]
fn binary_values_past_ei_print_as_exact_decimals() {
    let ei = q("1Ei");
    let mut sum = Quantity::ZERO.with_format(QuantityFormat::BinarySi);
    for _ in 0..1024 {
        sum = sum.checked_add(&ei).expect("fits");
    }
    assert_eq!(sum.to_string(), "1180591620717411303424");
}

#[test]
fn comparisons_go_by_exact_value() {
    let table = [
        ("0", "0", Ordering::Equal),
        ("100m", "50m", Ordering::Greater),
        ("50m", "100m", Ordering::Less),
        ("10000T", "100Gi", Ordering::Greater),
        ("200M", "0.2G", Ordering::Equal),
        ("50M", "50Mi", Ordering::Less),
        ("1Gi", "1073741824", Ordering::Equal),
        ("-1", "1n", Ordering::Less),
    ];
    for (a, b, want) in table {
        assert_eq!(q(a).cmp(&q(b)), want, "{a} vs {b}");
    }
    assert_eq!(q("1k"), q("1000"));
}

#[test]
fn arithmetic_is_exact_and_keeps_the_receivers_format() {
    let sum = q("50k").checked_add(&q("20")).expect("fits");
    assert_eq!(sum, q("50.02k"));
    assert_eq!(sum.format(), QuantityFormat::DecimalSi);
    assert_eq!(q("50k").checked_sub(&q("20")).expect("fits"), q("49.98k"));
    let from_zero = Quantity::ZERO.checked_add(&q("1Gi")).expect("fits");
    assert_eq!(from_zero.to_string(), "1Gi");
    assert_eq!(
        q("100m")
            .checked_add(&Quantity::ZERO)
            .expect("fits")
            .to_string(),
        "100m"
    );
    let max = Quantity {
        nanos: i128::MAX,
        format: QuantityFormat::DecimalSi,
    };
    assert!(matches!(
        max.checked_add(&q("1n")),
        Err(QuantityError::ArithmeticOverflow { op: "+", .. })
    ));
}

#[test]
fn integer_conversions_fail_on_fractions_and_overflow() {
    assert_eq!(q("50k").as_i64(), Ok(50_000));
    assert_eq!(q("1000m").as_i64(), Ok(1));
    assert!(q("50").is_integer());
    assert_eq!(
        q("1500m").as_i64(),
        Err(QuantityError::NotAnInteger {
            value: "1500m".into()
        })
    );
    assert_eq!(
        q("1e19").as_i64(),
        Err(QuantityError::IntegerOverflow {
            value: "10e18".into()
        })
    );
    assert!(!q("1e19").is_integer());
    assert_eq!(q("50.703k").as_f64(), 50703.0);
    assert_eq!(q("-1.5").sign(), -1);
    assert_eq!(Quantity::from_i64(1000).to_string(), "1k");
}

#[test]
fn kubernetes_api_quantities_convert_both_ways() {
    let api = k8s_openapi::apimachinery::pkg::api::resource::Quantity("1024Mi".into());
    let got = Quantity::from_k8s(&api).expect("valid");
    assert_eq!(got.to_k8s().0, "1Gi");
}

#[test]
fn serde_reads_strings_and_numbers_and_writes_the_canonical_string() {
    let got: Vec<Quantity> = serde_json::from_str(r#"["1.5Gi", 4, 0.5]"#).expect("valid");
    assert_eq!(got, vec![q("1536Mi"), q("4"), q("500m")]);
    assert_eq!(
        serde_json::to_string(&got).expect("serializes"),
        r#"["1536Mi","4","500m"]"#
    );
    let err = serde_json::from_str::<Quantity>(r#""5G1""#).expect_err("invalid");
    assert!(
        err.to_string().contains(r#""5G1" is not a quantity"#),
        "{err}"
    );
}

#[test]
fn short_and_long_inputs_of_the_same_value_agree() {
    for input in [
        "1.5Gi",
        "3.001n",
        "0.000000000001Ki",
        "100.035k",
        "9Ei",
        "1.1E-9",
        "12E",
        "1e28",
    ] {
        let (number, suffix) = input.split_at(
            input
                .find(|c: char| c.is_ascii_alphabetic())
                .unwrap_or(input.len()),
        );
        let dot = if number.contains('.') { "" } else { "." };
        // Trailing fraction zeros push the digit count past the fast path.
        let long = format!("{number}{dot}{}{suffix}", "0".repeat(40));
        assert_eq!(
            (q(&long).as_nanos(), q(&long).format()),
            (q(input).as_nanos(), q(input).format()),
            "{long}"
        );
    }
}

#[test]
fn problems_describe_the_fault_without_repeating_the_value() {
    let cases = [
        ("", "it is empty"),
        ("lots", "it does not start with a number"),
        ("-Gx", "it does not start with a number"),
        (" 1", "it does not start with a number"),
        ("10Xi", "unknown suffix \"Xi\""),
        ("1.1.M", "unknown suffix \".M\""),
        ("5G1", "unknown suffix \"G1\""),
        ("1e30", "it is outside the supported range"),
    ];
    for (input, want) in cases {
        let got = input.parse::<Quantity>().expect_err(input).problem();
        assert!(got.starts_with(want), "{input:?}: {got}");
        assert!(!got.contains(&format!("{input:?}")), "{input:?}: {got}");
    }
    let suffix = "10Xi"
        .parse::<Quantity>()
        .expect_err("bad suffix")
        .problem();
    assert!(
        suffix.contains("Ki, Mi, Gi"),
        "lists the suffixes: {suffix}"
    );
}
