use super::*;
use serde_json::{Value, json};

fn attr(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..DeviceAttribute::default()
    }
}

fn device(request: &str, name: &str) -> MetadataDevice {
    MetadataDevice {
        request: request.to_string(),
        pool: "node-a".to_string(),
        name: name.to_string(),
        attributes: [
            ("type".to_string(), attr("gpu")),
            (PCI_BUS_ID.to_string(), attr("0000:18:00.0")),
        ]
        .into_iter()
        .collect(),
    }
}

fn claim<'a>(pod_claim_name: Option<&'a str>) -> MetadataClaim<'a> {
    MetadataClaim {
        namespace: "ns",
        name: "my-claim",
        uid: "uid-1",
        pod_claim_name,
    }
}

#[test]
fn the_document_is_a_stream_of_v1beta1_then_v1alpha1_each_on_its_own_line() {
    let w = MetadataWriter::new(Path::new("/plugin"), "gpu.nvidia.com");
    let d = device("gpus", "gpu-0");
    let text = w.document(&claim(None), "gpus", &[&d], 1);
    let lines: Vec<&str> = text.lines().collect();
    assert!(text.ends_with('\n'));
    assert_eq!(lines.len(), 2);
    let objects: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let versions: Vec<&str> = objects
        .iter()
        .map(|o| o["apiVersion"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1"
        ]
    );
    let want = json!({
        "kind": "DeviceMetadata",
        "metadata": {"name": "my-claim", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "requests": [{"name": "gpus", "devices": [{
            "driver": "gpu.nvidia.com", "pool": "node-a", "name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}, "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"}}
        }]}]
    });
    for o in &objects {
        let mut o = o.clone();
        o.as_object_mut().unwrap().remove("apiVersion");
        assert_eq!(o, want);
    }
}

#[test]
fn a_template_claim_is_found_under_its_pod_claim_name_and_carries_it() {
    let w = MetadataWriter::new(Path::new("/plugin"), "gpu.nvidia.com");
    assert_eq!(
        w.container_path(&claim(None), "gpus/h100"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/my-claim/gpus/gpu.nvidia.com-metadata.json"
    );
    assert_eq!(
        w.container_path(&claim(Some("gpu")), "gpus"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpus/gpu.nvidia.com-metadata.json"
    );
    let d = device("gpus", "gpu-0");
    let text = w.document(&claim(Some("gpu")), "gpus", &[&d], 1);
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["podClaimName"], "gpu");
}

#[test]
fn one_file_per_base_request_is_written_and_removed_with_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let w = MetadataWriter::new(dir.path(), "gpu.nvidia.com");
    let devices = [
        device("a/alt", "gpu-0"),
        device("a/alt", "gpu-1"),
        device("b", "gpu-2"),
    ];
    let mounts = w.write(&claim(None), &devices).unwrap();
    let requests: Vec<&str> = mounts.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(requests, ["a", "b"]);
    let (_, mount) = &mounts[0];
    assert_eq!(mount.options, ["ro", "bind"]);
    assert_eq!(
        mount.container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/my-claim/a/gpu.nvidia.com-metadata.json"
    );
    let host = dir.path().join("dra-device-metadata/uid-1_a.json");
    assert_eq!(mount.host_path, host.to_string_lossy());
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(&host)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    // The request keeps its full name; both of its devices are in its file.
    assert_eq!(first["requests"][0]["name"], "a/alt");
    let names: Vec<&str> = first["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    let files = |w: &MetadataWriter| w.files().unwrap();
    assert_eq!(
        files(&w),
        [
            ("uid-1".to_string(), "a".to_string()),
            ("uid-1".to_string(), "b".to_string())
        ]
    );
    // By the record's request names (a subrequest's file is its request's).
    assert!(w.remove("uid-1", ["a/alt"]).unwrap());
    assert!(!w.remove("uid-1", ["a"]).unwrap());
    assert_eq!(files(&w), [("uid-1".to_string(), "b".to_string())]);
    // Without a record: whatever the directory holds for the claim.
    assert!(w.remove_all("uid-1").unwrap());
    assert!(files(&w).is_empty());
}

#[test]
fn a_name_that_would_leave_its_directory_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let w = MetadataWriter::new(dir.path(), "gpu.nvidia.com");
    let bad = MetadataClaim {
        uid: "..",
        ..claim(None)
    };
    let e = w.write(&bad, &[device("a", "gpu-0")]).unwrap_err();
    assert!(e.to_string().contains("claim UID \"..\""), "{e}");
    assert!(w.remove("../x", ["a"]).is_err());
    assert!(w.remove("uid_1", ["a"]).is_err());
    assert!(!dir.path().join("dra-device-metadata").exists());
}

/// The document as it was built before it was serialised from borrowed fields: a `Value`
/// tree, printed. The bytes must not change (runtimes and workloads read these files).
fn document_as_a_value(
    w: &MetadataWriter,
    claim: &MetadataClaim<'_>,
    request: &str,
    devices: &[&MetadataDevice],
    generation: i64,
) -> String {
    let devices: Vec<Value> = devices
        .iter()
        .map(|d| json!({"driver": w.driver, "pool": d.pool, "name": d.name, "attributes": d.attributes}))
        .collect();
    let mut out = String::new();
    for version in VERSIONS {
        let mut object = json!({
            "apiVersion": format!("{GROUP}/{version}"),
            "kind": "DeviceMetadata",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": generation},
            "requests": [{ "name": request, "devices": devices }],
        });
        if let Some(pod_claim) = claim.pod_claim_name.filter(|n| !n.is_empty()) {
            object["podClaimName"] = json!(pod_claim);
        }
        out.push_str(&object.to_string());
        out.push('\n');
    }
    out
}

#[test]
fn the_document_has_the_bytes_of_the_value_it_was_built_as_before() {
    let w = MetadataWriter::new(Path::new("/plugin"), "gpu.nvidia.com");
    let mut with_version = device("gpus/fast", "gpu-1");
    with_version.attributes.insert(
        "cudaComputeCapability".to_string(),
        DeviceAttribute {
            version: Some("9.0.0".to_string()),
            ..DeviceAttribute::default()
        },
    );
    with_version.attributes.insert(
        "index".to_string(),
        DeviceAttribute {
            int: Some(3),
            ..DeviceAttribute::default()
        },
    );
    let plain = device("gpus", "gpu-0");
    for pod_claim in [None, Some(""), Some("gpu")] {
        for devices in [vec![&plain], vec![&plain, &with_version]] {
            let c = claim(pod_claim);
            assert_eq!(
                w.document(&c, "gpus", &devices, 7),
                document_as_a_value(&w, &c, "gpus", &devices, 7)
            );
        }
    }
}

#[test]
fn a_vgpu_names_its_vf_or_its_mdev_as_kubevirt_reads_them() {
    use crate::checkpoint::VgpuRecord;
    use crate::hardware::vgpu::VgpuFramework;
    let record = |vf: Option<&str>, uuid: Option<&str>| VgpuRecord {
        type_id: 1056,
        framework: if vf.is_some() {
            VgpuFramework::Vdev
        } else {
            VgpuFramework::Mdev
        },
        parent: "0000:18:00.0".into(),
        vf: vf.map(String::from),
        mdev_uuid: uuid.map(String::from),
    };
    // (record, pciBusID after, mdevUUID after)
    let table = [
        (
            record(Some("0000:18:00.4"), None),
            Some("0000:18:00.4"),
            None,
        ),
        (
            record(None, Some("3b1a5e2c-0000-4000-8000-000000000001")),
            None,
            Some("3b1a5e2c-0000-4000-8000-000000000001"),
        ),
    ];
    for (vgpu, bus, mdev) in table {
        let mut attributes = device("vm", "vgpu-0-4c-0").attributes;
        name_vgpu(&mut attributes, &vgpu);
        let get = |key: &str| attributes.get(key).and_then(|a| a.string.as_deref());
        assert_eq!((bus, mdev), (get(PCI_BUS_ID), get(MDEV_UUID)), "{vgpu:?}");
        assert_eq!(Some("gpu"), get("type"), "other attributes stay");
    }
}
