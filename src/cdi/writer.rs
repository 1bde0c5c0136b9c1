//! Puts claim specs into the runtime's CDI directory and takes them out again.

use std::fs;
use std::io;
use std::path::PathBuf;

use super::builder::device_ids;
use super::input::ClaimDevice;
use super::naming::{ClaimNaming, NameError};
use super::spec::Spec;
use super::validate::{SpecError, validate_spec};
use crate::fsutil::{self, FsError};

/// Spec files must be readable by the container runtime, which may not run as our user.
const SPEC_MODE: u32 = 0o644;

/// A claim spec could not be written, removed or listed.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// The claim UID cannot name a spec file.
    #[error("claim UID cannot name a CDI spec file")]
    ClaimUid {
        #[source]
        source: NameError,
    },
    /// The spec is not of this writer's kind, so the runtime would not find its devices
    /// under the IDs we return.
    #[error("spec for claim {claim_uid} has kind {found:?}, expected {expected:?}")]
    WrongKind {
        claim_uid: String,
        found: String,
        expected: String,
    },
    /// The spec would be rejected by the runtime.
    #[error("refusing to write invalid CDI spec for claim {claim_uid}")]
    Invalid {
        claim_uid: String,
        #[source]
        source: SpecError,
    },
    /// Serializing the spec failed.
    #[error("encoding CDI spec for claim {claim_uid}")]
    Encode {
        claim_uid: String,
        #[source]
        source: serde_json::Error,
    },
    /// The file operation failed.
    #[error("{step} CDI spec for claim {claim_uid}")]
    File {
        step: &'static str,
        claim_uid: String,
        #[source]
        source: FsError,
    },
    /// The CDI directory could not be listed.
    #[error("listing CDI directory {dir}")]
    List {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Owns this driver's claim spec files in one CDI directory (e.g. `/var/run/cdi`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiWriter {
    cdi_root: PathBuf,
    naming: ClaimNaming,
}

impl CdiWriter {
    /// A writer for `cdi_root` with the default (`gpu.nvidia.com`) naming.
    pub fn new(cdi_root: impl Into<PathBuf>) -> Self {
        Self::with_naming(cdi_root, ClaimNaming::default())
    }

    /// A writer for `cdi_root` with the naming of a custom driver name.
    pub fn with_naming(cdi_root: impl Into<PathBuf>, naming: ClaimNaming) -> Self {
        CdiWriter {
            cdi_root: cdi_root.into(),
            naming,
        }
    }

    /// The naming this writer uses for kinds, devices and files.
    pub fn naming(&self) -> &ClaimNaming {
        &self.naming
    }

    /// Where the claim's spec lives.
    ///
    /// # Errors
    /// [`WriterError::ClaimUid`] when the UID cannot be part of a file name.
    pub fn spec_path(&self, claim_uid: &str) -> Result<PathBuf, WriterError> {
        let name = self
            .naming
            .spec_file_name(claim_uid)
            .map_err(|source| WriterError::ClaimUid { source })?;
        Ok(self.cdi_root.join(name))
    }

    /// Validates `spec` and replaces the claim's spec file atomically (mode 0644), creating
    /// the CDI directory if needed. A runtime watching the directory sees either the old
    /// file or the whole new one, even if the plugin is killed. Not fsynced: a spec is only
    /// good until the next boot, and start-up recovery removes specs of claims the
    /// checkpoint does not hold (see `docs/architecture.md`, "Durability"). Returns the
    /// file's path.
    ///
    /// # Errors
    /// [`WriterError`]: bad UID, wrong kind, invalid spec, or the file step that failed.
    pub fn write_claim_spec(&self, claim_uid: &str, spec: &Spec) -> Result<PathBuf, WriterError> {
        let path = self.spec_path(claim_uid)?;
        let expected = self.naming.kind();
        if spec.kind != expected {
            return Err(WriterError::WrongKind {
                claim_uid: claim_uid.to_string(),
                found: spec.kind.clone(),
                expected,
            });
        }
        validate_spec(spec).map_err(|source| WriterError::Invalid {
            claim_uid: claim_uid.to_string(),
            source,
        })?;
        let mut bytes = serde_json::to_vec_pretty(spec).map_err(|source| WriterError::Encode {
            claim_uid: claim_uid.to_string(),
            source,
        })?;
        bytes.push(b'\n');
        crate::cost::count(crate::cost::Cost::CdiSpecWrite);
        fsutil::replace_atomic(&path, &bytes, SPEC_MODE).map_err(|source| WriterError::File {
            step: "writing",
            claim_uid: claim_uid.to_string(),
            source,
        })?;
        Ok(path)
    }

