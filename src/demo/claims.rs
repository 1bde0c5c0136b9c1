//! Demo steps 4–6 (and the prepare/unprepare rounds of 7–8): the seed talk's claims allocated by the built-in allocator with CEL, then
//! prepared and unprepared by the real claim lifecycle on the simulated hardware.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use crate::alloc::{self, Detail, Node};
use crate::cdi::{CdiWriter, ClaimNaming};
use crate::claims::sharing::SharingSetup;
use crate::claims::{AllocatedDevice, ClaimAllocation, ClaimId, ClaimSource, ClaimsManager};
use crate::devices::ModelOptions;
use crate::hardware::GpuBackend;
use crate::hardware::sim::SimBackend;
use crate::plugin::simhost::SimHostFacts;
use crate::selectors::CelEngine;
use crate::sharing::{MpsManager, MpsOptions, Tools};

/// The example files shipped in `examples/`, in the order the demo submits them.
pub const EXAMPLES: [(&str, &str); 6] = [
    (
        "mig-profiles.yaml",
        include_str!("../../examples/mig-profiles.yaml"),
    ),
    (
        "mig-h100.yaml",
        include_str!("../../examples/mig-h100.yaml"),
    ),
    (
        "first-available.yaml",
        include_str!("../../examples/first-available.yaml"),
    ),
    (
        "dedicated-gpu.yaml",
        include_str!("../../examples/dedicated-gpu.yaml"),
    ),
    (
        "shared-gpu-two-containers.yaml",
        include_str!("../../examples/shared-gpu-two-containers.yaml"),
    ),
    (
        "shared-claim-two-pods.yaml",
        include_str!("../../examples/shared-claim-two-pods.yaml"),
    ),
];

/// Claims from the demo's table, as the API server would return them.
struct Allocated(BTreeMap<String, ClaimAllocation>);

impl ClaimSource for Allocated {
    async fn fetch(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        self.0
            .get(&id.uid)
            .cloned()
            .ok_or_else(|| format!("claim {id} is not allocated"))
    }
}

/// Allocates every example in turn (earlier claims keep their devices), prepares the ones that
/// fit, shows the CDI specs and what the hardware did, then unprepares them.
pub fn run(
    out: &mut String,
    backend: Arc<SimBackend>,
    options: &ModelOptions,
    classes: &[DeviceClass],
    slices: &[ResourceSlice],
) -> Result<(), String> {
    let _ = writeln!(
        out,
        "\n4. Allocation: the seed talk's claims, one after another (built-in allocator, CEL selectors)"
    );
    let allocated = allocate(out, &EXAMPLES, &backend, classes, slices, "demo")?;
    let steps = Steps {
        prepare: "5. Prepare: what the kubelet plugin does when the pods start (NodePrepareResources)",
        unprepare: "6. Unprepare: the pods are gone (NodeUnprepareResources)",
        show_mig_spec: true,
    };
    prepare_all(out, backend, options, &allocated, &steps)
}

/// Section titles and what to show of a prepare/unprepare round.
pub(super) struct Steps {
    pub prepare: &'static str,
    pub unprepare: &'static str,
    /// Print the first MIG claim's CDI spec in full.
    pub show_mig_spec: bool,
}

