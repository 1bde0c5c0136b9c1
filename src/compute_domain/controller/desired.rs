//! What the controller wants to exist for one `ComputeDomain`: the workload's
//! ResourceClaimTemplate, the IMEX daemons' ResourceClaimTemplate and their DaemonSet. Pure:
//! built from the domain and the controller's settings, compared and written elsewhere.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodResourceClaim, PodSpec,
    PodTemplateSpec, ResourceClaim as ContainerClaim, ResourceRequirements, Toleration,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceRequest, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::core::ResourceExt;
use serde_json::json;

use crate::compute_domain::api::{self, ComputeDomain};

/// The request name in both templates, and the DaemonSet pod's claim name.
pub const CHANNEL_REQUEST: &str = "channel";
/// The request name of the daemon template and the daemon pod's claim.
pub const DAEMON_REQUEST: &str = "daemon";
/// Container name of the IMEX daemon in the DaemonSet's pods.
pub const DAEMON_CONTAINER: &str = "imex-daemon";
/// The `app.kubernetes.io/component` of the DaemonSet and its pods.
pub const DAEMON_COMPONENT: &str = "imex-daemon";

/// The controller's settings that shape the objects it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The driver's namespace: the daemon template, the DaemonSet and the
    /// `ComputeDomainNode` objects live there.
    pub namespace: String,
    /// Image of the IMEX daemon pods (`gpu-dra imex-daemon`).
    pub image: String,
    /// Service account of the IMEX daemon pods (may write `ComputeDomainNode` objects).
    pub daemon_service_account: String,
    /// The daemon pods run the binary's own simulated `nvidia-imex` tools
    /// (`GPU_DRA_SIMULATED_IMEX=true`): for simulated nodes, whose image has no IMEX package.
    pub simulated_imex: bool,
}

/// Name of domain `uid`'s daemon ResourceClaimTemplate and DaemonSet in the driver's
/// namespace: `imex-<uid>` (41 characters for a UID, a valid DNS label).
pub fn daemon_object_name(uid: &str) -> String {
    format!("imex-{uid}")
}

/// The labels on every object the controller creates for domain `uid`.
pub fn domain_labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(api::DOMAIN_UID_LABEL.to_string(), uid.to_string())])
}

/// The owner reference that lets the garbage collector delete same-namespace objects with
/// their domain (`controller`, `blockOwnerDeletion`: a foreground deletion waits for them).
pub fn owner_reference(domain: &ComputeDomain) -> OwnerReference {
    OwnerReference {
        api_version: api::API_VERSION.to_string(),
        kind: api::COMPUTE_DOMAIN_KIND.to_string(),
        name: domain.name_any(),
        uid: domain.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A template with one request of `class` and the opaque `parameters` for the
/// compute-domain driver.
fn claim_template(
    metadata: ObjectMeta,
    request: &str,
    class: &str,
    parameters: serde_json::Value,
) -> ResourceClaimTemplate {
    ResourceClaimTemplate {
        metadata,
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: request.to_string(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: class.to_string(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    config: Some(vec![DeviceClaimConfiguration {
                        requests: Some(vec![request.to_string()]),
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: api::DRIVER_NAME.to_string(),
                            parameters: k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                                parameters,
                            ),
                        }),
                    }]),
                    constraints: None,
                }),
            }),
        }),
    }
}

/// The workload's template: in the domain's namespace under `spec.channel.resourceClaimTemplate.name`,
/// owned by the domain, one channel of [`api::CHANNEL_DEVICE_CLASS`] configured with
/// `ComputeDomainChannelConfig{domainID, allocationMode}`. `None` when the spec has no
/// channel (the caller reports `InvalidSpec`).
pub fn workload_template(domain: &ComputeDomain) -> Option<ResourceClaimTemplate> {
    let channel = domain.spec.channel.as_ref()?;
    let uid = domain.uid().unwrap_or_default();
    let config = api::ComputeDomainChannelConfig {
        domain_id: uid.clone(),
        allocation_mode: channel.allocation_mode,
    };
    let mut parameters = json!({"apiVersion": api::API_VERSION, "kind": api::CHANNEL_CONFIG_KIND});
    merge(
        &mut parameters,
        serde_json::to_value(config).unwrap_or_default(),
    );
    Some(claim_template(
        ObjectMeta {
            name: Some(channel.resource_claim_template.name.clone()),
            namespace: domain.namespace(),
            labels: Some(domain_labels(&uid)),
            owner_references: Some(vec![owner_reference(domain)]),
            ..Default::default()
        },
        CHANNEL_REQUEST,
        api::CHANNEL_DEVICE_CLASS,
        parameters,
    ))
}

