//! The cluster checks: pure verdicts over [`ClusterFacts`].

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::cluster::{ClusterFacts, Gates, Permission, Policies, Review};
use super::report::Check;

/// `resource-api`: `resource.k8s.io/v1` served (Kubernetes 1.34 or later).
pub fn check_resource_api(facts: &Result<(bool, String), String>) -> Check {
    const NAME: &str = "resource-api";
    match facts {
        Ok((true, version)) => Check::ok(NAME, format!("resource.k8s.io/v1 served ({version})")),
        Ok((false, version)) => Check::fail(
            NAME,
            format!("resource.k8s.io/v1 not served ({version})"),
            "Upgrade to Kubernetes 1.34 or later, where resource.k8s.io/v1 is on by default (or enable --runtime-config=resource.k8s.io/v1=true)",
            NAME,
        ),
        Err(why) => Check::fail(
            NAME,
            why.clone(),
            "Check --kubeconfig and that the API server is reachable from this node",
            NAME,
        ),
    }
}

/// `feature-gates`: a warning naming each gate that is off or could not be read.
pub fn check_gates(gates: &Gates) -> Check {
    const NAME: &str = "feature-gates";
    let named = [
        (
            "DRADeviceTaints",
            gates.device_taints,
            "device taints (unhealthy GPUs)",
        ),
        (
            "DRAPartitionableDevices",
            gates.partitionable_devices,
            "shared counters (dynamic MIG)",
        ),
        (
            "DRAConsumableCapacity",
            gates.consumable_capacity,
            "consumable capacity (--shared-gpus; ComputeDomain pods sharing IMEX channel 0)",
        ),
    ];
    let on: Vec<&str> = named
        .iter()
        .filter(|(_, v, _)| *v == Some(true))
        .map(|(n, _, _)| *n)
        .collect();
    let off: Vec<String> = named
        .iter()
        .filter(|(_, v, _)| *v == Some(false))
        .map(|(n, _, what)| format!("{n} off: {what} dropped"))
        .collect();
    if off.is_empty() && gates.errors.is_empty() {
        return Check::ok(NAME, format!("on: {}", on.join(", ")));
    }
    let mut found = off;
    found.extend(gates.errors.iter().map(|e| format!("unknown: {e}")));
    Check::warn(
        NAME,
        found.join("; "),
        "Enable the named gates on the API server, scheduler and kubelet (--feature-gates=NAME=true); the plugin works without them but publishes less",
        NAME,
    )
}

/// Per pool, its newest generation and the slices of that generation (older ones are being
/// replaced and no longer count).
fn current_slices(slices: &[ResourceSlice]) -> BTreeMap<&str, (i64, Vec<&ResourceSlice>)> {
    let mut pools: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    for s in slices {
        pools.entry(s.spec.pool.name.as_str()).or_default().push(s);
    }
    pools
        .into_iter()
        .map(|(pool, members)| {
            let generation = members
                .iter()
                .map(|s| s.spec.pool.generation)
                .max()
                .unwrap_or(0);
            let current = members
                .into_iter()
                .filter(|s| s.spec.pool.generation == generation)
                .collect();
            (pool, (generation, current))
        })
        .collect()
}

/// `resource-slices`: this node's pool published and complete (every slice of the newest
/// generation present, as `resourceSliceCount` says), with devices.
pub fn check_slices(node: &str, slices: &Result<Vec<ResourceSlice>, String>) -> Check {
    const NAME: &str = "resource-slices";
    let fix = "Check the plugin's log for publishing errors (RBAC, admission policy, API server limits); the plugin publishes within seconds of starting";
    let slices = match slices {
        Ok(s) => s,
        Err(why) => return Check::fail(NAME, why.clone(), fix, NAME),
    };
    if slices.is_empty() {
        return Check::fail(NAME, format!("no ResourceSlices of node {node}"), fix, NAME);
    }
    let mut found = Vec::new();
    let mut incomplete = Vec::new();
    for (pool, (generation, current)) in current_slices(slices) {
        let want = current
            .iter()
            .map(|s| s.spec.pool.resource_slice_count)
            .max()
            .unwrap_or(0);
        let devices: usize = current
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        let line = format!(
            "pool {pool} generation {generation}: {}/{want} slices, {devices} devices",
            current.len()
        );
        if current.len() as i64 != want {
            incomplete.push(line);
        } else {
            found.push(line);
        }
    }
    if incomplete.is_empty() {
        Check::ok(NAME, found.join("; "))
    } else {
        found.extend(incomplete);
        Check::fail(NAME, found.join("; "), fix, NAME)
    }
}

