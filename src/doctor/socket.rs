//! `plugin-socket`: the plugin's registration socket answers GetInfo as the kubelet's plugin
//! watcher would call it, naming this driver and an endpoint that exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::report::Check;
use crate::kubelet::client::KubeletClient;

/// How long one GetInfo may take: a live plugin answers in milliseconds.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(3);

/// What one registration socket answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAnswer {
    /// The socket.
    pub socket: PathBuf,
    /// `(type, name, endpoint, versions)` from GetInfo, or the error chain.
    pub info: Result<(String, String, String, Vec<String>), String>,
    /// Whether the endpoint GetInfo named exists.
    pub endpoint_exists: bool,
}

/// The registration sockets of `driver` in `registry_dir` (`<driver>-reg.sock`, or
/// `<driver>-<pod uid>-reg.sock` during the kubelet's seamless rolling update), sorted.
pub fn registration_sockets(registry_dir: &Path, driver: &str) -> Vec<PathBuf> {
    let prefix = format!("{driver}-");
    let mut found: Vec<PathBuf> = std::fs::read_dir(registry_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with("reg.sock"))
        })
        .collect();
    found.sort();
    found
}

/// Calls GetInfo on every registration socket of `driver`.
pub async fn probe(registry_dir: &Path, driver: &str) -> Vec<SocketAnswer> {
    let mut answers = Vec::new();
    for socket in registration_sockets(registry_dir, driver) {
        let info = tokio::time::timeout(GET_INFO_TIMEOUT, async {
            let mut client = KubeletClient::connect(&socket).await?;
            client.get_info().await
        })
        .await;
        let info = match info {
            Err(_) => Err(format!(
                "GetInfo did not answer within {GET_INFO_TIMEOUT:?}"
            )),
            Ok(Err(e)) => Err(crate::errors::error_chain(&e)),
            Ok(Ok(i)) => Ok((i.r#type, i.name, i.endpoint, i.supported_versions)),
        };
        let endpoint_exists = info
            .as_ref()
            .is_ok_and(|(_, _, endpoint, _)| Path::new(endpoint).exists());
        answers.push(SocketAnswer {
            socket,
            info,
            endpoint_exists,
        });
    }
    answers
}

/// The verdict: ok when one socket answers for `driver` with an existing endpoint.
pub fn check(registry_dir: &Path, driver: &str, answers: &[SocketAnswer]) -> Check {
    const NAME: &str = "plugin-socket";
    let fix = "Start the plugin (kubectl -n <namespace> get pods -l app.kubernetes.io/component=kubelet-plugin) and check its log; the kubelet needs the socket to prepare claims";
    if answers.is_empty() {
        return Check::fail(
            NAME,
            format!("no {driver}-*reg.sock in {}", registry_dir.display()),
            fix,
            NAME,
        );
    }
    let mut problems = Vec::new();
    for a in answers {
        let s = a.socket.display();
        match &a.info {
            Err(why) => problems.push(format!("{s}: {why}")),
            Ok((kind, name, endpoint, versions)) => {
                if name != driver || kind != crate::kubelet::PLUGIN_TYPE {
                    problems.push(format!(
                        "{s}: answers as {kind} {name}, not {} {driver}",
                        crate::kubelet::PLUGIN_TYPE
                    ));
                } else if !a.endpoint_exists {
                    problems.push(format!("{s}: endpoint {endpoint} does not exist"));
                } else {
                    return Check::ok(
                        NAME,
                        format!(
                            "{s}: GetInfo answers {name}, endpoint {endpoint}, {}",
                            versions.join(" ")
                        ),
                    );
                }
            }
        }
    }
    Check::fail(NAME, problems.join("; "), fix, NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn only_this_drivers_registration_sockets_are_found() {
        let tmp = tempfile::tempdir().unwrap();
        for name in [
            "gpu.nvidia.com-reg.sock",
            "gpu.nvidia.com-1234-reg.sock",
            "other.dev-reg.sock",
            "gpu.nvidia.com.lock",
        ] {
            std::fs::write(tmp.path().join(name), "").unwrap();
        }
        let got: Vec<String> = registration_sockets(tmp.path(), "gpu.nvidia.com")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            got,
            vec!["gpu.nvidia.com-1234-reg.sock", "gpu.nvidia.com-reg.sock"]
        );
    }

    #[test]
    fn a_socket_nobody_answers_on_fails_with_the_error() {
        let answers = vec![SocketAnswer {
            socket: "/r/gpu.nvidia.com-reg.sock".into(),
            info: Err("connection refused".into()),
            endpoint_exists: false,
        }];
        let c = check(Path::new("/r"), "gpu.nvidia.com", &answers);
        assert_eq!(
            (c.status, c.found.as_str()),
            (
                Status::Fail,
                "/r/gpu.nvidia.com-reg.sock: connection refused"
            )
        );
        assert_eq!(
            check(Path::new("/r"), "gpu.nvidia.com", &[]).status,
            Status::Fail
        );
    }

    #[test]
    fn a_socket_of_another_driver_name_fails() {
        let answers = vec![SocketAnswer {
            socket: "/r/gpu.nvidia.com-reg.sock".into(),
            info: Ok((
                "DRAPlugin".into(),
                "other.dev".into(),
                "/p/dra.sock".into(),
                vec![],
            )),
            endpoint_exists: true,
        }];
        assert_eq!(
            check(Path::new("/r"), "gpu.nvidia.com", &answers).status,
            Status::Fail
        );
    }
}
