//! Facts about the cluster the plugin needs before it publishes: the API server's version,
//! whether it serves `resource.k8s.io/v1`, and the UID of this node's Node object.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::{Api, Client};

use super::error::{K8sError, Step};

/// The DRA API group.
pub const RESOURCE_GROUP: &str = "resource.k8s.io";

/// The API server's version, as numbers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion {
    /// Major version (`1`).
    pub major: u32,
    /// Minor version (`36` for a server reporting `"36+"`).
    pub minor: u32,
    /// The full build version (`v1.36.2-eks-…`), for people.
    pub git_version: String,
}

/// What the plugin checks about the cluster at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFacts {
    /// API server version.
    pub version: ServerVersion,
    /// Whether `resource.k8s.io/v1` is served (Kubernetes ≥ 1.34 with the API enabled).
    pub serves_resource_v1: bool,
}

/// Reads the version and the served DRA API versions (two requests).
///
/// Fails with [`K8sError::Api`] / [`K8sError::Unreachable`] naming the request, or
/// [`K8sError::BadVersion`] when the version is unreadable.
pub async fn facts(client: &Client) -> Result<ClusterFacts, K8sError> {
    Ok(ClusterFacts {
        version: server_version(client).await?,
        serves_resource_v1: serves_resource_v1(client).await?,
    })
}

/// `GET /version`, parsed with [`parse_version`].
pub async fn server_version(client: &Client) -> Result<ServerVersion, K8sError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| K8sError::from_kube(Step::GetVersion, e))?;
    parse_version(&info)
}

/// Major and minor of a `/version` answer. Managed clusters decorate the minor (`"36+"`) and
/// some builds leave both empty; then they are taken from `gitVersion` (`v1.36.2-…`).
///
/// Fails with [`K8sError::BadVersion`] naming the field and value when neither gives a number.
pub fn parse_version(info: &Info) -> Result<ServerVersion, K8sError> {
    let from_git: Vec<&str> = info
        .git_version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .collect();
    let number = |field: &'static str, value: &str, git_part: usize| {
        let text = if value.trim().is_empty() {
            from_git.get(git_part).copied().unwrap_or_default()
        } else {
            value
        };
        leading_number(text).ok_or_else(|| K8sError::BadVersion {
            field,
            value: value.to_string(),
        })
    };
    Ok(ServerVersion {
        major: number("major", &info.major, 0)?,
        minor: number("minor", &info.minor, 1)?,
        git_version: info.git_version.clone(),
    })
}

/// `36` from `"36+"`; `None` without leading digits.
fn leading_number(text: &str) -> Option<u32> {
    let text = text.trim();
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text[..end].parse().ok()
}

/// Whether the server serves `resource.k8s.io/v1` (`GET /apis`).
pub async fn serves_resource_v1(client: &Client) -> Result<bool, K8sError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(|e| K8sError::from_kube(Step::ListApiGroups, e))?;
    Ok(groups
        .groups
        .iter()
        .filter(|g| g.name == RESOURCE_GROUP)
        .any(|g| g.versions.iter().any(|v| v.version == "v1")))
}

/// The UID of Node `node` (`GET /api/v1/nodes/<node>`), which owns the node's ResourceSlices.
///
/// Fails with [`K8sError::Api`] (404 when the node is not registered), [`K8sError::Unreachable`]
/// or [`K8sError::NodeWithoutUid`].
pub async fn node_uid(client: &Client, node: &str) -> Result<String, K8sError> {
    let found = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|e| {
            K8sError::from_kube(
                Step::GetNode {
                    node: node.to_string(),
                },
                e,
            )
        })?;
    found.metadata.uid.ok_or_else(|| K8sError::NodeWithoutUid {
        node: node.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Default::default()
        }
    }

    #[test]
    fn decorated_minor_versions_are_read_as_numbers() {
        let got = parse_version(&info("1", "36+", "v1.36.2-eks-1")).unwrap();
        let want = ServerVersion {
            major: 1,
            minor: 36,
            git_version: "v1.36.2-eks-1".into(),
        };
        assert_eq!(want, got);
    }

    #[test]
    fn empty_major_and_minor_fall_back_to_the_git_version() {
        let got = parse_version(&info("", "", "v1.35.0-alpha.1")).unwrap();
        assert_eq!((1, 35), (got.major, got.minor));
    }

    #[test]
    fn a_minor_without_digits_is_an_error_naming_the_field() {
        let err = parse_version(&info("1", "x", "v1.36.0")).unwrap_err();
        assert_eq!(
            "API server version field minor is \"x\", not a number",
            err.to_string()
        );
    }
}
