//! A short, stable name per kind of claim failure: the `kind` label of
//! `gpu_dra_errors_total`, so dashboards can tell a busy device from a broken GPU.

use super::ClaimError;

impl ClaimError {
    /// The failure's kind in snake case. Stable across releases (metric label values);
    /// a new variant must pick its own name here (the match has no wildcard on purpose).
    pub fn kind(&self) -> &'static str {
        match self {
            ClaimError::Fetch { .. } => "fetch",
            ClaimError::NoDevices { .. } => "no_devices",
            ClaimError::WrongPool { .. } => "wrong_pool",
            ClaimError::UnknownDevice { .. } => "unknown_device",
            ClaimError::DeviceBusy { .. } => "busy",
            ClaimError::Hardware { .. } => "hardware",
            ClaimError::NeedsReset { .. } => "needs_reset",
            ClaimError::NotPassable { .. } => "not_passable",
            ClaimError::Vgpu { .. } => "vgpu",
            ClaimError::Passthrough { .. } => "passthrough",
            ClaimError::Cdi { .. } => "cdi",
            ClaimError::Checkpoint { .. } => "checkpoint",
            ClaimError::Inventory { .. } => "inventory",
            ClaimError::Config { .. } => "config",
            ClaimError::Sharing { .. } => "sharing",
            ClaimError::Fabric { source, .. } => source.kind(),
            ClaimError::Batch { kind, .. } => kind,
            ClaimError::Undo { .. } => "undo",
            ClaimError::RollbackIncomplete { cause, .. } => cause.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_are_snake_case_label_values() {
        let claim = || "ns/c (u)".to_string();
        let got: Vec<&str> = [
            ClaimError::Fetch {
                claim: claim(),
                detail: "not found".into(),
            },
            ClaimError::DeviceBusy {
                claim: claim(),
                device: "gpu-0".into(),
                holder: "other".into(),
                held: "gpu-0".into(),
            },
            ClaimError::NeedsReset {
                claim: claim(),
                device: "gpu-0".into(),
                gpu: 0,
                wanted: "on",
            },
        ]
        .iter()
        .map(ClaimError::kind)
        .collect();
        assert_eq!(vec!["fetch", "busy", "needs_reset"], got);
    }
}
