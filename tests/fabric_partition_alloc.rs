//! The docs' Fabric Manager partition claims (docs/fabric-manager.md: `count: N` with
//! `matchAttribute: gpu.nvidia.com/partitionN`) through the allocator, on the simulated
//! `hgx-h100-passthrough` node published as the chart publishes it (`--passthrough
//! --fabric-manager`, default slice layout and MIG attributes), after MIG claims on other GPUs.
//!
//! Each claim is run twice: as Kubernetes with kubernetes#140431 decides
//! ([`CounterRollback::Released`]), and as kube-scheduler 1.34 to 1.36 without it
//! ([`CounterRollback::Leaked`]), whose `allocateDevice` keeps the counters of a GPU a
//! constraint refused, so a search that started on a GPU of a busy partition can no longer
//! start one on a free partition's GPU. The node's slices are re-read after each MIG device is
//! created, as the plugin's inventory watcher republishes them; one test runs the real
//! `kubelet-plugin` binary to see it republish them.

mod alloc_fixtures;
mod plugin_support;

use std::sync::Arc;

use alloc_fixtures::{allocated, claim, device_names};
use gpu_dra::alloc::{Allocator, CounterRollback, Detail, Node, Outcome, Rejection};
use gpu_dra::devices::{self, DeviceKind, ModelOptions};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::passthrough::{PassthroughBackend, PciHost};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

const PRESET: &str = "hgx-h100-passthrough";
const BOTH: [CounterRollback; 2] = [CounterRollback::Released, CounterRollback::Leaked];

/// The simulated node, its state on disk, and the options the chart's plugin runs with.
struct FmNode {
    backend: PassthroughBackend,
    options: ModelOptions,
    _dir: tempfile::TempDir,
}

impl FmNode {
    /// The node as the chart publishes it by default: `--mig-profiles split`.
    fn split() -> FmNode {
        let mut node = FmNode::new();
        node.options.mig_profiles = devices::MigProfileSet::Split;
        node
    }

    fn new() -> FmNode {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimBackend::open(PRESET, Some(dir.path())).unwrap();
        let root = sim.host_root().unwrap().to_path_buf();
        let mut options = ModelOptions::with_policies("gpu.nvidia.com", &sim.mig_policies());
        options.passthrough = true;
        // What the plugin reads from the simulated FM at start (`fmpm -l`).
        options.fabric_partitions = Some(Arc::new(
            gpu_dra::fabric_manager::sim::partitions(&sim).unwrap(),
        ));
        let pci = Arc::new(PciHost::new(&root, Arc::new(SimKernel::new(&root))));
        FmNode {
            backend: PassthroughBackend::new(Arc::new(sim), pci),
            options,
            _dir: dir,
        }
    }

    fn model(&self) -> devices::DeviceModel {
        devices::build(&self.backend.inventory().unwrap(), &self.options)
    }

    /// The slices the plugin publishes for the node as it is now.
    fn slices(&self) -> Vec<ResourceSlice> {
        gpu_dra::slices::build(
            &self.model(),
            &gpu_dra::slices::PoolOptions {
                driver_name: "gpu.nvidia.com".into(),
                node_name: PRESET.into(),
                generation: 1,
            },
        )
        .unwrap()
    }

    /// Creates the MIG device `name` as prepare does for a dynamic-MIG claim.
    fn prepare_mig(&self, name: &str) {
        let model = self.model();
        let device = model
            .devices
            .iter()
            .find(|d| d.device.name == name)
            .unwrap();
        let DeviceKind::MigDynamic {
            profile_id,
            placement,
            ..
        } = &device.kind
        else {
            panic!("{name} is not a dynamic MIG device");
        };
        self.backend.set_mig_mode(device.gpu_index, true).unwrap();
        self.backend
            .create_mig_device(device.gpu_index, *profile_id, placement.start)
            .unwrap();
    }

    /// The UUID of GPU `index`.
    fn uuid(&self, index: u32) -> String {
        let inventory = self.backend.inventory().unwrap();
        inventory
            .gpus
            .iter()
            .find(|g| g.index == index)
            .unwrap()
            .uuid
            .clone()
    }
}

/// A 1g.10gb MIG claim, on the GPU with `parent` UUID when given.
fn mig_claim(parent: Option<&str>) -> ResourceClaim {
    let pin = parent
        .map(|uuid| format!(" && device.attributes['gpu.nvidia.com'].parentUUID == '{uuid}'"))
        .unwrap_or_default();
    claim(
        "mig",
        &format!(
            "requests:\n- name: mig\n  exactly:\n    deviceClassName: mig.nvidia.com\n    selectors:\n    - cel:\n        expression: \"device.attributes['gpu.nvidia.com'].profile == '1g.10gb'{pin}\""
        ),
    )
}

