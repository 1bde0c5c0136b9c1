//! Pure decisions of the IMEX daemon wrapper: which index a new node takes, whether a node
//! that collided with a concurrent starter must re-pick, and the nodes config a clique's
//! `ComputeDomainNode` objects render to.

use kube::core::ResourceExt;

use crate::compute_domain::api::{ComputeDomain, ComputeDomainNode, Readiness};

/// Annotation a daemon puts on its object once it first turned Ready: from then on its index
/// is final, even while it restarts after a crash.
pub const INDEX_CONFIRMED_ANNOTATION: &str = "resource.nvidia.com/imexIndexConfirmed";

/// What the decisions need of one `ComputeDomainNode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Object name.
    pub name: String,
    /// `spec.cliqueID`.
    pub clique: String,
    /// `status.index`.
    pub index: u32,
    /// `status.ipAddress` (empty until the daemon wrote it).
    pub ip: String,
    /// `metadata.creationTimestamp` as RFC 3339 text (sorts by time), empty if unset.
    pub created: String,
    /// Whether the daemon is Ready or ever was ([`INDEX_CONFIRMED_ANNOTATION`]): then its
    /// index is final.
    pub ready: bool,
}

impl Member {
    /// The member view of an object; `None` for one without a name.
    pub fn of(object: &ComputeDomainNode) -> Option<Member> {
        let status = object.status.clone().unwrap_or_default();
        Some(Member {
            name: object.metadata.name.clone()?,
            clique: object.spec.clique_id.clone(),
            index: status.index,
            ip: status.ip_address,
            created: object
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            ready: status.status == Readiness::Ready
                || object
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(INDEX_CONFIRMED_ANNOTATION)),
        })
    }

    /// Creation order: creationTimestamp, then name.
    fn order(&self) -> (&str, &str) {
        (&self.created, &self.name)
    }
}

/// The lowest index not used by another member of `clique` (`own` excluded).
pub fn lowest_free_index(members: &[Member], clique: &str, own: &str) -> u32 {
    let used: std::collections::BTreeSet<u32> = members
        .iter()
        .filter(|m| m.clique == clique && m.name != own)
        .map(|m| m.index)
        .collect();
    (0..).find(|i| !used.contains(i)).unwrap_or(0)
}

/// Whether `own` (not yet Ready) shares its index with another member of its clique that was
/// created first or is already Ready, and so must re-pick. A Ready member never re-picks: a
/// running daemon's index never changes.
pub fn must_repick(members: &[Member], own: &Member) -> bool {
    !own.ready
        && members.iter().any(|m| {
            m.name != own.name
                && m.clique == own.clique
                && m.index == own.index
                && (m.ready || m.order() < own.order())
        })
}

/// Whether `own` may not turn Ready yet: it is not Ready (nor ever was) and shares its index
/// with another member of its clique. Of two such members [`must_repick`] moves one (the one
/// created later, or the one that finds the other Ready); the other waits until it sees that.
///
/// This is what makes a Ready node's index unique, given that a node decides from a view that
/// shows every member whose index was written before its own last write: of two nodes with one
/// index, the one whose index was written later sees the other, so it waits or re-picks, and
/// cannot turn Ready until the other re-picked or turned Ready (then it re-picks itself).
pub fn must_wait(members: &[Member], own: &Member) -> bool {
    !own.ready
        && members
            .iter()
            .any(|m| m.name != own.name && m.clique == own.clique && m.index == own.index)
}

/// The nodes config of `clique`: the IPs of its members that reported one, in index order
/// (ties by creation order), one per line.
pub fn nodes_config(members: &[Member], clique: &str) -> String {
    let mut of_clique: Vec<&Member> = members
        .iter()
        .filter(|m| m.clique == clique && !m.ip.is_empty())
        .collect();
    of_clique.sort_by(|a, b| (a.index, a.order()).cmp(&(b.index, b.order())));
    of_clique.iter().map(|m| format!("{}\n", m.ip)).collect()
}

