//! The one interface between the kubelet's DRA calls, whatever their wire version, and the
//! code that actually prepares claims.

use std::collections::BTreeMap;
use std::future::Future;

/// The identity of a ResourceClaim as the kubelet sends it. The driver reads everything else
/// (the allocation, opaque config) from the API server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// UID of the ResourceClaim; the key of the kubelet's response map.
    pub uid: String,
}

/// One device made ready for a claim, as reported back to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// Requests of the claim this device satisfies; empty means all of them.
    pub request_names: Vec<String>,
    /// The ResourceSlice pool the device was published in.
    pub pool_name: String,
    /// The device's name within its pool.
    pub device_name: String,
    /// Fully qualified CDI device names (`vendor/class=name`).
    pub cdi_device_ids: Vec<String>,
    /// The share of a device allocated with multiple allocations allowed. Only the v1 API can
    /// carry it; v1beta1 kubelets never see it.
    pub share_id: Option<String>,
}

/// Per-claim outcome of a prepare call, keyed by claim UID.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;

/// Per-claim outcome of an unprepare call, keyed by claim UID.
pub type UnprepareResults = BTreeMap<String, Result<(), String>>;

/// What the kubelet-facing server needs from the rest of the driver.
///
/// The server guarantees that:
/// - every claim handed over has a non-empty namespace, name and UID, and no UID appears twice;
/// - at most one `prepare`/`unprepare` runs at a time across every plugin instance sharing the
///   plugin directory (the `plugin.lock` file lock), so implementations may read and write
///   shared state on disk without further locking, and must not keep state in memory between
///   calls (the next call may reach the other instance during a rolling update);
/// - concurrent kubelet calls of one operation may reach it as one call holding all their
///   claims (group commit), each UID once; each kubelet call gets its own claims' answers;
/// - a started call runs to completion even if the kubelet hangs up (it gives up after 45 s),
///   so a retry finds the work done rather than half done;
/// - a panic fails the claims of that call, not the server.
///
/// Implementations answer per claim: an `Err` is a message for the kubelet (it ends up in pod
/// events, so say what to do). A claim left out of the map is reported to the kubelet as a
/// failure naming that claim. Both calls must be idempotent; unpreparing an unknown claim
/// succeeds.
pub trait DraHandler: Send + Sync + 'static {
    /// Whether the handler logs each claim's failure itself (with what it knows of the
    /// error's kind): the DRA core then logs a failure at debug, so it is on one line at
    /// warn, not two. Default: `false`, the core's line is the warn line.
    const LOGS_FAILURES: bool = false;

    /// Work for a prepare of `claims` that needs no lock and is worth doing before the call
    /// waits for it, e.g. reading the claims from the API server, so a slow read holds up
    /// only this call. Runs concurrently with other calls' work; whatever it keeps must be
    /// re-checked under the lock. Default: nothing.
    fn prefetch(&self, _claims: &[ClaimRef]) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Makes the devices allocated to `claims` usable on this node.
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send;

    /// Releases whatever `prepare` set up for `claims`.
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send;
}

/// Splits a kubelet request into the claims worth handing to the handler and per-claim errors
/// for the rest, keyed by UID (an empty UID is keyed by the empty string).
///
/// A repeated UID is handed over once: the response map can hold only one answer per UID.
pub fn validate_claims(claims: Vec<ClaimRef>) -> (Vec<ClaimRef>, BTreeMap<String, String>) {
    let mut valid: Vec<ClaimRef> = Vec::with_capacity(claims.len());
    let mut invalid = BTreeMap::new();
    for claim in claims {
        let problem = match missing_field(&claim) {
            Some(field) => Some(format!(
                "claim field {field} is empty (namespace {:?}, name {:?}, uid {:?}); \
                 the kubelet must send namespace, name and uid",
                claim.namespace, claim.name, claim.uid
            )),
            None => malformed_field(&claim),
        };
        match problem {
            Some(problem) => {
                invalid.entry(claim.uid.clone()).or_insert(problem);
            }
            None if valid.iter().any(|seen| seen.uid == claim.uid) => {}
            None => valid.push(claim),
        }
    }
    (valid, invalid)
}

fn missing_field(claim: &ClaimRef) -> Option<&'static str> {
    [
        ("uid", &claim.uid),
        ("namespace", &claim.namespace),
        ("name", &claim.name),
    ]
    .into_iter()
    .find_map(|(field, value)| value.is_empty().then_some(field))
}