/// The minor version of a `gitVersion` such as `v1.36.2` or `v1.37.0-gke.1`; `None` when it
/// is not of that form.
fn minor_version(git_version: &str) -> Option<u32> {
    let rest = git_version.strip_prefix('v').unwrap_or(git_version);
    let mut parts = rest.split(['.', '-', '+']);
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}

/// `scheduling-cost`: how many of this node's published devices consume shared counters, and
/// whether the control plane's version may still run the scheduler that converts every node's
/// counter-consuming devices for each node it filters (before Kubernetes PR 138917, in 1.37;
/// a 1.36 patch release may carry it). Warns with the figure when both hold: scheduling slows
/// with nodes × those devices (docs/configuration.md, "Scheduling cost of the MIG layout").
/// Nothing to say without slices (that is `resource-slices`).
pub fn check_scheduling_cost(
    version: &Result<(bool, String), String>,
    slices: &Result<Vec<ResourceSlice>, String>,
) -> Check {
    const NAME: &str = "scheduling-cost";
    let Ok(slices) = slices else {
        return Check::ok(NAME, "no slices to weigh (see resource-slices)");
    };
    let devices: Vec<&k8s_openapi::api::resource::v1::Device> = current_slices(slices)
        .into_values()
        .flat_map(|(_, current)| current)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    let with_counters = devices
        .iter()
        .filter(|d| d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()))
        .count();
    let found = format!(
        "{} devices published, {with_counters} consuming shared counters",
        devices.len()
    );
    if with_counters == 0 {
        return Check::ok(
            NAME,
            format!("{found}: each node costs the scheduler its own devices only"),
        );
    }
    let git_version = version.as_ref().map(|(_, v)| v.as_str()).unwrap_or("");
    match minor_version(git_version) {
        Some(minor) if minor >= 37 => Check::ok(
            NAME,
            format!("{found}; {git_version}: the scheduler converts a node's own devices only"),
        ),
        _ => Check::warn(
            NAME,
            format!(
                "{found}; control plane {}: a kube-scheduler without Kubernetes PR 138917 \
                 (1.37, or a 1.36 patch carrying it) converts every node's counter-consuming \
                 devices for each node it filters, so pods/s falls with nodes x {with_counters}",
                if git_version.is_empty() {
                    "of unknown version"
                } else {
                    git_version
                }
            ),
            "If pods schedule slowly, publish only the MIG profiles you hand out (chart value migProfiles), run a scheduler carrying PR 138917, or use static MIG, which has no shared counters; docs/configuration.md has the cost of each",
            NAME,
        ),
    }
}

/// The DeviceClasses the chart installs for `driver`: the GPU class (named after the
/// driver) and `mig.nvidia.com`, with `vfio` (passthrough on) `vfio.<driver>`, with `vgpu`
/// (vGPU types on) `vgpu.<driver>`.
pub fn expected_classes(driver: &str, classes: Classes) -> Vec<String> {
    let mut out = vec![driver.to_string(), "mig.nvidia.com".to_string()];
    if classes.vfio {
        out.push(format!("vfio.{driver}"));
    }
    if classes.vgpu {
        out.push(format!("vgpu.{driver}"));
    }
    out
}

/// Which optional DeviceClasses the plugin's settings make claims need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classes {
    /// `--passthrough`: `vfio.<driver>`.
    pub vfio: bool,
    /// `--vgpu-types`: `vgpu.<driver>`.
    pub vgpu: bool,
}