/// The IMEX daemons' template in the driver's namespace ([`daemon_object_name`]): one device
/// of [`api::DAEMON_DEVICE_CLASS`] configured with `ComputeDomainDaemonConfig{domainID}`.
/// No owner reference (they cannot cross namespaces): the finalizer deletes it.
pub fn daemon_template(domain: &ComputeDomain, settings: &Settings) -> ResourceClaimTemplate {
    let uid = domain.uid().unwrap_or_default();
    let config = api::ComputeDomainDaemonConfig {
        domain_id: uid.clone(),
    };
    let mut parameters = json!({"apiVersion": api::API_VERSION, "kind": api::DAEMON_CONFIG_KIND});
    merge(
        &mut parameters,
        serde_json::to_value(config).unwrap_or_default(),
    );
    claim_template(
        ObjectMeta {
            name: Some(daemon_object_name(&uid)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(domain_labels(&uid)),
            ..Default::default()
        },
        DAEMON_REQUEST,
        api::DAEMON_DEVICE_CLASS,
        parameters,
    )
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn downward(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The IMEX daemons' DaemonSet in the driver's namespace ([`daemon_object_name`]): on the
/// nodes labelled [`api::NODE_LABEL`]`=<uid>` (the kubelet plugin labels a node when it
/// prepares a channel there), each pod runs `gpu-dra imex-daemon` with the daemon claim and
/// `NODE_NAME`, `POD_IP` and `POD_NAMESPACE` from the downward API. It tolerates every taint
/// a GPU node may carry: a daemon that does not run keeps the node's channels from working.
pub fn daemon_set(domain: &ComputeDomain, settings: &Settings) -> DaemonSet {
    let uid = domain.uid().unwrap_or_default();
    let name = daemon_object_name(&uid);
    let mut labels = domain_labels(&uid);
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        DAEMON_COMPONENT.to_string(),
    );
    let pod = PodSpec {
        service_account_name: Some(settings.daemon_service_account.clone()),
        node_selector: Some(BTreeMap::from([(api::NODE_LABEL.to_string(), uid.clone())])),
        tolerations: Some(vec![Toleration {
            operator: Some("Exists".to_string()),
            ..Default::default()
        }]),
        resource_claims: Some(vec![PodResourceClaim {
            name: DAEMON_REQUEST.to_string(),
            resource_claim_template_name: Some(name.clone()),
            ..Default::default()
        }]),
        containers: vec![Container {
            name: DAEMON_CONTAINER.to_string(),
            image: Some(settings.image.clone()),
            image_pull_policy: Some("IfNotPresent".to_string()),
            args: Some(vec!["imex-daemon".to_string()]),
            env: Some({
                let mut env = vec![
                    downward("NODE_NAME", "spec.nodeName"),
                    downward("POD_IP", "status.podIP"),
                    downward("POD_NAMESPACE", "metadata.namespace"),
                ];
                if settings.simulated_imex {
                    env.push(EnvVar {
                        name: "GPU_DRA_SIMULATED_IMEX".to_string(),
                        value: Some("true".to_string()),
                        ..Default::default()
                    });
                }
                env
            }),
            resources: Some(ResourceRequirements {
                claims: Some(vec![ContainerClaim {
                    name: DAEMON_REQUEST.to_string(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(domain_labels(&uid)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        },
        status: None,
    }
}

/// What of the IMEX daemons' pod template differs between `existing` (as the cluster holds
/// it) and `desired` ([`daemon_set`]), in the fields this controller sets and an upgrade
/// changes: the daemon container's image, command, arguments and environment, and the pod's
/// service account. `None` when none does. Fields the API server defaults (pull policy,
/// termination message path, DNS policy, ...) are not compared, so a DaemonSet this
/// controller wrote is never "outdated" by the server's own additions.
pub fn daemon_set_outdated(existing: &DaemonSet, desired: &DaemonSet) -> Option<String> {
    let pod = |d: &DaemonSet| d.spec.template.spec.clone();
    let (Some(have), Some(want)) = (pod(existing), pod(desired)) else {
        return Some("the pod template is missing".to_string());
    };
    let container = |p: &PodSpec| {
        p.containers
            .iter()
            .find(|c| c.name == DAEMON_CONTAINER)
            .cloned()
    };
    let want_c = container(&want)?;
    let Some(have_c) = container(&have) else {
        return Some(format!("no {DAEMON_CONTAINER} container"));
    };
    let mut changed = Vec::new();
    if have_c.image != want_c.image {
        changed.push(format!(
            "image {} -> {}",
            have_c.image.unwrap_or_default(),
            want_c.image.unwrap_or_default()
        ));
    }
    if have_c.command != want_c.command {
        changed.push("command".to_string());
    }
    if have_c.args != want_c.args {
        changed.push("args".to_string());
    }
    if have_c.env.unwrap_or_default() != want_c.env.unwrap_or_default() {
        changed.push("env".to_string());
    }
    if have.service_account_name != want.service_account_name {
        changed.push("serviceAccountName".to_string());
    }
    (!changed.is_empty()).then(|| changed.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(channel: Option<api::ChannelSpec>) -> ComputeDomain {
        let mut d = ComputeDomain::new(
            "imex",
            &api::compute_domain_resource(),
            api::ComputeDomainSpec {
                num_nodes: 2,
                channel,
            },
        );
        d.metadata.namespace = Some("team-a".into());
        d.metadata.uid = Some("uid-1".into());
        d
    }

    fn channel(mode: api::AllocationMode) -> Option<api::ChannelSpec> {
        Some(api::ChannelSpec {
            resource_claim_template: api::TemplateRef {
                name: "imex-channel".into(),
            },
            allocation_mode: mode,
        })
    }

    fn settings() -> Settings {
        Settings {
            namespace: "gpu-dra".into(),
            image: "gpu-dra:dev".into(),
            daemon_service_account: "gpu-dra-imex-daemon".into(),
            simulated_imex: false,
        }
    }

    #[test]
    fn workload_template_carries_the_channel_config_and_an_owner_reference() {
        let t = workload_template(&domain(channel(api::AllocationMode::All))).unwrap();
        let got = serde_json::to_value(&t).unwrap();
        assert_eq!(
            (
                &got["metadata"]["name"],
                &got["metadata"]["namespace"],
                &got["metadata"]["labels"]
            ),
            (
                &json!("imex-channel"),
                &json!("team-a"),
                &json!({api::DOMAIN_UID_LABEL: "uid-1"})
            )
        );
        assert_eq!(
            got["metadata"]["ownerReferences"],
            json!([{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                    "name": "imex", "uid": "uid-1", "controller": true,
                    "blockOwnerDeletion": true}])
        );
        assert_eq!(
            got["spec"]["spec"]["devices"],
            json!({"requests": [{"name": "channel", "exactly": {
                       "deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
                   "config": [{"requests": ["channel"], "opaque": {
                       "driver": "compute-domain.nvidia.com",
                       "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                                      "kind": "ComputeDomainChannelConfig",
                                      "domainID": "uid-1", "allocationMode": "All"}}}]})
        );
    }

    #[test]
    fn a_domain_without_a_channel_has_no_workload_template() {
        assert_eq!(workload_template(&domain(None)), None);
    }

    #[test]
    fn daemon_template_lives_in_the_driver_namespace_without_an_owner() {
        let t = daemon_template(&domain(channel(Default::default())), &settings());
        let got = serde_json::to_value(&t).unwrap();
        assert_eq!(
            (
                &got["metadata"]["name"],
                &got["metadata"]["namespace"],
                &got["metadata"]["ownerReferences"]
            ),
            (
                &json!("imex-uid-1"),
                &json!("gpu-dra"),
                &serde_json::Value::Null
            )
        );
        assert_eq!(
            got["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"],
            json!({"apiVersion": "resource.nvidia.com/v1beta1",
                   "kind": "ComputeDomainDaemonConfig", "domainID": "uid-1"})
        );
        assert_eq!(
            got["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
            json!("compute-domain-daemon.nvidia.com")
        );
    }

    #[test]
    fn daemon_set_selects_the_domains_nodes_and_runs_the_imex_daemon_with_its_claim() {
        let ds = daemon_set(&domain(channel(Default::default())), &settings());
        let got = serde_json::to_value(&ds).unwrap();
        let pod = &got["spec"]["template"]["spec"];
        assert_eq!(
            pod["nodeSelector"],
            json!({"resource.nvidia.com/computeDomain": "uid-1"})
        );
        assert_eq!(
            pod["resourceClaims"],
            json!([{"name": "daemon", "resourceClaimTemplateName": "imex-uid-1"}])
        );
        assert_eq!(pod["serviceAccountName"], json!("gpu-dra-imex-daemon"));
        let c = &pod["containers"][0];
        assert_eq!(
            (&c["image"], &c["args"], &c["resources"]["claims"]),
            (
                &json!("gpu-dra:dev"),
                &json!(["imex-daemon"]),
                &json!([{"name": "daemon"}])
            )
        );
        let env: Vec<(&str, &str)> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap(),
                    e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            env,
            vec![
                ("NODE_NAME", "spec.nodeName"),
                ("POD_IP", "status.podIP"),
                ("POD_NAMESPACE", "metadata.namespace")
            ]
        );
        assert_eq!(
            got["spec"]["selector"]["matchLabels"],
            json!({api::DOMAIN_UID_LABEL: "uid-1"})
        );
        assert_eq!(
            got["spec"]["template"]["metadata"]["labels"][api::DOMAIN_UID_LABEL],
            json!("uid-1")
        );
    }

    #[test]
    fn a_daemon_set_is_outdated_only_in_what_this_controller_sets() {
        let d = domain(channel(api::AllocationMode::Single));
        let want = daemon_set(&d, &settings());
        assert_eq!(daemon_set_outdated(&want, &want), None);

        // What the API server adds or defaults is no difference.
        let mut defaulted = want.clone();
        let pod = defaulted.spec.template.spec.as_mut().unwrap();
        pod.dns_policy = Some("ClusterFirst".into());
        pod.containers[0].termination_message_path = Some("/dev/termination-log".into());
        pod.containers[0].image_pull_policy = Some("Always".into());
        assert_eq!(daemon_set_outdated(&defaulted, &want), None);

        let mut upgraded = settings();
        upgraded.image = "gpu-dra:next".into();
        upgraded.simulated_imex = true;
        assert_eq!(
            daemon_set_outdated(&want, &daemon_set(&d, &upgraded)).as_deref(),
            Some("image gpu-dra:dev -> gpu-dra:next, env")
        );
    }
}