/// Why the daemon of domain `uid` has no domain to serve any more, given what a read of the
/// `ComputeDomain` by the namespace and name the claim named returned: `None` while the domain
/// is the daemon's and not being deleted. A daemon with no domain writes nothing again: its
/// object, if recreated, would outlive the domain (nothing else deletes it once the controller
/// finished the clean-up).
pub fn domain_gone(found: Option<&ComputeDomain>, uid: &str) -> Option<String> {
    let Some(domain) = found else {
        return Some("the ComputeDomain no longer exists".to_string());
    };
    let found_uid = domain.uid().unwrap_or_default();
    if found_uid != uid {
        return Some(format!(
            "the ComputeDomain of that name is another one now (UID {found_uid})"
        ));
    }
    domain
        .metadata
        .deletion_timestamp
        .is_some()
        .then(|| "the ComputeDomain is being deleted".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_that_is_gone_deleting_or_replaced_is_gone_and_a_live_one_is_not() {
        let mut domain = ComputeDomain::new(
            "imex",
            &crate::compute_domain::api::compute_domain_resource(),
            Default::default(),
        );
        domain.metadata.uid = Some("u1".into());
        assert_eq!(domain_gone(Some(&domain), "u1"), None);
        assert_eq!(
            domain_gone(Some(&domain), "u0").as_deref(),
            Some("the ComputeDomain of that name is another one now (UID u1)")
        );
        assert_eq!(
            domain_gone(None, "u1").as_deref(),
            Some("the ComputeDomain no longer exists")
        );
        domain.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(
            domain_gone(Some(&domain), "u1").as_deref(),
            Some("the ComputeDomain is being deleted")
        );
    }

    fn m(name: &str, clique: &str, index: u32, created: &str, ready: bool) -> Member {
        Member {
            name: name.into(),
            clique: clique.into(),
            index,
            ip: format!("10.0.0.{}", index + 1),
            created: created.into(),
            ready,
        }
    }

    #[test]
    fn a_new_node_takes_the_lowest_index_free_in_its_clique() {
        let members = [
            m("a", "c1", 0, "t1", true),
            m("b", "c1", 2, "t2", true),
            m("x", "c2", 1, "t1", true),
        ];
        assert_eq!(lowest_free_index(&members, "c1", "new"), 1);
        assert_eq!(lowest_free_index(&members, "c2", "new"), 0);
        assert_eq!(
            lowest_free_index(&members, "c1", "b"),
            1,
            "own index does not count"
        );
    }

    #[test]
    fn of_two_concurrent_starters_the_later_created_re_picks() {
        let first = m("a", "c1", 0, "2026-01-01T00:00:01Z", false);
        let second = m("b", "c1", 0, "2026-01-01T00:00:02Z", false);
        let members = [first.clone(), second.clone()];
        assert!(!must_repick(&members, &first));
        assert!(must_repick(&members, &second));
        let same_time = m("c", "c1", 0, "2026-01-01T00:00:01Z", false);
        assert!(
            must_repick(&[first.clone(), same_time.clone()], &same_time),
            "name breaks ties"
        );
    }

    #[test]
    fn a_ready_node_keeps_its_index_and_an_other_clique_never_collides() {
        let ready_late = m("b", "c1", 0, "t9", true);
        let early = m("a", "c1", 0, "t1", false);
        assert!(!must_repick(
            &[early.clone(), ready_late.clone()],
            &ready_late
        ));
        assert!(must_repick(&[early.clone(), ready_late], &early));
        let other = m("z", "c2", 0, "t0", true);
        let own = m("a", "c1", 0, "t1", false);
        assert!(!must_repick(&[other, own.clone()], &own));
    }

    #[test]
    fn a_node_sharing_its_index_waits_until_the_other_moves_unless_its_index_is_final() {
        // Created in the same second, a counts as first (by name): b re-picks once it sees a,
        // and a, which does not re-pick, must not turn Ready while b still has index 0 (its
        // write may have come after a's, so b need not have seen a yet).
        let a = m("a", "c1", 0, "t1", false);
        let b = m("b", "c1", 0, "t1", false);
        assert!(!must_repick(&[a.clone(), b.clone()], &a));
        assert!(must_wait(&[a.clone(), b.clone()], &a));
        assert!(must_repick(&[a.clone(), b.clone()], &b));
        let moved = m("b", "c1", 1, "t1", false);
        assert!(!must_wait(&[a.clone(), moved], &a));
        let final_index = m("a", "c1", 0, "t1", true);
        assert!(!must_wait(&[final_index.clone(), b], &final_index));
        let other_clique = m("z", "c2", 0, "t0", false);
        assert!(!must_wait(&[a.clone(), other_clique], &a));
    }

    #[test]
    fn the_nodes_config_lists_the_cliques_ips_in_index_order() {
        let mut no_ip = m("d", "c1", 3, "t4", false);
        no_ip.ip.clear();
        let members = [
            m("b", "c1", 2, "t2", true),
            m("a", "c1", 0, "t1", true),
            m("x", "c2", 1, "t1", true),
            no_ip,
        ];
        assert_eq!(nodes_config(&members, "c1"), "10.0.0.1\n10.0.0.3\n");
        assert_eq!(nodes_config(&members, "c3"), "");
    }
}