/// `device-classes`: each expected class exists (`vfio`: passthrough is on; `vgpu`: vGPU
/// types are).
pub fn check_classes(
    driver: &str,
    expected: Classes,
    classes: &Result<Vec<String>, String>,
) -> Check {
    const NAME: &str = "device-classes";
    let fix = format!(
        "Install the chart's DeviceClasses (helm upgrade --install with deviceClasses.gpu and deviceClasses.mig true{}{}); claims name them",
        if expected.vfio {
            ", passthrough.enabled true"
        } else {
            ""
        },
        if expected.vgpu {
            ", vgpu.types set"
        } else {
            ""
        }
    );
    let fix = fix.as_str();
    let classes = match classes {
        Ok(c) => c,
        Err(why) => return Check::fail(NAME, why.clone(), fix, NAME),
    };
    let want = expected_classes(driver, expected);
    let missing: Vec<&String> = want.iter().filter(|w| !classes.contains(w)).collect();
    if missing.is_empty() {
        Check::ok(NAME, want.join(", "))
    } else {
        let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        Check::fail(
            NAME,
            format!("missing DeviceClass {}", names.join(", ")),
            fix,
            NAME,
        )
    }
}

/// `admission-policy`: the chart's `*-own-node-slices` ValidatingAdmissionPolicy exists and
/// a binding names it. Missing is a warning: it narrows what a plugin may write, the plugin
/// works without it.
pub fn check_policy(facts: &Result<Policies, String>) -> Check {
    const NAME: &str = "admission-policy";
    let fix = "Install the chart with admissionPolicy.enabled=true (Kubernetes 1.30+), so a node's plugin can only write its own node's ResourceSlices";
    let Policies { policies, bindings } = match facts {
        Ok(f) => f,
        Err(why) => return Check::warn(NAME, format!("unknown: {why}"), fix, NAME),
    };
    let ours: Vec<&String> = policies
        .iter()
        .filter(|p| p.ends_with("-own-node-slices"))
        .collect();
    let Some(policy) = ours.first() else {
        return Check::warn(
            NAME,
            "no *-own-node-slices ValidatingAdmissionPolicy",
            fix,
            NAME,
        );
    };
    match bindings.iter().find(|(_, p)| p == *policy) {
        Some((binding, _)) => Check::ok(NAME, format!("{policy} bound by {binding}")),
        None => Check::warn(
            NAME,
            format!("{policy} has no ValidatingAdmissionPolicyBinding"),
            fix,
            NAME,
        ),
    }
}

/// `rbac`: every permission allowed for whoever runs doctor (in the plugin's pod: the
/// plugin's service account).
pub fn check_rbac(access: &[(Permission, Review)]) -> Check {
    const NAME: &str = "rbac";
    let fix = "Apply the chart's ClusterRole and ClusterRoleBinding for the plugin's service account; run doctor in the plugin's pod (kubectl exec) to check that account";
    let describe = |p: &Permission| {
        let group = if p.group.is_empty() { "core" } else { p.group };
        match &p.name {
            Some(n) => format!("{} {group}/{}/{n}", p.verb, p.resource),
            None => format!("{} {group}/{}", p.verb, p.resource),
        }
    };
    let denied: Vec<String> = access
        .iter()
        .filter_map(|(p, a)| match a {
            Ok((true, _)) => None,
            Ok((false, reason)) if reason.is_empty() => Some(format!("{} denied", describe(p))),
            Ok((false, reason)) => Some(format!("{} denied ({reason})", describe(p))),
            Err(why) => Some(format!("{}: {why}", describe(p))),
        })
        .collect();
    if denied.is_empty() {
        Check::ok(NAME, format!("{} permissions allowed", access.len()))
    } else {
        Check::fail(NAME, denied.join("; "), fix, NAME)
    }
}

