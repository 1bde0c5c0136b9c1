//! The `fabric-manager` check (only with `--fabric-manager`): `fmpm` is found and Fabric
//! Manager answers with a non-empty, valid partition list.

use super::Check;
use crate::fabric_manager::{FabricError, PartitionTable};

/// The check's name.
pub const NAME: &str = "fabric-manager";

/// `listed`: what asking FM at `endpoint` gave (or why no `fmpm` could be run).
pub fn check(endpoint: &str, listed: &Result<PartitionTable, FabricError>) -> Check {
    match listed {
        Ok(table) => {
            let mut sizes: Vec<usize> = table
                .partitions()
                .iter()
                .map(|p| p.gpu_info.len())
                .collect();
            sizes.sort_unstable();
            sizes.dedup();
            let active: Vec<String> = table
                .partitions()
                .iter()
                .filter(|p| p.is_active)
                .map(|p| p.partition_id.to_string())
                .collect();
            Check::ok(
                NAME,
                format!(
                    "{} partitions at {endpoint} (sizes {}; active: {})",
                    table.partitions().len(),
                    sizes
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if active.is_empty() {
                        "none".to_string()
                    } else {
                        active.join(", ")
                    }
                ),
            )
        }
        Err(e @ FabricError::ToolNotFound { .. }) => Check::fail(
            NAME,
            crate::errors::error_chain(e),
            "Install fmpm (build NVIDIA/Fabric-Manager-Client; it needs nvidia-fabricmanager-dev) under the driver root, or pass --fmpm-path",
            NAME,
        ),
        Err(e @ FabricError::Unreachable { .. }) => Check::fail(
            NAME,
            crate::errors::error_chain(e),
            "Start nvidia-fabricmanager with FABRIC_MODE=1 and FM_CMD_UNIX_SOCKET_PATH (or FM_CMD_BIND_INTERFACE) matching --fabric-manager-socket / --fabric-manager-address, and mount the socket into the plugin",
            NAME,
        ),
        Err(e) => Check::fail(
            NAME,
            crate::errors::error_chain(e),
            "Check that FABRIC_MODE=1 (shared NVSwitch) is set in fabricmanager.cfg and that fmpm -l lists partitions; or turn --fabric-manager off on nodes without NVSwitch partitions",
            NAME,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn a_listed_table_passes_and_names_sizes_and_active_partitions() {
        let table = PartitionTable::new(crate::fabric_manager::partitions::hgx_8gpu_table(
            &[],
            &[3].into(),
        ))
        .unwrap();
        let c = check("unix:/run/nvidia-fabricmanager/socket", &Ok(table));
        assert_eq!(c.status, Status::Ok);
        assert!(c.found.contains("15 partitions"), "{}", c.found);
        assert!(
            c.found.contains("sizes 1, 2, 4, 8; active: 3"),
            "{}",
            c.found
        );
    }

    #[test]
    fn an_unreachable_fabric_manager_fails_with_its_fix() {
        let err = FabricError::Unreachable {
            endpoint: "unix:/x".into(),
            detail: "the socket /x does not exist".into(),
        };
        let c = check("unix:/x", &Err(err));
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("FABRIC_MODE=1"));
    }
}
