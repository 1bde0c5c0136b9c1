//! Where the binary's log lines go and what they look like.
//!
//! Logs are read by machines more often than by people: `kubectl logs`, Fluent Bit, Loki and
//! journald store the bytes as written, so colour escapes end up as `ESC[3m…` noise in every
//! line. Text logs are therefore coloured only for a person at a terminal, and only when the
//! person has not asked for no colour (<https://no-color.org>).

use std::ffi::OsStr;
use std::io::IsTerminal;

/// The environment variable that turns colour off (<https://no-color.org>).
pub const NO_COLOR_ENV: &str = "NO_COLOR";
/// A full tracing filter (`info,gpu_dra::k8s=debug`) that overrides the default level.
pub const FILTER_ENV: &str = "GPU_DRA_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One human-readable line per event; coloured only as [`use_colour`] decides.
    Text,
    /// One JSON object per line; never coloured.
    Json,
}

/// Whether text logs carry ANSI colour: only when stderr is a terminal and `NO_COLOR` is
/// unset (an empty `NO_COLOR` counts as unset, as no-color.org specifies).
///
/// Pure, so the rule is testable without a terminal: the caller passes what it observed.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the process-wide subscriber writing to stderr: `format`, filtered by
/// `GPU_DRA_LOG` when it parses, else by `default_level` (`info`, `warn`, …). Colour follows
/// [`use_colour`] for this process's stderr and environment; JSON is never coloured.
///
/// Returns whether colour is on. A second call keeps the first subscriber (nothing fails).
pub fn init(format: Format, default_level: &str) -> bool {
    let colour = format == Format::Text
        && use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os(NO_COLOR_ENV).as_deref(),
        );
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let _ = match format {
        Format::Json => builder.json().try_init(),
        Format::Text => builder.try_init(),
    };
    colour
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_needs_a_terminal_and_no_no_color() {
        let set = Some(OsStr::new("1"));
        let empty = Some(OsStr::new(""));
        let table = [
            // (stderr is a terminal, NO_COLOR, colour)
            (true, None, true),
            (true, empty, true),
            (true, set, false),
            (true, Some(OsStr::new("false")), false),
            (false, None, false),
            (false, empty, false),
            (false, set, false),
        ];
        for (terminal, no_color, want) in table {
            assert_eq!(
                use_colour(terminal, no_color),
                want,
                "terminal={terminal} NO_COLOR={no_color:?}"
            );
        }
    }
}
