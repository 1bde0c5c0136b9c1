//! Cluster checks: the DRA API, its feature gates, this node's ResourceSlices, the
//! DeviceClasses, the admission policy and the plugin's RBAC.
//!
//! [`gather`] reads [`ClusterFacts`] from the API server (a fixed, small number of requests:
//! discovery, two dry-run creates, four lists and one access review per RBAC rule); the
//! `check_*` functions of `cluster_checks.rs` judge them without I/O.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

pub use super::cluster_checks::checks;

/// One permission the plugin uses, as the chart's ClusterRole grants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resource, with subresource after a slash (`resourceclaims/status`).
    pub resource: &'static str,
    /// Verb.
    pub verb: &'static str,
    /// Resource name the rule is limited to, if any.
    pub name: Option<String>,
}

/// Every verb `kubelet-plugin` calls (the chart's `templates/rbac.yaml`), for `driver`.
pub fn plugin_permissions(driver: &str) -> Vec<Permission> {
    let p = |group, resource, verb| Permission {
        group,
        resource,
        verb,
        name: None,
    };
    vec![
        p("resource.k8s.io", "resourceclaims", "get"),
        p("resource.k8s.io", "resourceclaims/status", "update"),
        Permission {
            name: Some(driver.to_string()),
            ..p(
                "resource.k8s.io",
                "resourceclaims/driver",
                "associated-node:update",
            )
        },
        p("resource.k8s.io", "resourceslices", "list"),
        p("resource.k8s.io", "resourceslices", "create"),
        p("resource.k8s.io", "resourceslices", "update"),
        p("resource.k8s.io", "resourceslices", "delete"),
        p("", "nodes", "get"),
    ]
}

/// The feature gates the plugin's slices use, each as the API server showed it: `Some(true)`
/// when a dry-run create kept the field, `Some(false)` when the server dropped it (the gate
/// is off), `None` when the dry run failed (the error is in `errors`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gates {
    /// `DRADeviceTaints`: device taints kept.
    pub device_taints: Option<bool>,
    /// `DRAPartitionableDevices`: shared counters kept.
    pub partitionable_devices: Option<bool>,
    /// `DRAConsumableCapacity`: `allowMultipleAllocations` kept.
    pub consumable_capacity: Option<bool>,
    /// Why a dry run failed.
    pub errors: Vec<String>,
}

/// What the cluster answered, each part on its own (one failing request does not hide the
/// others).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts {
    /// Whether `resource.k8s.io/v1` is served, and the API server's version.
    pub resource_v1: Result<(bool, String), String>,
    /// The feature gates.
    pub gates: Gates,
    /// This node's ResourceSlices of the driver.
    pub slices: Result<Vec<ResourceSlice>, String>,
    /// Names of the DeviceClasses.
    pub classes: Result<Vec<String>, String>,
    /// The ValidatingAdmissionPolicies and their bindings.
    pub policies: Result<Policies, String>,
    /// Each permission with the review's answer.
    pub access: Vec<(Permission, Review)>,
}

/// ValidatingAdmissionPolicy names, and bindings as `(name, policyName)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    /// Policy names.
    pub policies: Vec<String>,
    /// `(binding name, policyName)`.
    pub bindings: Vec<(String, String)>,
}

/// One access review's answer: `(allowed, the authorizer's reason)`, or the request's error.
pub type Review = Result<(bool, String), String>;

fn text(e: kube::Error) -> String {
    crate::errors::error_chain(&e)
}

/// Reads the facts for `driver` on `node`.
pub async fn gather(client: &Client, driver: &str, node: &str) -> ClusterFacts {
    let resource_v1 = async {
        let served = crate::k8s::cluster::serves_resource_v1(client)
            .await
            .map_err(|e| crate::errors::error_chain(&e))?;
        let version = client
            .apiserver_version()
            .await
            .map(|v| v.git_version)
            .unwrap_or_default();
        Ok((served, version))
    }
    .await;
    let gates = gates(client, driver, node).await;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}")))
        .await
        .map(|l| l.items)
        .map_err(text);
    let classes = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect()
        })
        .map_err(text);
    let policies = async {
        let vaps = Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(text)?;
        let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(text)?;
        Ok(Policies {
            policies: vaps
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect(),
            bindings: bindings
                .items
                .into_iter()
                .map(|b| (b.metadata.name.unwrap_or_default(), b.spec.policy_name))
                .collect(),
        })
    }
    .await;
    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    let mut access = Vec::new();
    for permission in plugin_permissions(driver) {
        let (resource, subresource) = match permission.resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (permission.resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(permission.group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource,
                    verb: Some(permission.verb.to_string()),
                    name: permission.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map(|r| {
                let status = r.status.unwrap_or_default();
                (status.allowed, status.reason.unwrap_or_default())
            })
            .map_err(text);
        access.push((permission, answer));
    }
    ClusterFacts {
        resource_v1,
        gates,
        slices,
        classes,
        policies,
        access,
    }
}

/// Two dry-run creates (nothing is stored): a device with a taint and
/// `allowMultipleAllocations`, and a counter set. A field the response lacks was dropped by
/// the API server because its gate is off.
async fn gates(client: &Client, driver: &str, node: &str) -> Gates {
    let api = Api::<ResourceSlice>::all(client.clone());
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let slice = |suffix: &str, spec: serde_json::Value| -> ResourceSlice {
        let mut spec = spec;
        spec["driver"] = driver.into();
        spec["nodeName"] = node.into();
        spec["pool"] = serde_json::json!({"name": format!("gpu-dra-doctor-{node}"), "generation": 0, "resourceSliceCount": 1});
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("gpu-dra-doctor-{node}-{suffix}")},
            "spec": spec,
        }))
        .expect("a valid ResourceSlice")
    };
    let mut gates = Gates::default();
    let device = slice(
        "device",
        serde_json::json!({"devices": [{
            "name": "doctor-probe",
            "allowMultipleAllocations": true,
            "capacity": {"memory": {"value": "1Gi"}},
            "taints": [{"key": "gpu.nvidia.com/doctor-probe", "effect": "NoSchedule"}],
        }]}),
    );
    match api.create(&dry, &device).await {
        Ok(got) => {
            let d = got.spec.devices.unwrap_or_default().into_iter().next();
            gates.device_taints = Some(
                d.as_ref()
                    .is_some_and(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty())),
            );
            gates.consumable_capacity = Some(
                d.as_ref()
                    .is_some_and(|d| d.allow_multiple_allocations == Some(true)),
            );
        }
        Err(e) => gates.errors.push(format!(
            "dry-run create of a tainted, shareable device: {}",
            text(e)
        )),
    }
    let counters = slice(
        "counters",
        serde_json::json!({"sharedCounters": [{"name": "doctor-probe", "counters": {"memory": {"value": "1Gi"}}}]}),
    );
    match api.create(&dry, &counters).await {
        Ok(got) => {
            gates.partitionable_devices =
                Some(got.spec.shared_counters.is_some_and(|c| !c.is_empty()));
        }
        Err(e) => gates
            .errors
            .push(format!("dry-run create of a counter set: {}", text(e))),
    }
    gates
}
