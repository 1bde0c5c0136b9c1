//! Building device views from API objects and device files, and what they reject.

use std::io::Write;

use gpu_dra::cel::{CelError, DeviceView, Selector, evaluate_device_file};
use k8s_openapi::api::resource::v1::Device;

fn device(yaml: &str) -> Device {
    serde_yaml::from_str(yaml).expect("a valid Device")
}

fn view_error(yaml: &str) -> String {
    DeviceView::from_api("gpu.nvidia.com", &device(yaml))
        .expect_err("invalid device")
        .to_string()
}

fn file_with(content: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(content.as_bytes()).expect("written");
    file
}

#[test]
fn invalid_attributes_and_capacities_are_rejected_naming_the_device_and_field() {
    let table = [
        (
            "name: gpu-0\nattributes:\n  driverVersion: {version: '580.95'}\n",
            "device \"gpu-0\": attribute \"driverVersion\": \"580.95\" is not a semantic version (semver.org 2.0.0, e.g. 1.2.3)",
        ),
        (
            "name: gpu-0\nattributes:\n  index: {int: 1, string: one}\n",
            "device \"gpu-0\": attribute \"index\": exactly one of bool, int, string, version, bools, ints, strings or versions must be set, found int, string",
        ),
        (
            "name: gpu-0\nattributes:\n  index: {}\n",
            "device \"gpu-0\": attribute \"index\": exactly one of bool, int, string, version, bools, ints, strings or versions must be set, found none",
        ),
        (
            "name: gpu-0\nattributes:\n  gpu.nvidia.com/index: {int: 1}\n  index: {int: 2}\n",
            "device \"gpu-0\": attribute \"index\": gpu.nvidia.com/index is given twice (once with and once without its domain)",
        ),
        (
            "name: gpu-0\ncapacity:\n  memory: {value: 5G1}\n",
            "device \"gpu-0\": capacity \"memory\" is invalid",
        ),
    ];
    for (yaml, want) in table {
        assert_eq!(view_error(yaml), want, "{yaml}");
    }
    let Err(CelError::Capacity { source, .. }) = DeviceView::from_api(
        "gpu.nvidia.com",
        &device("name: gpu-0\ncapacity:\n  memory: {value: 5G1}\n"),
    ) else {
        panic!("a capacity error");
    };
    assert!(
        source.to_string().starts_with("\"5G1\" is not a quantity"),
        "{source}"
    );
}

#[test]
fn list_attributes_of_every_kind_are_lists() {
    let view = DeviceView::from_api(
        "gpu.nvidia.com",
        &device(
            "name: nic-0\nattributes:\n  roots: {strings: [pci0000:01, pci0000:02]}\n  numa: {ints: [0, 1]}\n  \
             flags: {bools: [true]}\n  versions: {versions: [1.0.0, 2.0.0]}\n",
        ),
    )
    .expect("valid");
    let selector = Selector::compile(
        "cel.bind(a, device.attributes['gpu.nvidia.com'], a.roots.includes('pci0000:02') && a.numa.size() == 2 \
         && a.flags[0] && a.versions.includes(semver('2.0.0')) && !a.numa.includes(2))",
    )
    .expect("compiles");
    assert_eq!(
        selector.evaluate(&view).map_err(|e| e.to_string()),
        Ok(true)
    );
    assert_eq!((view.name(), view.driver()), ("nic-0", "gpu.nvidia.com"));
}

#[test]
fn includes_rejects_lists_longer_than_48() {
    let numbers: Vec<String> = (0..49).map(|i| i.to_string()).collect();
    let view = DeviceView::from_api(
        "gpu.nvidia.com",
        &device(&format!(
            "name: cpu-0\nattributes:\n  cores: {{ints: [{}]}}\n",
            numbers.join(", ")
        )),
    )
    .expect("valid");
    let expression = "device.attributes['gpu.nvidia.com'].cores.includes(1)";
    let got = Selector::compile(expression)
        .expect("compiles")
        .evaluate(&view)
        .map_err(|e| e.to_string());
    assert_eq!(
        got,
        Err(format!(
            "evaluating CEL expression {expression:?} at 1:51: includes(): the list has 49 elements, includes() accepts at most 48"
        ))
    );
}

#[test]
fn device_files_in_yaml_and_json_are_evaluated() {
    let yaml = file_with(
        "name: gpu-0-mig-1g10gb-3\nattributes:\n  profile: {string: 1g.10gb}\n  resource.kubernetes.io/numaNode: {int: 0}\n\
         capacity:\n  memory: {value: 9984Mi}\nallowMultipleAllocations: true\n",
    );
    let json = file_with(
        r#"{"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}}"#,
    );
    let table = [
        (
            yaml.path(),
            "gpu.nvidia.com",
            "device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && device.allowMultipleAllocations",
            Ok(true),
        ),
        (
            yaml.path(),
            "gpu.nvidia.com",
            "device.attributes['resource.kubernetes.io'].numaNode == 1",
            Ok(false),
        ),
        (
            yaml.path(),
            "other.example.com",
            "device.attributes['other.example.com'].profile == '1g.10gb'",
            Ok(true),
        ),
        (
            json.path(),
            "gpu.nvidia.com",
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))",
            Ok(true),
        ),
        (
            json.path(),
            "gpu.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.allowMultipleAllocations == false",
            Ok(true),
        ),
    ];
    for (path, driver, expression, want) in table {
        let got: Result<bool, String> =
            evaluate_device_file(expression, path, driver).map_err(|e| e.to_string());
        assert_eq!(got, want, "{expression}");
    }
}

#[test]
fn unreadable_and_malformed_device_files_are_reported_with_their_path() {
    let missing = std::path::Path::new("/nonexistent/device.yaml");
    let got = evaluate_device_file("true", missing, "gpu.nvidia.com").expect_err("missing file");
    assert_eq!(
        got.to_string(),
        "reading device file /nonexistent/device.yaml"
    );
    assert!(matches!(got, CelError::ReadDevice { .. }));
    let malformed = file_with("attributes: [1, 2]\n");
    let got =
        evaluate_device_file("true", malformed.path(), "gpu.nvidia.com").expect_err("not a Device");
    assert_eq!(
        got.to_string(),
        format!(
            "decoding device file {} as a resource.k8s.io/v1 Device (name, attributes, capacity, allowMultipleAllocations)",
            malformed.path().display()
        )
    );
}