/// The docs' claim for one partition of `size` GPUs of `class`.
fn partition_claim(size: usize, class: &str) -> ResourceClaim {
    claim(
        &format!("partition{size}"),
        &format!(
            "requests:\n- name: gpus\n  exactly:\n    deviceClassName: {class}\n    allocationMode: ExactCount\n    count: {size}\nconstraints:\n- requests: [gpus]\n  matchAttribute: gpu.nvidia.com/partition{size}"
        ),
    )
}

fn allocate(
    slices: &[ResourceSlice],
    held: &[ResourceClaim],
    claim: &ResourceClaim,
    rollback: CounterRollback,
) -> Outcome {
    allocate_on(PRESET, slices, held, claim, rollback)
}

fn allocate_on(
    node: &str,
    slices: &[ResourceSlice],
    held: &[ResourceClaim],
    claim: &ResourceClaim,
    rollback: CounterRollback,
) -> Outcome {
    let classes = gpu_dra::explain_inputs::builtin_classes().unwrap();
    let allocator = Allocator::new(&CelEngine, &classes, slices, held)
        .unwrap()
        .with_counter_rollback(rollback);
    let prepared = allocator.prepare(std::slice::from_ref(claim)).unwrap();
    allocator.allocate(&prepared, &Node::named(node), Detail::Full)
}

/// The devices of a one-claim outcome, `request=device`; empty when it does not fit.
fn got(outcome: &Outcome) -> Vec<String> {
    device_names(outcome).into_iter().flatten().collect()
}

fn want(request: &str, devices: &[&str]) -> Vec<String> {
    devices.iter().map(|d| format!("{request}={d}")).collect()
}

/// Allocates the MIG claim, prepares its device and returns it as an allocated claim.
fn place_mig(node: &FmNode, parent: Option<&str>, rollback: CounterRollback) -> ResourceClaim {
    let outcome = allocate(&node.slices(), &[], &mig_claim(parent), rollback);
    let [device] = got(&outcome).try_into().expect("one MIG device");
    let device = device.strip_prefix("mig=").unwrap().to_string();
    node.prepare_mig(&device);
    allocated("mig", PRESET, &[("mig", &device)])
}

#[test]
fn after_a_mig_claim_on_gpu_0_partition4_gets_gpus_4_to_7_and_partition2_a_pair_without_gpu_0() {
    for rollback in BOTH {
        let node = FmNode::new();
        let gpu0 = node.uuid(0);
        let mig = place_mig(&node, Some(&gpu0), rollback);
        let held = std::slice::from_ref(&mig);
        let slices = node.slices();
        let p4 = allocate(
            &slices,
            held,
            &partition_claim(4, "gpu.nvidia.com"),
            rollback,
        );
        assert_eq!(
            got(&p4),
            want("gpus", &["gpu-4", "gpu-5", "gpu-6", "gpu-7"]),
            "{rollback:?}"
        );
        let p2 = allocate(
            &slices,
            held,
            &partition_claim(2, "gpu.nvidia.com"),
            rollback,
        );
        assert_eq!(got(&p2), want("gpus", &["gpu-4", "gpu-6"]), "{rollback:?}");
        let vm = allocate(
            &slices,
            held,
            &partition_claim(4, "vfio.gpu.nvidia.com"),
            rollback,
        );
        assert_eq!(
            got(&vm),
            want(
                "gpus",
                &["gpu-vfio-4", "gpu-vfio-5", "gpu-vfio-6", "gpu-vfio-7"]
            ),
            "{rollback:?}"
        );
    }
}

#[test]
fn after_a_mig_claim_on_gpu_0_partition8_is_refused_because_gpu_0_is_carved() {
    for rollback in BOTH {
        let node = FmNode::new();
        let gpu0 = node.uuid(0);
        let mig = place_mig(&node, Some(&gpu0), rollback);
        let p8 = allocate(
            &node.slices(),
            std::slice::from_ref(&mig),
            &partition_claim(8, "gpu.nvidia.com"),
            rollback,
        );
        assert!(got(&p8).is_empty(), "{rollback:?}: {:?}", got(&p8));
        assert_eq!((p8.progress.placed, p8.progress.needed), (7, 8));
        let gpu0_reason = p8.requests[0]
            .rejected
            .iter()
            .find(|r| r.device.device == "gpu-0")
            .map(|r| r.reason.clone());
        let Some(Rejection::CountersExhausted {
            counter_set,
            consumers,
            ..
        }) = gpu0_reason
        else {
            panic!("{rollback:?}: gpu-0 refused for {gpu0_reason:?}");
        };
        assert_eq!(counter_set, "gpu-0-counter-set");
        assert_eq!(consumers[0].by, "claim default/mig");
    }
}

