//! The ledger on disk: `usage.json` next to the checkpoint, versioned and replaced atomically.
//!
//! ```json
//! {"version": "v1",
//!  "finished": [{"namespace": "a", "class": "…", "profile": "1g.10gb", "sharing": "exclusive", "deviceSeconds": 3600.0}],
//!  "live": {"<claim uid>": {"sinceUnix": 1764000000.0, "holdings": [{"namespace": "a", …, "weight": 1.0}]}}}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Labels, Ledger, Live};

/// The ledger's file name in the state directory.
pub const USAGE_FILE: &str = "usage.json";

const VERSION: &str = "v1";

/// Reading or writing the ledger failed.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The file exists but cannot be read.
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a `v1` ledger (garbage, or written by a newer plugin).
    #[error("{path} is not a usage ledger of version {VERSION}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A total or start time is not a finite, non-negative number.
    #[error("{path}: {field} is {value}; valid: a finite number of seconds, 0 or more")]
    Invalid {
        path: PathBuf,
        field: String,
        value: f64,
    },
    /// Writing failed.
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: crate::fsutil::FsError,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileV1 {
    version: String,
    finished: Vec<TotalV1>,
    live: BTreeMap<String, Live>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TotalV1 {
    #[serde(flatten)]
    labels: Labels,
    device_seconds: f64,
}

/// Reads the ledger at `path`; a missing file is an empty ledger.
///
/// Fails when the file cannot be read, is not a `v1` ledger, or holds a negative or
/// non-finite number.
pub fn load(path: &Path) -> Result<Ledger, UsageError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ledger::default()),
        Err(source) => {
            return Err(UsageError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file: FileV1 = serde_json::from_slice(&bytes).map_err(|source| UsageError::Decode {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |field: String, value: f64| UsageError::Invalid {
        path: path.to_path_buf(),
        field,
        value,
    };
    if file.version != VERSION {
        let source =
            <serde_json::Error as serde::de::Error>::custom(format!("version {:?}", file.version));
        return Err(UsageError::Decode {
            path: path.to_path_buf(),
            source,
        });
    }
    let valid = |v: f64| v.is_finite() && v >= 0.0;
    let mut ledger = Ledger::default();
    for (i, total) in file.finished.into_iter().enumerate() {
        if !valid(total.device_seconds) {
            return Err(invalid(
                format!("finished[{i}].deviceSeconds"),
                total.device_seconds,
            ));
        }
        *ledger.finished.entry(total.labels).or_default() += total.device_seconds;
    }
    for (uid, live) in &file.live {
        if !valid(live.since_unix) {
            return Err(invalid(format!("live.{uid}.sinceUnix"), live.since_unix));
        }
        for (i, h) in live.holdings.iter().enumerate() {
            if !(valid(h.weight) && h.weight <= 1.0) {
                return Err(invalid(
                    format!("live.{uid}.holdings[{i}].weight"),
                    h.weight,
                ));
            }
        }
    }
    ledger.live = file.live;
    Ok(ledger)
}

/// Writes `ledger` to `path` atomically (temp file and rename, fsynced: a totals file that
/// a power loss rolled back would under-bill every claim that ended since).
pub fn save(path: &Path, ledger: &Ledger) -> Result<(), UsageError> {
    let file = FileV1 {
        version: VERSION.to_string(),
        finished: ledger
            .finished
            .iter()
            .map(|(labels, seconds)| TotalV1 {
                labels: labels.clone(),
                device_seconds: *seconds,
            })
            .collect(),
        live: ledger.live.clone(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).unwrap_or_default();
    bytes.push(b'\n');
    crate::fsutil::write_atomic(path, &bytes, 0o600).map_err(|source| UsageError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Holding;

    #[test]
    fn a_saved_ledger_reads_back_equal_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(USAGE_FILE);
        assert_eq!(load(&path).unwrap(), Ledger::default());
        let labels = Labels {
            namespace: "a".into(),
            class: "gpu.nvidia.com".into(),
            profile: "gpu".into(),
            sharing: "exclusive".into(),
        };
        let mut ledger = Ledger::default();
        ledger.start(
            "u1",
            10.0,
            vec![Holding {
                labels: labels.clone(),
                weight: 0.5,
            }],
        );
        ledger.finished.insert(labels, 7.5);
        save(&path, &ledger).unwrap();
        assert_eq!(load(&path).unwrap(), ledger);
    }

    #[test]
    fn a_negative_total_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(USAGE_FILE);
        std::fs::write(
            &path,
            r#"{"version":"v1","finished":[{"namespace":"a","class":"c","profile":"p","sharing":"s","deviceSeconds":-1}],"live":{}}"#,
        )
        .unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "finished[0].deviceSeconds is -1; valid: a finite number of seconds, 0 or more"
            ),
            "{err}"
        );
    }
}