/// Every cluster check, in report order (`vfio`: passthrough is on, its class is expected).
pub fn checks(driver: &str, classes: Classes, node: &str, facts: &ClusterFacts) -> Vec<Check> {
    vec![
        check_resource_api(&facts.resource_v1),
        check_gates(&facts.gates),
        check_slices(node, &facts.slices),
        check_scheduling_cost(&facts.resource_v1, &facts.slices),
        check_classes(driver, classes, &facts.classes),
        check_policy(&facts.policies),
        check_rbac(&facts.access),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::cluster::plugin_permissions;
    use crate::doctor::report::Status;

    fn slice(name: &str, generation: i64, count: i64, devices: usize) -> ResourceSlice {
        let devices: Vec<serde_json::Value> = (0..devices)
            .map(|i| serde_json::json!({"name": format!("gpu-{i}")}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                     "pool": {"name": "n1", "generation": generation, "resourceSliceCount": count},
                     "devices": devices},
        }))
        .unwrap()
    }

    /// A slice of `n` MIG-like devices consuming counters of set `gpu-0`.
    fn counter_slice(generation: i64, n: usize) -> ResourceSlice {
        let devices: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                serde_json::json!({"name": format!("gpu-0-mig-1g10gb-{i}"),
                    "consumesCounters": [{"counterSet": "gpu-0-counter-set",
                                          "counters": {"memory-slice-0": {"value": "1"}}}]})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("m-{generation}")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                     "pool": {"name": "n1", "generation": generation, "resourceSliceCount": 2},
                     "devices": devices},
        }))
        .unwrap()
    }

    #[test]
    fn counter_consuming_devices_warn_on_a_control_plane_older_than_1_37() {
        let slices = Ok(vec![
            slice("full", 3, 2, 2),
            counter_slice(3, 5),
            counter_slice(2, 40),
        ]);
        let old = check_scheduling_cost(&Ok((true, "v1.36.2".into())), &slices);
        assert_eq!(old.status, Status::Warn);
        assert!(
            old.found.starts_with(
                "7 devices published, 5 consuming shared counters; control plane v1.36.2:"
            ),
            "only the newest generation counts: {}",
            old.found
        );
        assert!(old.found.contains("nodes x 5"), "{}", old.found);
        assert!(old.fix.as_deref().unwrap().contains("migProfiles"));

        let unknown = check_scheduling_cost(&Err("unreachable".into()), &slices);
        assert_eq!(unknown.status, Status::Warn);
        assert!(
            unknown.found.contains("of unknown version"),
            "{}",
            unknown.found
        );

        for fixed in ["v1.37.0", "v1.38.1-gke.100", "1.40.0"] {
            let c = check_scheduling_cost(&Ok((true, fixed.into())), &slices);
            assert_eq!(c.status, Status::Ok, "{fixed}: {}", c.found);
        }
    }

    #[test]
    fn devices_without_counters_cost_their_own_node_only_whatever_the_version() {
        let c = check_scheduling_cost(
            &Ok((true, "v1.35.0".into())),
            &Ok(vec![slice("a", 1, 1, 8)]),
        );
        assert_eq!(
            (c.status, c.found.as_str()),
            (
                Status::Ok,
                "8 devices published, 0 consuming shared counters: each node costs the scheduler its own devices only"
            )
        );
        let none = check_scheduling_cost(&Ok((true, "v1.36.0".into())), &Err("403".into()));
        assert_eq!(none.status, Status::Ok);
    }

    #[test]
    fn minor_versions_are_read_from_git_versions() {
        assert_eq!(minor_version("v1.36.2"), Some(36));
        assert_eq!(minor_version("v1.37.0-fake"), Some(37));
        assert_eq!(minor_version("v1.38+k3s1"), Some(38));
        assert_eq!(minor_version("1.34.1"), Some(34));
        assert_eq!(minor_version("v2.1.0"), None);
        assert_eq!(minor_version(""), None);
        assert_eq!(minor_version("vX"), None);
    }

    #[test]
    fn a_pool_missing_a_slice_of_its_newest_generation_fails() {
        let complete = Ok(vec![
            slice("a", 2, 2, 3),
            slice("b", 2, 2, 1),
            slice("old", 1, 1, 4),
        ]);
        let partial = Ok(vec![slice("a", 2, 2, 3), slice("old", 1, 1, 4)]);
        let ok = check_slices("n1", &complete);
        assert_eq!(
            (ok.status, ok.found.as_str()),
            (Status::Ok, "pool n1 generation 2: 2/2 slices, 4 devices")
        );
        let bad = check_slices("n1", &partial);
        assert_eq!(
            (bad.status, bad.found.as_str()),
            (Status::Fail, "pool n1 generation 2: 1/2 slices, 3 devices")
        );
        assert_eq!(
            check_slices("n1", &Ok(vec![])).found,
            "no ResourceSlices of node n1"
        );
    }

    #[test]
    fn a_missing_device_class_fails_naming_it() {
        let c = check_classes(
            "gpu.nvidia.com",
            Classes::default(),
            &Ok(vec!["gpu.nvidia.com".into(), "other".into()]),
        );
        assert_eq!(
            (c.status, c.found.as_str()),
            (Status::Fail, "missing DeviceClass mig.nvidia.com")
        );
        let all = Ok(vec!["mig.nvidia.com".into(), "gpu.nvidia.com".into()]);
        assert_eq!(
            check_classes("gpu.nvidia.com", Classes::default(), &all).status,
            Status::Ok
        );
    }

    #[test]
    fn with_passthrough_on_the_vfio_class_is_expected_too() {
        let without = Ok(vec!["mig.nvidia.com".into(), "gpu.nvidia.com".into()]);
        let vfio = Classes {
            vfio: true,
            vgpu: false,
        };
        let c = check_classes("gpu.nvidia.com", vfio, &without);
        assert_eq!(
            (c.status, c.found.as_str()),
            (Status::Fail, "missing DeviceClass vfio.gpu.nvidia.com")
        );
        assert!(c.fix.unwrap().contains("passthrough.enabled"));
        let with = Ok(vec![
            "mig.nvidia.com".into(),
            "gpu.nvidia.com".into(),
            "vfio.gpu.nvidia.com".into(),
        ]);
        assert_eq!(
            check_classes("gpu.nvidia.com", vfio, &with).status,
            Status::Ok
        );
    }

    #[test]
    fn gates_that_are_off_warn_by_name() {
        let gates = Gates {
            device_taints: Some(true),
            partitionable_devices: Some(false),
            consumable_capacity: Some(true),
            errors: vec![],
        };
        let c = check_gates(&gates);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            c.found,
            "DRAPartitionableDevices off: shared counters (dynamic MIG) dropped"
        );
        let on = Gates {
            partitionable_devices: Some(true),
            ..gates
        };
        assert_eq!(check_gates(&on).status, Status::Ok);
    }

    #[test]
    fn an_unbound_or_missing_admission_policy_is_a_warning() {
        let policy = "gpu-dra-own-node-slices".to_string();
        let bound = Policies {
            policies: vec![policy.clone()],
            bindings: vec![("b".into(), policy.clone())],
        };
        let unbound = Policies {
            policies: vec![policy],
            bindings: vec![],
        };
        let statuses = [
            check_policy(&Ok(bound)).status,
            check_policy(&Ok(unbound)).status,
            check_policy(&Ok(Policies::default())).status,
        ];
        assert_eq!(statuses, [Status::Ok, Status::Warn, Status::Warn]);
    }

    #[test]
    fn a_denied_verb_fails_rbac_naming_the_verb_and_resource() {
        let access: Vec<(Permission, Review)> = plugin_permissions("gpu.nvidia.com")
            .into_iter()
            .map(|p| {
                let denied = p.resource == "resourceslices" && p.verb == "delete";
                (p, Ok((!denied, String::new())))
            })
            .collect();
        let c = check_rbac(&access);
        assert_eq!(
            (c.status, c.found.as_str()),
            (Status::Fail, "delete resource.k8s.io/resourceslices denied")
        );
    }

    #[test]
    fn an_api_server_without_resource_v1_fails() {
        let c = check_resource_api(&Ok((false, "v1.33.1".into())));
        assert_eq!(
            (c.status, c.found.as_str()),
            (Status::Fail, "resource.k8s.io/v1 not served (v1.33.1)")
        );
    }
}
