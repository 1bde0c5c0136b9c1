//! Kubernetes Events on this node's Node object, for what an operator must see with
//! `kubectl describe node` (e.g. a start-up recovery the plugin could not finish).
//!
//! Core `v1` Events in namespace `default`, the namespace the kubelet uses for its own node
//! events, naming the Node as `involvedObject` (kind `Node`, the node name as `uid`, as the
//! kubelet does) and `gpu-dra` as source and reporting controller.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client};

use super::error::{K8sError, Step};

/// The namespace of node events.
pub const NODE_EVENTS_NAMESPACE: &str = "default";
/// `source.component` and `reportingComponent` of every event.
pub const COMPONENT: &str = "gpu-dra";

/// `Normal` or `Warning`, the two types Kubernetes defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something worth knowing went as it should.
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Posts events about one node.
#[derive(Clone)]
pub struct NodeEvents {
    client: Client,
    node: String,
}

impl NodeEvents {
    /// Events about Node `node`.
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        NodeEvents {
            client,
            node: node.into(),
        }
    }

    /// Creates one event of `kind` with a machine-readable `reason` (CamelCase) and a
    /// `message` for people (cut to 1 KiB, the API server's limit).
    ///
    /// # Errors
    /// [`K8sError::Api`], [`K8sError::Unreachable`] or [`K8sError::Protocol`] for
    /// [`Step::CreateEvent`]; one request, not retried.
    pub async fn post(&self, kind: EventType, reason: &str, message: &str) -> Result<(), K8sError> {
        let event = node_event(
            &self.node,
            kind,
            reason,
            message,
            k8s_openapi::jiff::Timestamp::now(),
        );
        Api::<Event>::namespaced(self.client.clone(), NODE_EVENTS_NAMESPACE)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
            .map_err(|e| {
                K8sError::from_kube(
                    Step::CreateEvent {
                        node: self.node.clone(),
                        reason: reason.to_string(),
                    },
                    e,
                )
            })
    }
}

/// The event object. Pure.
pub fn node_event(
    node: &str,
    kind: EventType,
    reason: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    let mut message = message.to_string();
    if message.len() > 1024 {
        let mut cut = 1021;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}.gpu-dra.")),
            namespace: Some(NODE_EVENTS_NAMESPACE.to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(node.to_string()),
            uid: Some(node.to_string()),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message),
        type_: Some(kind.as_str().to_string()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_string()),
            host: Some(node.to_string()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        action: Some(reason.to_string()),
        reporting_component: Some(COMPONENT.to_string()),
        reporting_instance: Some(format!("{COMPONENT}-{node}")),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_event_names_the_node_as_the_kubelet_does_and_cuts_long_messages() {
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let event = node_event(
            "n1",
            EventType::Warning,
            "RecoveryIncomplete",
            &"é".repeat(800),
            now,
        );
        let got = serde_json::to_value(&event).unwrap();
        assert_eq!(
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}),
            got["involvedObject"]
        );
        assert_eq!(
            ("Warning", "RecoveryIncomplete"),
            (
                got["type"].as_str().unwrap(),
                got["reason"].as_str().unwrap()
            )
        );
        let message = got["message"].as_str().unwrap();
        assert!(
            message.len() <= 1024 && message.ends_with("..."),
            "{}",
            message.len()
        );
        assert_eq!("default", got["metadata"]["namespace"]);
    }
}
