//! `gpu-dra cel`: one selector against one device file, with the documented exit codes.

use std::process::Command;

fn cel(expression: &str, device_yaml: &str, extra: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device.yaml");
    std::fs::write(&path, device_yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args([
            "cel",
            "--expression",
            expression,
            "--device",
            path.to_str().unwrap(),
        ])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const MIG: &str = "name: gpu-0-mig-1g10gb-0\nattributes:\n  type: {string: mig}\n  profile: {string: 1g.10gb}\n  cudaComputeCapability: {version: 9.0.0}\n  resource.kubernetes.io/pciBusID: {string: \"0000:18:00.0\"}\ncapacity:\n  memory: {value: 9984Mi}\n";

#[test]
fn a_matching_selector_prints_true() {
    let e = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('9Gi')) > 0";
    assert_eq!(cel(e, MIG, &[]), (0, "true\n".to_string(), String::new()));
}

#[test]
fn a_selector_that_does_not_match_prints_false() {
    let e =
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('9.0.0'))";
    assert_eq!(cel(e, MIG, &[]).0, 0);
    assert_eq!(cel(e, MIG, &[]).1, "false\n");
}

#[test]
fn unqualified_names_belong_to_the_given_driver() {
    let e = "device.attributes['example.com'].profile == '1g.10gb'";
    assert_eq!(cel(e, MIG, &["--driver", "example.com"]).1, "true\n");
    let e = "'profile' in device.attributes['gpu.nvidia.com']";
    assert_eq!(cel(e, MIG, &["--driver", "example.com"]).1, "false\n");
}

#[test]
fn errors_exit_2_and_name_the_expression() {
    let (code, out, err) = cel("device.attributes['gpu.nvidia.com'].nosuch == 1", MIG, &[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "error: evaluating CEL expression \"device.attributes['gpu.nvidia.com'].nosuch == 1\" at 1:36: no such key: nosuch\n"
    );
    let (code, _, err) = cel("device.attributes['gpu.nvidia.com'].profile", MIG, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("must evaluate to bool, not string"), "{err}");
}

#[test]
fn a_bad_device_file_names_the_field_and_value() {
    let bad = "name: d\ncapacity:\n  memory: {value: 5G1}\n";
    let (code, _, err) = cel("true", bad, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("\"5G1\" is not a quantity"), "{err}");
}
