//! GPU fabric (multi-node NVLink) membership, as NVML reports it through
//! `nvmlDeviceGetGpuFabricInfo` / `nvmlDeviceGetGpuFabricInfoV`.
//!
//! On rack-scale NVLink systems (GB200 NVL72: 18 nodes of 4 GPUs on one fabric) every GPU
//! belongs to a *clique*: the set of GPUs that reach each other over NVLink. Compute domains
//! ([`crate::compute_domain`]) only span nodes of one clique.

use serde::{Deserialize, Serialize};

/// `nvmlGpuFabricState_t`: how far the fabric manager got with this GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum FabricState {
    /// `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED` (0): the GPU is on no NVLink fabric.
    #[default]
    NotSupported,
    /// `NVML_GPU_FABRIC_STATE_NOT_STARTED` (1).
    NotStarted,
    /// `NVML_GPU_FABRIC_STATE_IN_PROGRESS` (2).
    InProgress,
    /// `NVML_GPU_FABRIC_STATE_COMPLETED` (3): registration finished; the clique is valid.
    Completed,
}

impl FabricState {
    /// The NVML constant.
    pub fn raw(self) -> u8 {
        match self {
            FabricState::NotSupported => 0,
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
        }
    }

    /// The state for an NVML constant; `None` for a value NVML does not define.
    pub fn from_raw(raw: u8) -> Option<FabricState> {
        match raw {
            0 => Some(FabricState::NotSupported),
            1 => Some(FabricState::NotStarted),
            2 => Some(FabricState::InProgress),
            3 => Some(FabricState::Completed),
            _ => None,
        }
    }
}

/// One GPU's fabric membership (`nvmlGpuFabricInfo_t` / `nvmlGpuFabricInfoV_t`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FabricInfo {
    /// The fabric's cluster UUID, lower-case `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    /// All zeros means the GPU is in no clique.
    pub cluster_uuid: String,
    /// The clique within the cluster.
    pub clique_id: u32,
    /// Registration state.
    pub state: FabricState,
}

/// The all-zero cluster UUID NVML reports for a GPU in no clique.
pub const ZERO_CLUSTER_UUID: &str = "00000000-0000-0000-0000-000000000000";

impl FabricInfo {
    /// The clique this GPU belongs to, as `<clusterUuid>.<cliqueId>`: `Some` only when the
    /// fabric state is COMPLETED and the cluster UUID is not all zeros.
    pub fn clique(&self) -> Option<String> {
        let zero = self.cluster_uuid.chars().all(|c| c == '0' || c == '-');
        (self.state == FabricState::Completed && !zero && !self.cluster_uuid.is_empty()).then(
            || {
                format!(
                    "{}.{}",
                    self.cluster_uuid.to_ascii_lowercase(),
                    self.clique_id
                )
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(uuid: &str, state: FabricState) -> FabricInfo {
        FabricInfo {
            cluster_uuid: uuid.into(),
            clique_id: 7,
            state,
        }
    }

    #[test]
    fn a_completed_fabric_names_its_clique_as_cluster_uuid_dot_clique_id() {
        let f = info(
            "C2A0E7D4-1111-2222-3333-444455556666",
            FabricState::Completed,
        );
        assert_eq!(
            f.clique().as_deref(),
            Some("c2a0e7d4-1111-2222-3333-444455556666.7")
        );
    }

    #[test]
    fn a_zero_cluster_uuid_or_an_unfinished_registration_is_in_no_clique() {
        assert_eq!(
            info(ZERO_CLUSTER_UUID, FabricState::Completed).clique(),
            None
        );
        let uuid = "c2a0e7d4-1111-2222-3333-444455556666";
        assert_eq!(info(uuid, FabricState::InProgress).clique(), None);
        assert_eq!(info(uuid, FabricState::NotSupported).clique(), None);
    }

    #[test]
    fn fabric_states_round_trip_through_their_nvml_constants() {
        for raw in 0..4 {
            assert_eq!(FabricState::from_raw(raw).unwrap().raw(), raw);
        }
        assert_eq!(FabricState::from_raw(4), None);
    }
}
