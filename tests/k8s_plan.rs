//! The publisher's pure planning on real slices of simulated nodes: the generation rules, the
//! write order, and what does not count as a change.

mod k8s_support;

use gpu_dra::devices::DeviceModel;
use gpu_dra::k8s::plan::{Delete, Plan, Write, node_owner, plan};
use gpu_dra::slices::{self, PoolOptions};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_support::fixtures::{self, DRIVER, NODE_UID};

fn build(model: &DeviceModel, node: &str, generation: i64) -> Vec<ResourceSlice> {
    let pool = PoolOptions {
        driver_name: DRIVER.into(),
        node_name: node.into(),
        generation,
    };
    slices::build(model, &pool).unwrap()
}

/// Slices as the cluster holds them after we wrote them: owned, with server metadata.
fn in_cluster(slices: Vec<ResourceSlice>, owner: &OwnerReference) -> Vec<ResourceSlice> {
    slices
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.metadata.owner_references = Some(vec![owner.clone()]);
            s.metadata.uid = Some(format!("uid-{i}"));
            s.metadata.resource_version = Some(format!("{}", 100 + i));
            s
        })
        .collect()
}

fn names(writes: &[Write]) -> Vec<(&'static str, String)> {
    writes
        .iter()
        .map(|w| {
            let kind = match w {
                Write::Create(_) => "create",
                Write::Update(_) => "update",
            };
            (kind, w.slice().metadata.name.clone().unwrap())
        })
        .collect()
}

struct Case {
    node: String,
    big: DeviceModel,
    small: DeviceModel,
    owner: OwnerReference,
}

fn case() -> Case {
    let (node, big) = fixtures::model("dgx-h100", None);
    let small = fixtures::first_gpus(&big, 4);
    let owner = node_owner(&node, NODE_UID);
    Case {
        node,
        big,
        small,
        owner,
    }
}

