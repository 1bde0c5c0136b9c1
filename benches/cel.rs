//! Selector evaluation speed: the allocator evaluates selectors against ~208,000 devices and
//! must stay under a second. Prints evaluations per second for a realistic MIG selector on a
//! prebuilt device view, plus the cost of compiling and of building views.

use std::hint::black_box;
use std::time::Instant;

use gpu_dra::cel::{DeviceView, Selector};
use k8s_openapi::api::resource::v1::Device;

const MIG_DEVICE: &str = r#"
name: gpu-0-mig-1g10gb-3
attributes:
  type: {string: mig}
  uuid: {string: MIG-4b5c6d7e-8f90-5a1b-9c2d-3e4f5a6b7c8d}
  productName: {string: NVIDIA H100 80GB HBM3}
  profile: {string: 1g.10gb}
  parentUUID: {string: GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d}
  architecture: {string: Hopper}
  cudaComputeCapability: {version: 9.0.0}
  driverVersion: {version: 580.95.5}
  resource.kubernetes.io/pciBusID: {string: "0000:18:00.0"}
  resource.kubernetes.io/numaNode: {int: 0}
capacity:
  memory: {value: 9984Mi}
  multiprocessors: {value: "16"}
  copyEngines: {value: "1"}
  decoders: {value: "1"}
  encoders: {value: "0"}
  jpegEngines: {value: "1"}
  ofaEngines: {value: "0"}
"#;

const SELECTORS: [(&str, &str); 3] = [
    (
        "MIG selector",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' \
         && device.attributes['gpu.nvidia.com'].profile == '1g.10gb' \
         && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0",
    ),
    ("driver only", "device.driver == 'gpu.nvidia.com'"),
    (
        "semver + bind",
        "cel.bind(gpu, device.attributes['gpu.nvidia.com'], gpu.type == 'mig' \
         && gpu.driverVersion.isGreaterThan(semver('550.0.0')))",
    ),
];

const DEVICES: usize = 208_000;

fn main() {
    let api: Device = serde_yaml::from_str(MIG_DEVICE).expect("fixture is a valid Device");
    let started = Instant::now();
    let mut views = Vec::with_capacity(1000);
    for _ in 0..1000 {
        views.push(DeviceView::from_api("gpu.nvidia.com", black_box(&api)).expect("valid"));
    }
    let per_view = started.elapsed() / 1000;
    println!("DeviceView::from_api: {per_view:?} per device");
    let view = views.pop().expect("built");

    for (name, expression) in SELECTORS {
        let started = Instant::now();
        let selector = Selector::compile(expression).expect("compiles");
        let compile = started.elapsed();
        // Warm up, then time one pass over as many evaluations as the allocator's devices.
        for _ in 0..10_000 {
            black_box(selector.evaluate(black_box(&view)).expect("evaluates"));
        }
        let started = Instant::now();
        for _ in 0..DEVICES {
            black_box(selector.evaluate(black_box(&view)).expect("evaluates"));
        }
        let elapsed = started.elapsed();
        let per_eval = elapsed / DEVICES as u32;
        let per_second = DEVICES as f64 / elapsed.as_secs_f64();
        println!(
            "{name}: compile {compile:?}; {per_eval:?} per evaluation, {per_second:.0} evaluations/s, \
             {DEVICES} devices in {elapsed:?}"
        );
    }
}
