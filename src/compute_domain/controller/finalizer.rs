//! The JSON patches that add and remove the controller's finalizer. Pure.
//!
//! Why JSON patches with `test` operations, not a merge patch carrying the resourceVersion
//! read: a merge patch replaces the whole `metadata.finalizers` list, so it needs a
//! precondition, and the resourceVersion of the informer's copy fails whenever *anything*
//! wrote the object after that copy was taken (a label another tool sets, the controller's
//! own status patch of a reconcile that ran on an older copy, the garbage collector taking
//! its `foregroundDeletion` finalizer away): a 409 and a retry each time. These patches test
//! only what they depend on: the object's UID (not a re-created namesake) and the finalizer
//! list as read (or, to remove, that our finalizer is still at the index read). A write
//! elsewhere in the object no longer conflicts; a concurrent change to the finalizers still
//! fails the `test` (422), and the caller reads the object again.

use serde_json::{Value, json};

use crate::compute_domain::api;

/// The patch that adds [`api::FINALIZER`] to an object with UID `uid` whose finalizers were
/// read as `current`; `None` when it is there already.
pub fn add(uid: &str, current: &[String]) -> Option<Value> {
    if current.iter().any(|f| f == api::FINALIZER) {
        return None;
    }
    let uid_test = json!({"op": "test", "path": "/metadata/uid", "value": uid});
    Some(if current.is_empty() {
        // A missing list tests as null.
        json!([
            uid_test,
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [api::FINALIZER]},
        ])
    } else {
        json!([
            uid_test,
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": api::FINALIZER},
        ])
    })
}

/// The patch that removes [`api::FINALIZER`] from an object with UID `uid` whose finalizers
/// were read as `current`; `None` when it is not there.
pub fn remove(uid: &str, current: &[String]) -> Option<Value> {
    let index = current.iter().position(|f| f == api::FINALIZER)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": api::FINALIZER},
        {"op": "remove", "path": path},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_tests_the_uid_and_the_list_as_read_and_appends() {
        assert_eq!(
            add("u1", &[]),
            Some(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [api::FINALIZER]},
            ]))
        );
        assert_eq!(
            add("u1", &["other.example/f".to_string()]),
            Some(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers", "value": ["other.example/f"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": api::FINALIZER},
            ]))
        );
        assert_eq!(add("u1", &[api::FINALIZER.to_string()]), None);
    }

    #[test]
    fn removing_tests_that_our_finalizer_is_where_it_was_read() {
        let current = ["foregroundDeletion".to_string(), api::FINALIZER.to_string()];
        assert_eq!(
            remove("u1", &current),
            Some(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": api::FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        );
        assert_eq!(remove("u1", &["foregroundDeletion".to_string()]), None);
    }
}