/// A UID, namespace or name that no Kubernetes object has. They become parts of file and
/// directory names (the CDI spec, MPS daemon directories) and checkpoint keys, so they are
/// checked here, at the boundary, whatever later layers check again: a UID is letters,
/// digits, `-`, `_` and `.` (an API server UID is a UUID), a namespace a DNS label and a
/// name a DNS subdomain.
fn malformed_field(claim: &ClaimRef) -> Option<String> {
    let rules = [
        FieldRule {
            field: "uid",
            max: 128,
            allowed: |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
            valid: "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        },
        FieldRule {
            field: "namespace",
            max: 63,
            allowed: |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-',
            valid: "a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit",
        },
        FieldRule {
            field: "name",
            max: 253,
            allowed: |c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'),
            valid: "a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        },
    ];
    let values = [&claim.uid, &claim.namespace, &claim.name];
    rules
        .iter()
        .zip(values)
        .find_map(|(rule, value)| rule.problem(value))
}

/// What one claim field may hold.
struct FieldRule {
    field: &'static str,
    max: usize,
    allowed: fn(char) -> bool,
    valid: &'static str,
}

impl FieldRule {
    fn problem(&self, value: &str) -> Option<String> {
        let alnum = |c: char| c.is_ascii_alphanumeric();
        let ok = value.len() <= self.max
            && value.starts_with(alnum)
            && value.ends_with(alnum)
            && value.chars().all(self.allowed);
        (!ok).then(|| {
            format!(
                "claim field {} {value:?} is not valid: at most {} characters, {}",
                self.field, self.max, self.valid
            )
        })
    }
}

/// Completes a handler answer: every requested claim gets an entry, answers about claims that
/// were not asked for are dropped.
pub(crate) fn complete_results<T>(
    asked: &[ClaimRef],
    mut answered: BTreeMap<String, Result<T, String>>,
) -> BTreeMap<String, Result<T, String>> {
    asked
        .iter()
        .map(|claim| {
            let outcome = answered.remove(&claim.uid).unwrap_or_else(|| {
                Err(format!(
                    "the driver returned no result for claim {}/{} (uid {}); the kubelet will retry",
                    claim.namespace, claim.name, claim.uid
                ))
            });
            (claim.uid.clone(), outcome)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(namespace: &str, name: &str, uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn claims_with_an_empty_field_are_rejected_naming_the_field() {
        let (valid, invalid) = validate_claims(vec![
            claim("ns", "a", "uid-a"),
            claim("", "b", "uid-b"),
            claim("ns", "", "uid-c"),
            claim("ns", "d", ""),
        ]);
        assert_eq!(valid, vec![claim("ns", "a", "uid-a")]);
        let got: Vec<(&str, bool)> = invalid
            .iter()
            .map(|(uid, error)| (uid.as_str(), error.contains("claim field")))
            .collect();
        assert_eq!(got, vec![("", true), ("uid-b", true), ("uid-c", true)]);
        assert!(invalid["uid-b"].contains("namespace is empty"));
        assert!(invalid["uid-c"].contains("name is empty"));
        assert!(invalid[""].contains("uid is empty"));
    }

    #[test]
    fn claims_whose_fields_could_escape_a_directory_are_rejected_naming_the_field() {
        let (valid, invalid) = validate_claims(vec![
            claim("team-a", "ok", "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b"),
            claim("team-a", "traversal", "../../etc/cron.d/x"),
            claim("team-a", "dot", ".hidden"),
            claim("../x", "ns", "uid-ns"),
            claim("team-a", "a/b", "uid-name"),
            claim("team-a", "long", &"u".repeat(129)),
        ]);
        assert_eq!(vec!["3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b"], {
            valid.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>()
        });
        let field_of = |uid: &str| {
            let message = &invalid[uid];
            message
                .strip_prefix("claim field ")
                .and_then(|rest| rest.split(' ').next())
                .unwrap_or_else(|| panic!("{message}"))
                .to_string()
        };
        assert_eq!("uid", field_of("../../etc/cron.d/x"));
        assert_eq!("uid", field_of(".hidden"));
        assert_eq!("namespace", field_of("uid-ns"));
        assert_eq!("name", field_of("uid-name"));
        assert_eq!("uid", field_of(&"u".repeat(129)));
        assert!(
            invalid["uid-ns"].contains("a DNS label"),
            "{}",
            invalid["uid-ns"]
        );
    }

    #[test]
    fn a_repeated_uid_is_handed_over_once() {
        let (valid, invalid) =
            validate_claims(vec![claim("ns", "a", "uid-a"), claim("ns", "a", "uid-a")]);
        assert_eq!(valid, vec![claim("ns", "a", "uid-a")]);
        assert_eq!(invalid, BTreeMap::new());
    }

    #[test]
    fn claims_missing_from_the_answer_become_errors_and_extra_answers_are_dropped() {
        let asked = vec![claim("ns", "a", "uid-a"), claim("ns", "b", "uid-b")];
        let answered =
            BTreeMap::from([("uid-a".to_string(), Ok(())), ("uid-z".to_string(), Ok(()))]);
        let got = complete_results(&asked, answered);
        let want: BTreeMap<String, Result<(), String>> = BTreeMap::from([
            ("uid-a".to_string(), Ok(())),
            (
                "uid-b".to_string(),
                Err("the driver returned no result for claim ns/b (uid uid-b); \
                     the kubelet will retry"
                    .to_string()),
            ),
        ]);
        assert_eq!(got, want);
    }
}