/// Allocates the claims of `examples` in turn on the node of `slices`; returns the allocated
/// claims with UIDs `<uid_prefix>-NN`.
pub(super) fn allocate(
    out: &mut String,
    examples: &[(&str, &str)],
    backend: &SimBackend,
    classes: &[DeviceClass],
    slices: &[ResourceSlice],
    uid_prefix: &str,
) -> Result<Vec<ResourceClaim>, String> {
    let node = Node::named(backend.node_name());
    let mut allocated: Vec<ResourceClaim> = Vec::new();
    for (file, text) in examples {
        let dir = tempfile_dir()?;
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        let claims =
            crate::explain::load_claims(&path).map_err(|e| crate::errors::error_chain(&e))?;
        let _ = std::fs::remove_dir_all(&dir);
        for mut claim in claims {
            let name = alloc::claim_display(&claim);
            let outcome = alloc::allocate_claim(
                &CelEngine,
                classes,
                slices,
                &allocated,
                &claim,
                &node,
                Detail::Brief,
            )
            .map_err(|e| crate::errors::error_chain(&e))?;
            match outcome.allocations.and_then(|mut a| a.pop()) {
                Some(result) => {
                    let devices: Vec<String> = result
                        .devices
                        .as_ref()
                        .map(|d| {
                            d.results
                                .iter()
                                .flatten()
                                .map(|r| match &r.share_id {
                                    Some(share) => {
                                        format!("{}={} (share {share})", r.request, r.device)
                                    }
                                    None => format!("{}={}", r.request, r.device),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "   {file:<32} {name:<40} allocated {}",
                        devices.join(", ")
                    );
                    claim.metadata.uid = Some(format!("{uid_prefix}-{:02}", allocated.len() + 1));
                    claim
                        .metadata
                        .namespace
                        .get_or_insert_with(|| "default".to_string());
                    claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
                        allocation: Some(result),
                        ..Default::default()
                    });
                    allocated.push(claim);
                }
                None => {
                    let _ = writeln!(
                        out,
                        "   {file:<32} {name:<40} pending: no free device (explain: gpu-dra explain --claim examples/{file} --sim-node {})",
                        backend.node_name()
                    );
                }
            }
        }
    }
    Ok(allocated)
}

fn tempfile_dir() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "gpu-dra-demo-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

pub(super) fn prepare_all(
    out: &mut String,
    backend: Arc<SimBackend>,
    options: &ModelOptions,
    claims: &[ResourceClaim],
    steps: &Steps,
) -> Result<(), String> {
    let work = tempfile_dir()?.join(format!("node-{}", backend.node_name()));
    let table = claims
        .iter()
        .map(|c| {
            let uid = c.metadata.uid.clone().unwrap_or_default();
            let devices = crate::alloc::allocation_results(c)
                .iter()
                .cloned()
                .map(|r| AllocatedDevice {
                    request: r.request,
                    pool: r.pool,
                    device: r.device,
                    admin_access: r.admin_access.unwrap_or(false),
                    share_id: r.share_id,
                    consumed_capacity: r
                        .consumed_capacity
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect(),
                })
                .collect();
            (
                uid,
                ClaimAllocation {
                    pod_claim_name: None,
                    devices,
                    config: allocation_config(c),
                },
            )
        })
        .collect();
    let manager = ClaimsManager {
        backend: backend.clone(),
        source: Allocated(table),
        host: Box::new(SimHostFacts),
        cdi: CdiWriter::new(work.join("cdi")),
        naming: ClaimNaming::default(),
        model_options: options.clone(),
        pool: backend.node_name().to_string(),
        state_dir: work.join("state"),
        boot_id: "demo-boot".to_string(),
        model_cache: Default::default(),
        checkpoint_cache: Default::default(),
        sharing: Some(simulated_sharing(&work)?),
        prepared: Default::default(),
        metadata: None,
        pci: None,
        fabric: None,
        vgpu: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| format!("starting the demo runtime: {e}"))?;
    let ids: Vec<ClaimId> = claims
        .iter()
        .map(|c| ClaimId {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
        })
        .collect();
    let _ = writeln!(out, "\n{}", steps.prepare);
    let mut shown_spec = false;
    for id in &ids {
        let devices = runtime
            .block_on(manager.prepare(id))
            .map_err(|e| crate::errors::error_chain(&e))?;
        for d in &devices {
            let _ = writeln!(
                out,
                "   {:<40} {:<22} → {}",
                format!("{}/{}", id.namespace, id.name),
                d.device,
                d.cdi_device_ids.join(", ")
            );
        }
        show_sharing_edits(out, &work.join("cdi"), &id.uid);
        if steps.show_mig_spec && !shown_spec && devices.iter().any(|d| d.device.contains("-mig-"))
        {
            let path = work
                .join("cdi")
                .join(format!("k8s.gpu.nvidia.com-claim_{}.json", id.uid));
            if let Ok(spec) = std::fs::read_to_string(&path) {
                let _ = writeln!(
                    out,
                    "\n   CDI spec written for {} ({}):",
                    id.name,
                    path.file_name()
                        .map(|f| f.to_string_lossy())
                        .unwrap_or_default()
                );
                for line in spec.lines() {
                    let _ = writeln!(out, "     {line}");
                }
                out.push('\n');
                shown_spec = true;
            }
        }
    }
    let carved: Vec<String> = backend
        .inventory()
        .map_err(|e| e.to_string())?
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices.iter().map(move |m| {
                format!(
                    "GPU {} {}@{} (GI {}, {})",
                    g.index, m.profile_name, m.placement.start, m.gi_id, m.uuid
                )
            })
        })
        .collect();
    let _ = writeln!(out, "   MIG devices on the (simulated) hardware now:");
    for c in &carved {
        let _ = writeln!(out, "     {c}");
    }
    show_tool_calls(out, &work.join("tools"), "while preparing");
    let tools_seen = crate::sharing::simtools::read_log(&work.join("tools")).len();
    let _ = writeln!(out, "\n{}", steps.unprepare);
    for id in &ids {
        runtime
            .block_on(manager.unprepare(id))
            .map_err(|e| crate::errors::error_chain(&e))?;
    }
    let left: usize = backend
        .inventory()
        .map_err(|e| e.to_string())?
        .gpus
        .iter()
        .map(|g| g.mig_devices.len())
        .sum();
    let specs = manager
        .cdi
        .list_claim_specs()
        .map_err(|e| e.to_string())?
        .len();
    let _ = writeln!(
        out,
        "   {} claim(s) unprepared: carved MIG devices destroyed, CDI specs removed ({specs} left); MIG devices remaining: {left} (the pre-created static ones)",
        ids.len()
    );
    let calls = crate::sharing::simtools::read_log(&work.join("tools"));
    if calls.len() > tools_seen {
        let _ = writeln!(
            out,
            "   Commands the simulated tools received while unpreparing (daemons quit, GPUs back to DEFAULT):"
        );
        for c in &calls[tools_seen..] {
            let _ = writeln!(out, "     {}", c.command_line());
        }
    }
    let _ = std::fs::remove_dir_all(work.parent().unwrap_or(&work));
    Ok(())
}