#[test]
fn the_layout_published_before_the_mig_device_exists_reproduces_the_old_schedulers_refusal() {
    // The scheduler allocates the partition claim from slices in which GPU 0 is not yet
    // carved (the MIG claim is allocated, its device not yet created, or the plugin has not
    // republished yet): GPUs 0-7 in plain order. The old scheduler starts a set on GPU 1,
    // cannot finish it, keeps the counters of GPUs 4-7 it passed over, and refuses.
    let node = FmNode::new();
    let slices = node.slices();
    let gpu0 = node.uuid(0);
    let outcome = allocate(
        &slices,
        &[],
        &mig_claim(Some(&gpu0)),
        CounterRollback::Released,
    );
    let [device] = got(&outcome).try_into().expect("one MIG device");
    let mig = allocated(
        "mig",
        PRESET,
        &[("mig", device.strip_prefix("mig=").unwrap())],
    );
    let held = std::slice::from_ref(&mig);
    let claim = partition_claim(4, "gpu.nvidia.com");
    let fixed = allocate(&slices, held, &claim, CounterRollback::Released);
    assert_eq!(
        got(&fixed),
        want("gpus", &["gpu-4", "gpu-5", "gpu-6", "gpu-7"])
    );
    let old = allocate(&slices, held, &claim, CounterRollback::Leaked);
    assert!(got(&old).is_empty(), "{:?}", got(&old));
    let gpu4 = old.requests[0]
        .conflicts
        .iter()
        .find(|r| r.device.device == "gpu-4")
        .map(|r| r.reason.clone());
    assert!(
        matches!(gpu4, Some(Rejection::Constraint { .. })),
        "gpu-4 is first refused by the constraint (then for the counters it kept): {gpu4:?}"
    );
}