#[test]
fn a_new_pool_is_created_at_generation_one() {
    let c = case();
    let desired = build(&c.big, &c.node, 0);

    let got = plan(&desired, &[], &c.node, &c.owner);

    assert_eq!(1, got.generation);
    let want: Vec<_> = desired
        .iter()
        .map(|s| ("create", s.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(want, names(&got.writes));
    for write in &got.writes {
        assert_eq!(1, write.slice().spec.pool.generation);
        assert_eq!(
            Some(vec![c.owner.clone()]),
            write.slice().metadata.owner_references
        );
    }
}

#[test]
fn an_unchanged_pool_plans_nothing_and_keeps_its_generation() {
    let c = case();
    let existing = in_cluster(build(&c.big, &c.node, 5), &c.owner);

    let got = plan(&build(&c.big, &c.node, 0), &existing, &c.node, &c.owner);

    let want = Plan {
        generation: 5,
        writes: vec![],
        deletes: vec![],
    };
    assert_eq!(want, got);
}

#[test]
fn a_shrunk_pool_updates_every_kept_slice_to_the_next_generation_and_deletes_the_rest() {
    let c = case();
    let existing = in_cluster(build(&c.big, &c.node, 5), &c.owner);
    let desired = build(&c.small, &c.node, 0);

    let got = plan(&desired, &existing, &c.node, &c.owner);

    assert_eq!(6, got.generation);
    let want: Vec<_> = desired
        .iter()
        .map(|s| ("update", s.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(want, names(&got.writes));
    let count = desired.len() as i64;
    for (write, current) in got.writes.iter().zip(&existing) {
        let slice = write.slice();
        assert_eq!(
            (6, count),
            (
                slice.spec.pool.generation,
                slice.spec.pool.resource_slice_count
            )
        );
        assert_eq!(
            current.metadata.resource_version,
            slice.metadata.resource_version
        );
    }
    let want_deletes: Vec<Delete> = existing[desired.len()..]
        .iter()
        .map(|s| Delete {
            name: s.metadata.name.clone().unwrap(),
            uid: s.metadata.uid.clone(),
        })
        .collect();
    assert_eq!(want_deletes, got.deletes);
}

#[test]
fn an_interrupted_change_is_finished_in_the_generation_it_started() {
    let c = case();
    // Generation 6 (big) was written for the first slice only; the rest is still at 5.
    let mut existing = in_cluster(build(&c.small, &c.node, 5), &c.owner);
    existing[0] = in_cluster(build(&c.big, &c.node, 6), &c.owner).remove(0);

    let got = plan(&build(&c.big, &c.node, 0), &existing, &c.node, &c.owner);

    assert_eq!(6, got.generation);
    let written: Vec<String> = names(&got.writes).into_iter().map(|(_, n)| n).collect();
    assert!(
        !written.contains(&slices::slice_name(
            &c.node,
            DRIVER,
            0,
            build(&c.big, &c.node, 0).len()
        )),
        "{written:?}"
    );
    assert_eq!(build(&c.big, &c.node, 0).len() - 1, written.len());
}

#[test]
fn an_interrupted_change_to_content_no_longer_wanted_gets_another_generation() {
    let c = case();
    let mut existing = in_cluster(build(&c.small, &c.node, 5), &c.owner);
    existing[0] = in_cluster(build(&c.big, &c.node, 6), &c.owner).remove(0);
    let small_again = fixtures::first_gpus(&c.big, 2);

    let got = plan(
        &build(&small_again, &c.node, 0),
        &existing,
        &c.node,
        &c.owner,
    );

    assert_eq!(7, got.generation);
}

#[test]
fn a_missing_owner_is_repaired_without_a_new_generation() {
    let c = case();
    let mut existing = in_cluster(build(&c.big, &c.node, 5), &c.owner);
    existing[1].metadata.owner_references = None;

    let got = plan(&build(&c.big, &c.node, 0), &existing, &c.node, &c.owner);

    assert_eq!(5, got.generation);
    let want = vec![(
        "update",
        slices::slice_name(&c.node, DRIVER, 1, build(&c.big, &c.node, 0).len()),
    )];
    assert_eq!(want, names(&got.writes));
}

#[test]
fn quantities_the_server_rewrote_canonically_are_not_a_change() {
    let c = case();
    let mut existing = in_cluster(build(&c.big, &c.node, 5), &c.owner);
    let device = existing
        .iter_mut()
        .flat_map(|s| s.spec.devices.iter_mut().flatten())
        .next()
        .unwrap();
    let memory = device.capacity.as_mut().unwrap().get_mut("memory").unwrap();
    let (mantissa, exponent) = gpu_dra::k8s::compare::quantity(&memory.value.0).unwrap();
    let rewritten = format!("{mantissa}e{exponent}");
    assert_ne!(memory.value.0, rewritten);
    memory.value = Quantity(rewritten);

    let got = plan(&build(&c.big, &c.node, 0), &existing, &c.node, &c.owner);

    assert!(got.is_empty(), "{:?}", names(&got.writes));
}

#[test]
fn slices_of_another_pool_are_deleted_and_do_not_set_the_generation() {
    let c = case();
    let mut existing = in_cluster(build(&c.big, &c.node, 5), &c.owner);
    let mut stray = build(&c.big, "old-name", 9).remove(0);
    stray.metadata.name = Some("stray".into());
    existing.push(stray);

    let got = plan(&build(&c.big, &c.node, 0), &existing, &c.node, &c.owner);

    assert_eq!(5, got.generation);
    assert!(got.writes.is_empty());
    let want = vec![Delete {
        name: "stray".into(),
        uid: None,
    }];
    assert_eq!(want, got.deletes);
}

#[test]
fn slices_under_an_older_releases_names_are_replaced_at_a_new_generation() {
    // Releases before zero-padded slice indices named slice i `<node>-<driver>-<i>`: the
    // upgrade writes every slice under its new name at a new generation, then deletes the
    // old ones, which are all left over.
    let c = case();
    let mut old = in_cluster(build(&c.big, &c.node, 5), &c.owner);
    for (i, s) in old.iter_mut().enumerate() {
        s.metadata.name = Some(format!("{}-{DRIVER}-{i}", c.node));
    }
    let desired = build(&c.big, &c.node, 0);

    let got = plan(&desired, &old, &c.node, &c.owner);

    assert_eq!(6, got.generation);
    let want: Vec<_> = desired
        .iter()
        .map(|s| ("create", s.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(want, names(&got.writes));
    assert!(
        got.writes
            .iter()
            .all(|w| w.slice().spec.pool.generation == 6)
    );
    let deleted: Vec<String> = got.deletes.iter().map(|d| d.name.clone()).collect();
    let old_names: Vec<String> = old
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(old_names, deleted);
}
