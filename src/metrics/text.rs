//! The Prometheus text exposition format (version 0.0.4), written by hand: a family is a
//! name, a help text, a type and its samples; [`render`] sorts and escapes.

use std::fmt::Write as _;

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metric types this driver exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One line of a family: `<name><suffix>{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Appended to the family name (`_bucket`, `_sum`, `_count`, or empty).
    pub suffix: &'static str,
    /// Label pairs in the order they are written.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// A sample without suffix.
    pub fn new(labels: Vec<(&'static str, String)>, value: f64) -> Sample {
        Sample {
            suffix: "",
            labels,
            value,
        }
    }
}

/// A metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Metric name.
    pub name: &'static str,
    /// One-line description.
    pub help: &'static str,
    /// Type.
    pub kind: Kind,
    /// Samples, in the order they are written (a histogram's order matters: buckets by
    /// ascending bound, then `_sum`, then `_count`, per label set).
    pub samples: Vec<Sample>,
}

/// A gauge family with one unlabelled sample.
pub(super) fn gauge(name: &'static str, help: &'static str, value: f64) -> Family {
    Family {
        name,
        help,
        kind: Kind::Gauge,
        samples: vec![Sample::new(vec![], value)],
    }
}

/// Writes `families` sorted by name, each with its `# HELP` and `# TYPE` lines; a family
/// without samples still gets both lines so scrapers learn it exists.
pub fn render(families: &[Family]) -> String {
    let mut sorted: Vec<&Family> = families.iter().collect();
    sorted.sort_by_key(|f| f.name);
    let mut out = String::new();
    for family in sorted {
        let _ = writeln!(out, "# HELP {} {}", family.name, escape_help(family.help));
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.as_str());
        for sample in &family.samples {
            out.push_str(family.name);
            out.push_str(sample.suffix);
            if !sample.labels.is_empty() {
                out.push('{');
                for (i, (key, value)) in sample.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{key}=\"{}\"", escape_label(value));
                }
                out.push('}');
            }
            out.push(' ');
            out.push_str(&format_value(sample.value));
            out.push('\n');
        }
    }
    out
}

/// A float as Prometheus reads it: `+Inf`, `-Inf`, `NaN`, or the shortest decimal that
/// round-trips (whole numbers without a fraction).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v == f64::INFINITY {
        "+Inf".to_string()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and line feed.
pub fn escape_label(value: &str) -> String {
    escape(value, true)
}

/// Help texts escape backslash and line feed only.
pub fn escape_help(help: &str) -> String {
    escape(help, false)
}

fn escape(text: &str, quote: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_sorted_by_name_with_help_and_type_lines() {
        let families = [
            Family {
                name: "zeta_total",
                help: "Last.",
                kind: Kind::Counter,
                samples: vec![Sample::new(vec![("result", "ok".into())], 3.0)],
            },
            Family {
                name: "alpha",
                help: "First.",
                kind: Kind::Gauge,
                samples: vec![Sample::new(vec![], 0.5)],
            },
            Family {
                name: "empty",
                help: "Nothing yet.",
                kind: Kind::Counter,
                samples: vec![],
            },
        ];
        let want = "\
# HELP alpha First.
# TYPE alpha gauge
alpha 0.5
# HELP empty Nothing yet.
# TYPE empty counter
# HELP zeta_total Last.
# TYPE zeta_total counter
zeta_total{result=\"ok\"} 3
";
        assert_eq!(want, render(&families));
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        let families = [Family {
            name: "m",
            help: "A \\ help\nwith \"quotes\".",
            kind: Kind::Gauge,
            samples: vec![Sample::new(
                vec![("a", "x\\y\"z\nw".into()), ("b", "plain".into())],
                1.0,
            )],
        }];
        let want = "\
# HELP m A \\\\ help\\nwith \"quotes\".
# TYPE m gauge
m{a=\"x\\\\y\\\"z\\nw\",b=\"plain\"} 1
";
        assert_eq!(want, render(&families));
    }

    #[test]
    fn special_values_are_written_as_prometheus_reads_them() {
        let got: Vec<String> = [
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            2.0,
            0.0025,
            1e-9,
        ]
        .into_iter()
        .map(format_value)
        .collect();
        let want = ["+Inf", "-Inf", "NaN", "2", "0.0025", "0.000000001"];
        assert_eq!(want.to_vec(), got);
    }
}