/// The opaque config entries of this driver the allocation carries (class entries first),
/// as the API server hands them to the plugin.
fn allocation_config(claim: &ResourceClaim) -> Vec<crate::claims::ConfigEntry> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| {
            let opaque = c.opaque?;
            Some(crate::claims::ConfigEntry {
                from_class: c.source == "FromClass",
                requests: c.requests.unwrap_or_default(),
                parameters: opaque.parameters.0,
            })
        })
        .collect()
}

/// Simulated `nvidia-smi` / `nvidia-cuda-mps-control` (this binary under those names) with
/// their record and the MPS daemons' directories under `work`.
fn simulated_sharing(work: &std::path::Path) -> Result<SharingSetup, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding the gpu-dra binary: {e}"))?;
    let tools =
        Tools::simulated(&exe, &work.join("tools")).map_err(|e| crate::errors::error_chain(&e))?;
    Ok(SharingSetup {
        mps: MpsManager::new(tools, work.join("mps"), MpsOptions::default()),
        mps_enabled: true,
        time_slicing_enabled: true,
    })
}

/// The MPS part of a claim's CDI spec: the env its containers get.
fn show_sharing_edits(out: &mut String, cdi_root: &std::path::Path, uid: &str) {
    let path = cdi_root.join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
    let Ok(spec) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(spec) = serde_json::from_str::<serde_json::Value>(&spec) else {
        return;
    };
    for device in spec["devices"].as_array().into_iter().flatten() {
        let edits = &device["containerEdits"];
        let env: Vec<&str> = edits["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_str())
            .filter(|e| e.starts_with("CUDA_MPS"))
            .collect();
        if env.is_empty() {
            continue;
        }
        let mounts: Vec<String> = edits["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["containerPath"].as_str().map(String::from))
            .collect();
        let _ = writeln!(
            out,
            "   {:<40} CDI edits of {}: {}; mounts {}",
            "",
            device["name"].as_str().unwrap_or(""),
            env.join(" "),
            mounts.join(", ")
        );
    }
}

fn show_tool_calls(out: &mut String, dir: &std::path::Path, when: &str) {
    let calls = crate::sharing::simtools::read_log(dir);
    if calls.is_empty() {
        return;
    }
    let _ = writeln!(out, "   Commands the simulated tools received {when}:");
    for c in &calls {
        let visible = c
            .env
            .get("CUDA_VISIBLE_DEVICES")
            .filter(|_| c.args.iter().any(|a| a == "-d"))
            .map(|v| format!("CUDA_VISIBLE_DEVICES={v} "))
            .unwrap_or_default();
        let _ = writeln!(out, "     {visible}{}", c.command_line());
    }
}