    /// Removes the claim's spec; succeeds if it is already gone. Also removes a `.yaml`
    /// spec of the same claim left by NVIDIA's Go driver, whose devices would otherwise
    /// clash with ours. Returns whether any file was removed.
    ///
    /// It does not list the directory: temp files of writes a crash interrupted are swept
    /// once, by start-up recovery ([`CdiWriter::remove_interrupted_writes`]), so an unprepare
    /// costs two `unlink`s however many specs the directory holds.
    ///
    /// # Errors
    /// [`WriterError::ClaimUid`] for a bad UID, [`WriterError::File`] when removal fails.
    pub fn remove_claim_spec(&self, claim_uid: &str) -> Result<bool, WriterError> {
        let json = self.spec_path(claim_uid)?;
        let yaml = json.with_extension("yaml");
        let failed = |step| {
            move |source| WriterError::File {
                step,
                claim_uid: claim_uid.to_string(),
                source,
            }
        };
        let mut removed = false;
        for path in [&json, &yaml] {
            removed |= fsutil::remove_if_exists(path).map_err(failed("removing"))?;
        }
        Ok(removed)
    }

    /// Removes the temp files of claim spec writes that a crash interrupted (`.<spec
    /// file>.tmp-<pid>-<n>`), of every claim, in one listing of the directory; returns them,
    /// sorted. Call it only while no write of ours is under way (start-up recovery, under the
    /// plugin lock), or that write's temp file goes too. A missing directory holds none.
    ///
    /// # Errors
    /// [`WriterError::List`] when the directory cannot be read, [`WriterError::File`] when a
    /// leftover cannot be removed.
    pub fn remove_interrupted_writes(&self) -> Result<Vec<PathBuf>, WriterError> {
        let mut removed = Vec::new();
        for (name, path) in self.entries()? {
            let Some(uid) = name
                .to_str()
                .and_then(|n| n.strip_prefix('.'))
                .and_then(|n| n.rsplit_once(".tmp-"))
                .and_then(|(spec, _)| self.naming.claim_uid_of_file(spec))
            else {
                continue;
            };
            let gone = fsutil::remove_if_exists(&path).map_err(|source| WriterError::File {
                step: "removing an interrupted write of",
                claim_uid: uid,
                source,
            })?;
            if gone {
                removed.push(path);
            }
        }
        removed.sort();
        Ok(removed)
    }

    /// UIDs of the claims that have a spec file of ours in the directory, sorted and
    /// without duplicates. Used after a crash to find specs of claims no longer prepared.
    /// A missing directory lists nothing.
    ///
    /// # Errors
    /// [`WriterError::List`] when the directory cannot be read.
    pub fn list_claim_specs(&self) -> Result<Vec<String>, WriterError> {
        let mut uids = Vec::new();
        for (name, _) in self.entries()? {
            if let Some(uid) = name
                .to_str()
                .and_then(|name| self.naming.claim_uid_of_file(name))
            {
                uids.push(uid);
            }
        }
        uids.sort();
        uids.dedup();
        Ok(uids)
    }

    /// The names and paths of everything in the CDI directory (one listing, counted as a
    /// [`crate::cost::Cost::DirectoryList`]); a missing directory holds nothing.
    fn entries(&self) -> Result<Vec<(std::ffi::OsString, PathBuf)>, WriterError> {
        let list_err = |source| WriterError::List {
            dir: self.cdi_root.clone(),
            source,
        };
        crate::cost::count(crate::cost::Cost::DirectoryList);
        let entries = match fs::read_dir(&self.cdi_root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e)),
        };
        entries
            .map(|entry| {
                let entry = entry.map_err(list_err)?;
                Ok((entry.file_name(), entry.path()))
            })
            .collect()
    }

    /// The CDI device IDs to return to the kubelet for the claim's devices, in order.
    ///
    /// # Errors
    /// [`NameError`] when a name breaks the CDI grammar.
    pub fn device_ids(
        &self,
        claim_uid: &str,
        devices: &[ClaimDevice],
    ) -> Result<Vec<String>, NameError> {
        device_ids(&self.naming, claim_uid, devices)
    }
}
