//! The one error type of the CEL layer.

use std::fmt;
use std::path::PathBuf;

use crate::quantity::QuantityError;

/// Where in an expression something went wrong: 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// ` at L:C` when the position is known, nothing otherwise.
struct At(Option<Position>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(position) => write!(f, " at {position}"),
            None => Ok(()),
        }
    }
}

/// Why a selector could not be compiled or evaluated, or a device not be read.
///
/// The `Display` form is complete for the expression errors (the CLI prints it after
/// `error: `); the device-reading variants carry their cause in `source`, to be printed as a
/// chain.
#[derive(Debug, thiserror::Error)]
pub enum CelError {
    /// The CEL environment could not be built: a bug in this crate, not in the input.
    #[error("building the CEL environment failed")]
    Environment {
        #[source]
        source: cel::DeclarationError,
    },

    /// Compiling: the expression is longer than Kubernetes allows for a selector.
    #[error("invalid CEL expression {start:?}…: it is {length} bytes long, the limit is {limit}")]
    TooLong {
        start: String,
        length: usize,
        limit: usize,
    },

    /// Compiling: the expression does not parse. `message` holds the parser's report,
    /// with the offending line and a caret under the position.
    #[error("invalid CEL expression {expression:?}: {message}")]
    Syntax {
        expression: String,
        message: String,
        position: Option<Position>,
    },

    /// Compiling: the expression nests too deeply to be parsed or evaluated safely.
    #[error("invalid CEL expression {expression:?}: too complex: {reason}")]
    TooComplex { expression: String, reason: String },

    /// Compiling: the thread the parser runs on could not be started.
    #[error("compiling CEL expression {expression:?}: could not start the parser thread")]
    ParserThread {
        expression: String,
        #[source]
        source: std::io::Error,
    },

    /// Compiling: the expression is a constant of another type than bool.
    #[error(
        "invalid CEL expression {expression:?}: must evaluate to bool or the unknown type, not {found}"
    )]
    NotBoolean { expression: String, found: String },

    /// Compiling: the worst-case cost, estimated from the expression and the largest device
    /// Kubernetes allows, is above the limit.
    #[error(
        "invalid CEL expression {expression:?}: estimated cost {estimated} exceeds the cost limit of {limit}; simplify the expression or iterate over fewer elements"
    )]
    CostEstimate {
        expression: String,
        estimated: u64,
        limit: u64,
    },

    /// Evaluating: a runtime error (missing key, wrong types, failing function…).
    #[error("evaluating CEL expression {expression:?}{}: {message}", At(*.position))]
    Evaluation {
        expression: String,
        message: String,
        position: Option<Position>,
    },

    /// Evaluating: the expression spent more than its cost budget and was stopped.
    #[error(
        "evaluating CEL expression {expression:?}: operation cancelled: actual cost limit exceeded (limit {limit})"
    )]
    CostLimit { expression: String, limit: u64 },

    /// Evaluating: the result is not a bool.
    #[error("evaluating CEL expression {expression:?}: must evaluate to bool, not {found}")]
    NotBool { expression: String, found: String },

    /// Building a device view: an attribute is not one of the supported kinds.
    #[error("device {device:?}: attribute {attribute:?}: {reason}")]
    Attribute {
        device: String,
        attribute: String,
        reason: String,
    },

    /// Building a device view: a version attribute is not a semantic version.
    #[error(
        "device {device:?}: attribute {attribute:?}: {value:?} is not a semantic version (semver.org 2.0.0, e.g. 1.2.3)"
    )]
    Version {
        device: String,
        attribute: String,
        value: String,
        #[source]
        source: semver::Error,
    },

    /// Building a device view: a capacity is not a valid quantity.
    #[error("device {device:?}: capacity {capacity:?} is invalid")]
    Capacity {
        device: String,
        capacity: String,
        #[source]
        source: QuantityError,
    },

    /// Reading the device file of `gpu-dra cel`.
    #[error("reading device file {path}")]
    ReadDevice {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Decoding the device file of `gpu-dra cel`.
    #[error(
        "decoding device file {path} as a resource.k8s.io/v1 Device (name, attributes, capacity, allowMultipleAllocations)"
    )]
    DecodeDevice {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
}