#[test]
fn a_mig_claim_placed_where_the_node_puts_it_leaves_the_first_partitions_to_the_docs_claims() {
    for rollback in BOTH {
        let node = FmNode::new();
        let mig = place_mig(&node, None, rollback);
        let results = gpu_dra::alloc::allocation_results(&mig);
        assert_eq!(
            results[0].device, "gpu-7-mig-1g10gb-6",
            "MIG claims fill the node from its last GPU"
        );
        let held = std::slice::from_ref(&mig);
        let slices = node.slices();
        let cases = [
            (4, vec!["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
            (2, vec!["gpu-0", "gpu-2"]),
            (8, vec![]),
        ];
        for (size, devices) in cases {
            let outcome = allocate(
                &slices,
                held,
                &partition_claim(size, "gpu.nvidia.com"),
                rollback,
            );
            assert_eq!(
                got(&outcome),
                want("gpus", &devices),
                "{rollback:?}, partition{size}"
            );
        }
    }
}

/// The held-out flow with the real binary: the plugin (`--passthrough --fabric-manager`, the
/// chart's layout) prepares a MIG claim on GPU 0, republishes its GPUs free partitions first,
/// and the docs' partition4 claim over the slices it published gets GPUs 4-7 even as the old
/// scheduler decides.
#[tokio::test]
async fn the_plugin_republishes_free_partitions_first_after_preparing_a_mig_claim_on_gpu_0() {
    use gpu_dra::kubelet::client::DraApi;
    use plugin_support::claims;
    let node = plugin_support::Node::new().with_sim_node(PRESET);
    let mig_device = "gpu-0-mig-1g10gb-0";
    node.api
        .put_claim(claims::on_node("mig", "uid-mig", &[mig_device]));
    let mut command = node.command();
    command
        .arg("--passthrough")
        .arg("--host-root")
        .arg(node.state_dir().join("sim/host-root"))
        .arg("--fabric-manager");
    // Every profile on every GPU, so the MIG claim can sit on GPU 0: the default `split`
    // gives GPU 0 no 1g.10gb (and its 1g.10gb claims go to GPU 7 first).
    let mut plugin = node.spawn_command(command, &[("GPU_DRA_MIG_PROFILES", "all")]);
    plugin.wait_registrable().await;
    let whole = |slices: &[serde_json::Value]| -> Vec<String> {
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter(|d| d["attributes"]["type"]["string"] == "gpu")
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    let idle = plugin_support::eventually("the pool published", || node.api.complete_pool()).await;
    assert_eq!(
        whole(&idle),
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()
    );
    let mut kubelet = plugin.register(DraApi::V1).await;
    let mig = claims::claim_ref("mig", "uid-mig");
    let prepared = kubelet.prepare(std::slice::from_ref(&mig)).await.unwrap();
    assert!(prepared[&mig.uid].is_ok(), "{prepared:?}");
    let want_order: Vec<String> = [4, 5, 6, 7, 1, 3, 2, 0]
        .iter()
        .map(|i| format!("gpu-{i}"))
        .collect();
    let published = plugin_support::eventually("GPUs of free partitions republished first", || {
        // Every slice of the pool's new generation written, as the scheduler waits for.
        node.api.complete_pool().filter(|slices| {
            let generation = &slices[0]["spec"]["pool"]["generation"];
            slices
                .iter()
                .all(|s| &s["spec"]["pool"]["generation"] == generation)
                && whole(slices) == want_order
        })
    })
    .await;
    let slices: Vec<ResourceSlice> = published
        .into_iter()
        .map(|s| serde_json::from_value(s).unwrap())
        .collect();
    let held = allocated("mig", claims::NODE, &[("mig", mig_device)]);
    for rollback in BOTH {
        let p4 = allocate_on(
            claims::NODE,
            &slices,
            std::slice::from_ref(&held),
            &partition_claim(4, "gpu.nvidia.com"),
            rollback,
        );
        assert_eq!(
            got(&p4),
            want("gpus", &["gpu-4", "gpu-5", "gpu-6", "gpu-7"]),
            "{rollback:?}"
        );
    }
}

#[test]
fn under_the_default_split_layout_the_docs_partition_claims_hold_after_a_mig_claim_on_gpu_0() {
    // The chart's default publishes GPU 0 only its one-slice variants (and 7g.80gb), and the
    // whole GPUs in split's whole-GPU order: the FM order must still put GPUs 4-7 first once
    // GPU 0 is carved, for either scheduler.
    for rollback in BOTH {
        let node = FmNode::split();
        let slices = node.slices();
        // Idle: every size fits, whatever GPU the walk starts on.
        for size in [2, 4, 8] {
            let idle = allocate(
                &slices,
                &[],
                &partition_claim(size, "gpu.nvidia.com"),
                rollback,
            );
            assert_eq!(
                got(&idle).len(),
                size,
                "{rollback:?}, idle, partition{size}"
            );
        }
        let gpu0 = node.uuid(0);
        let claim = claim(
            "mig",
            &format!(
                "requests:\n- name: mig\n  exactly:\n    deviceClassName: mig.nvidia.com\n    selectors:\n    - cel:\n        expression: \"device.attributes['gpu.nvidia.com'].profile == '1g.20gb' && device.attributes['gpu.nvidia.com'].parentUUID == '{gpu0}'\""
            ),
        );
        let outcome = allocate(&slices, &[], &claim, rollback);
        let [device] = got(&outcome).try_into().expect("one MIG device on GPU 0");
        let device = device.strip_prefix("mig=").unwrap().to_string();
        node.prepare_mig(&device);
        let mig = allocated("mig", PRESET, &[("mig", &device)]);
        let held = std::slice::from_ref(&mig);
        let slices = node.slices();
        let mut p4 = got(&allocate(
            &slices,
            held,
            &partition_claim(4, "gpu.nvidia.com"),
            rollback,
        ));
        p4.sort();
        assert_eq!(
            p4,
            want("gpus", &["gpu-4", "gpu-5", "gpu-6", "gpu-7"]),
            "{rollback:?}"
        );
        let p2 = got(&allocate(
            &slices,
            held,
            &partition_claim(2, "gpu.nvidia.com"),
            rollback,
        ));
        assert_eq!(p2.len(), 2, "{rollback:?}");
        assert!(
            !p2.contains(&"gpus=gpu-0".to_string()),
            "{rollback:?}: {p2:?}"
        );
        let vm = got(&allocate(
            &slices,
            held,
            &partition_claim(4, "vfio.gpu.nvidia.com"),
            rollback,
        ));
        assert_eq!(vm.len(), 4, "{rollback:?}: {vm:?}");
    }
}
