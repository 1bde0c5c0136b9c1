//! Every opaque entry of `examples/sharing-*.yaml` decodes and shares the devices its claim
//! would get.

use gpu_dra::kubelet::error_chain;
use gpu_dra::opaque::{Entry, Target, decode, resolve};
use serde_json::Value;

use super::{GIB, gpu, mig};

/// One opaque entry of an example claim template.
struct ExampleEntry {
    file: String,
    /// Request name and the device class it asks for.
    requests: Vec<(String, String)>,
    entry: Entry,
}

/// Every opaque entry of `examples/sharing-*.yaml`.
fn example_entries() -> Vec<ExampleEntry> {
    let mut found = Vec::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("examples dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("sharing-") && name.ends_with(".yaml")
        })
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("example readable");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let doc: Value = serde::Deserialize::deserialize(doc).expect("example is YAML");
            if doc["kind"] != "ResourceClaimTemplate" {
                continue;
            }
            let devices = &doc["spec"]["spec"]["devices"];
            let requests: Vec<(String, String)> = devices["requests"]
                .as_array()
                .expect("requests")
                .iter()
                .map(|r| {
                    let name = r["name"].as_str().expect("request name").to_owned();
                    let class = r["exactly"]["deviceClassName"].as_str().unwrap_or("");
                    (name, class.to_owned())
                })
                .collect();
            for config in devices["config"].as_array().into_iter().flatten() {
                assert_eq!(config["opaque"]["driver"], "gpu.nvidia.com", "{path:?}");
                let entry = Entry {
                    from_class: false,
                    requests: serde_json::from_value(config["requests"].clone())
                        .unwrap_or_default(),
                    parameters: config["opaque"]["parameters"].clone(),
                };
                found.push(ExampleEntry {
                    file: path.display().to_string(),
                    requests: requests.clone(),
                    entry,
                });
            }
        }
    }
    found
}

#[test]
fn every_sharing_example_decodes_and_shares_its_devices() {
    let entries = example_entries();
    assert!(
        entries.len() >= 3,
        "expected the sharing examples, found {}",
        entries.len()
    );
    for ExampleEntry {
        file,
        requests,
        entry,
    } in entries
    {
        decode(&entry.parameters).unwrap_or_else(|e| panic!("{file}: {}", error_chain(&e)));
        // Two devices per request, shaped by the request's device class, sized like an H100.
        let targets: Vec<Target> = requests
            .iter()
            .flat_map(|(name, class)| {
                (0..2).map(move |i| match class.as_str() {
                    "mig.nvidia.com" => Target {
                        memory_bytes: 40 * GIB,
                        ..mig(&format!("gpu-{i}-mig-3g40gb-0"), name, None)
                    },
                    _ => gpu(&format!("gpu-{i}"), name),
                })
            })
            .collect();
        let groups = resolve(&targets, std::slice::from_ref(&entry))
            .unwrap_or_else(|e| panic!("{file}: {}", error_chain(&e)));
        let shared: usize = groups.iter().map(|g| g.devices.len()).sum();
        assert_eq!(targets.len(), shared, "{file}: every device is shared");
    }
}
